"""Scenes: one :class:`Scene` type, one :class:`Camera`, one registry of built-in scenes.

:mod:`.scene` holds the type (a mesh with optional materials and camera),
the camera, :func:`mesh_scene` (a bare mesh lit and framed) and
:func:`as_scene` (any input of the renderer as a scene ready to render);
:mod:`.builtin` the procedural generators. Built-in scenes are reached by
name through :func:`scene_names` and :func:`scene_by_name` (the command line
resolves names with these two)::

    import kdtree_gpu as kd
    scene = kd.scenes.cornell_box()          # or kd.scenes.scene_by_name("cornell")
    tree = kd.build(*scene.arrays())
"""

from .builtin import (CORNELL_MATERIALS, GREEN, LIGHT, LIGHT_HALF_SIZE, LIGHT_HEIGHT, OBJECT, RED,
                      WHITE, cornell_box, cornell_box_with, furnace_scene, icosphere, quad_grid,
                      random_soup)
from .scene import Camera, Scene, SceneError, as_scene, frame_bounds, mesh_scene

__all__ = ["Camera", "Scene", "SceneError", "SCENES", "as_scene", "cornell_box", "cornell_box_with",
           "frame_bounds", "furnace_scene", "icosphere", "mesh_scene", "quad_grid", "random_soup",
           "scene_by_name", "scene_names", "CORNELL_MATERIALS", "WHITE", "RED", "GREEN", "LIGHT",
           "OBJECT", "LIGHT_HEIGHT", "LIGHT_HALF_SIZE"]

# Built-in scenes by name: wherever a mesh is expected on the command line,
# these names are accepted too (builds, traces, benchmarks and renders). The
# furnace is left out: it is the renderer's test scene, meaningless to build
# or benchmark; furnace_scene() makes it.
SCENES = {
    "cornell": cornell_box,
    "icosphere": icosphere,
    "soup": random_soup,
    "quads": quad_grid,
}


def scene_names() -> list:
    """Names of the built-in scenes, in registry order."""
    return list(SCENES)


def scene_by_name(name: str, **kwargs) -> Scene:
    """Build a built-in scene by name (one of :func:`scene_names`).

    Keyword arguments are passed to the scene's function.

    Raises
    ------
    ValueError
        Unknown name (the message lists the known ones).
    """
    try:
        factory = SCENES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown scene {name!r}; built-in scenes: {', '.join(SCENES)}") from None
    return factory(**kwargs)
