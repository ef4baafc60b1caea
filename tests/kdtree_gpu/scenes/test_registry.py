"""The registry of built-in scenes (kdtree_gpu.scenes: SCENES, scene_names, scene_by_name)."""

import numpy as np
import pytest

from kdtree_gpu import scenes
from kdtree_gpu.mesh import degenerate_mask, prepare_mesh
from kdtree_gpu.tree.check import check_tree

ALL_SCENES = [
    ("cornell", {}),
    ("icosphere", {"subdivisions": 2}),
    ("soup", {"n": 500, "seed": 3}),
    ("quads", {"n": 4, "layers": 2}),
]


@pytest.mark.parametrize("name, kwargs", ALL_SCENES)
def test_scenes_are_valid_and_deterministic(name, kwargs):
    a = scenes.scene_by_name(name, **kwargs)
    b = scenes.scene_by_name(name, **kwargs)
    assert a.vertices.dtype == np.float32 and a.faces.dtype == np.int32
    np.testing.assert_array_equal(a.vertices, b.vertices)
    np.testing.assert_array_equal(a.faces, b.faces)
    prepare_mesh(a.vertices, a.faces)
    assert not degenerate_mask(a.vertices, a.faces).any()


def test_scene_trees_pass_the_checks(make_tree):
    for name, kwargs in ALL_SCENES:
        scene = scenes.scene_by_name(name, **kwargs)
        check_tree(make_tree(*scene.arrays()))


def test_scene_names_are_the_registry():
    assert scenes.scene_names() == list(scenes.SCENES) == ["cornell", "icosphere", "soup", "quads"]
    assert {name for name, _ in ALL_SCENES} == set(scenes.scene_names())
    assert scenes.scene_by_name("icosphere", subdivisions=1).num_triangles == 80


def test_unknown_scene_lists_names():
    with pytest.raises(ValueError, match="cornell, icosphere, soup, quads"):
        scenes.scene_by_name("teapot")
