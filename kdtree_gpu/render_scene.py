"""Scenes for the path tracer: geometry, per-triangle materials, lights, camera.

A :class:`RenderScene` is what :func:`kdtree_gpu.render.render` consumes: a
triangle mesh, one material id per triangle, a material table (diffuse albedo
and emitted radiance), a pinhole camera and a constant background radiance.
:func:`as_render_scene` turns the inputs that ``render`` accepts (a
``RenderScene``, a scene from :mod:`kdtree_gpu.scenes`, or a bare
``(vertices, faces)`` mesh) into one; :func:`mesh_scene` gives any mesh a
default camera framing its bounds and a large emissive quad above it.

Lights
------
Every triangle whose material emits is an area light. Emission leaves the
front face only, the side its normal ``(v1 - v0) x (v2 - v0)`` points to
(as the Cornell box's light, wound to face down), unless
``RenderScene.two_sided_emission`` is set. Lambertian reflection is two-sided,
so reflecting meshes with arbitrary winding render the same. Next-event estimation picks a light
triangle with probability proportional to its power (``luminance(Le) *
area``) from an alias table (Vose's method) and a point uniformly on it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from .mesh import validate_mesh

# Rec. 709 luminance weights: the light-selection power of an RGB emitter.
LUMINANCE_WEIGHTS = np.array([0.2126, 0.7152, 0.0722], dtype=np.float64)

DEFAULT_ALBEDO = (0.7, 0.7, 0.7)
DEFAULT_LIGHT_RADIANCE = (2.0, 2.0, 2.0)
DEFAULT_BACKGROUND = (0.0, 0.0, 0.0)


class SceneError(ValueError):
    """A scene that cannot be rendered; the message names the problem."""


@dataclasses.dataclass(frozen=True)
class Camera:
    """A pinhole camera.

    Parameters
    ----------
    position : (3,) float
        Eye point.
    look_at : (3,) float
        Point the camera looks at (the image center).
    up : (3,) float
        Up direction; must not be parallel to ``look_at - position``.
    vfov_degrees : float
        Vertical field of view in degrees, in (0, 180).
    """

    position: tuple = (0.0, 0.0, 1.0)
    look_at: tuple = (0.0, 0.0, 0.0)
    up: tuple = (0.0, 1.0, 0.0)
    vfov_degrees: float = 40.0

    def __post_init__(self):
        for name in ("position", "look_at", "up"):
            value = np.asarray(getattr(self, name), dtype=np.float64).reshape(-1)
            if value.shape != (3,) or not np.all(np.isfinite(value)):
                raise SceneError(f"Camera.{name} must be 3 finite numbers, got {getattr(self, name)!r}")
            object.__setattr__(self, name, tuple(float(x) for x in value))
        if not (0.0 < float(self.vfov_degrees) < 180.0):
            raise SceneError(f"Camera.vfov_degrees must be in (0, 180), got {self.vfov_degrees!r}")
        object.__setattr__(self, "vfov_degrees", float(self.vfov_degrees))

    def frame(self, width: int, height: int) -> np.ndarray:
        """Ray-generation frame for an image of ``width`` x ``height`` pixels.

        Returns
        -------
        (4, 3) float32
            Rows: eye position, right vector scaled to half the image width,
            up vector scaled to half the image height, unit forward vector.
            The ray through image point ``(sx, sy)`` in ``[-1, 1]^2`` (``sy``
            up) has direction ``forward + sx * right + sy * up``.
        """
        eye = np.asarray(self.position, dtype=np.float64)
        forward = np.asarray(self.look_at, dtype=np.float64) - eye
        if not np.linalg.norm(forward) > 0:
            raise SceneError("Camera.look_at must differ from Camera.position")
        forward /= np.linalg.norm(forward)
        right = np.cross(forward, np.asarray(self.up, dtype=np.float64))
        if not np.linalg.norm(right) > 1e-12:
            raise SceneError("Camera.up must not be parallel to the viewing direction")
        right /= np.linalg.norm(right)
        up = np.cross(right, forward)
        half_height = math.tan(math.radians(self.vfov_degrees) / 2.0)
        half_width = half_height * width / height
        return np.stack([eye, right * half_width, up * half_height, forward]).astype(np.float32)


@dataclasses.dataclass(eq=False)
class RenderScene:
    """Everything the path tracer needs besides the acceleration structure.

    Attributes
    ----------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
    tri_material : (num_triangles,) int32
        Material id of each triangle, in ``[0, num_materials)``.
    material_albedo : (num_materials, 3) float32
        Lambertian reflectance per RGB channel, in ``[0, 1]``.
    material_emission : (num_materials, 3) float32
        Emitted radiance ``Le`` per RGB channel, ``>= 0``, from the front face
        (see ``two_sided_emission``).
    camera : Camera
    background : (3,) float32
        Radiance of rays that leave the scene (not sampled by next-event
        estimation, so it is reached by BSDF sampling only).
    name : str
    two_sided_emission : bool
        Emitters emit from both faces (default: front face only).
    """

    vertices: np.ndarray
    faces: np.ndarray
    tri_material: np.ndarray
    material_albedo: np.ndarray
    material_emission: np.ndarray
    camera: Camera
    background: np.ndarray = dataclasses.field(
        default_factory=lambda: np.array(DEFAULT_BACKGROUND, dtype=np.float32))
    name: str = "scene"
    two_sided_emission: bool = False

    def __post_init__(self):
        self.vertices, self.faces = validate_mesh(self.vertices, self.faces)
        num_tris = self.faces.shape[0]
        self.tri_material = np.ascontiguousarray(np.asarray(self.tri_material).reshape(-1))
        if self.tri_material.shape != (num_tris,):
            raise SceneError(f"tri_material must have shape ({num_tris},), got {self.tri_material.shape}")
        if self.tri_material.dtype.kind not in "iu":
            raise SceneError(f"tri_material must be an integer array, got dtype {self.tri_material.dtype}")
        self.tri_material = self.tri_material.astype(np.int32)
        self.material_albedo = np.ascontiguousarray(self.material_albedo, dtype=np.float32)
        self.material_emission = np.ascontiguousarray(self.material_emission, dtype=np.float32)
        num_materials = self.material_albedo.shape[0]
        for name in ("material_albedo", "material_emission"):
            table = getattr(self, name)
            if table.ndim != 2 or table.shape != (num_materials, 3):
                raise SceneError(f"{name} must have shape ({num_materials}, 3), got {table.shape}")
            if not np.all(np.isfinite(table)) or np.any(table < 0):
                raise SceneError(f"{name} must be finite and >= 0")
        if np.any(self.material_albedo > 1):
            raise SceneError("material_albedo must be <= 1 (energy conservation)")
        if num_tris and (self.tri_material.min() < 0 or self.tri_material.max() >= num_materials):
            bad = int(np.argmax((self.tri_material < 0) | (self.tri_material >= num_materials)))
            raise SceneError(f"triangle {bad} has material id {int(self.tri_material[bad])}, "
                             f"outside [0, {num_materials})")
        if not isinstance(self.camera, Camera):
            raise SceneError(f"camera must be a Camera, got {type(self.camera).__name__}")
        self.background = np.asarray(self.background, dtype=np.float32).reshape(-1)
        if self.background.shape != (3,) or not np.all(np.isfinite(self.background)) \
                or np.any(self.background < 0):
            raise SceneError(f"background must be 3 finite numbers >= 0, got {self.background!r}")

    @property
    def num_triangles(self) -> int:
        return int(self.faces.shape[0])

    @property
    def bounds(self) -> np.ndarray:
        """(2, 3) float32: box of all vertices used by a triangle."""
        P = self.vertices[self.faces.reshape(-1)]
        return np.stack([P.min(axis=0), P.max(axis=0)])

    def with_camera(self, camera: Camera) -> "RenderScene":
        """A copy that looks through ``camera``."""
        return dataclasses.replace(self, camera=camera)


def frame_bounds(bounds, vfov_degrees: float = 40.0, direction=(0.35, 0.45, 1.0),
                 margin: float = 1.1) -> Camera:
    """A camera outside ``bounds`` that sees the whole box.

    Parameters
    ----------
    bounds : (2, 3) float
        Box to frame.
    vfov_degrees : float
    direction : (3,) float
        From the box center toward the eye (normalized here).
    margin : float
        Distance factor over the bounding sphere's tight fit.

    Returns
    -------
    Camera
    """
    bounds = np.asarray(bounds, dtype=np.float64).reshape(2, 3)
    center = bounds.mean(axis=0)
    radius = max(0.5 * float(np.linalg.norm(bounds[1] - bounds[0])), 1e-6)
    direction = np.asarray(direction, dtype=np.float64)
    direction /= np.linalg.norm(direction)
    distance = margin * radius / math.sin(math.radians(vfov_degrees) / 2.0)
    return Camera(position=tuple(center + distance * direction), look_at=tuple(center),
                  up=(0.0, 1.0, 0.0), vfov_degrees=vfov_degrees)


def mesh_scene(vertices, faces, albedo=DEFAULT_ALBEDO, light_radiance=DEFAULT_LIGHT_RADIANCE,
               background=(0.05, 0.05, 0.05), camera: Optional[Camera] = None,
               interior: bool = False, name: str = "mesh") -> RenderScene:
    """Any mesh with default lights and camera.

    The mesh gets material 0 (diffuse ``albedo``) and one square emissive
    quad (material 1, ``light_radiance``, two triangles appended after the
    mesh's), facing down; a dim ``background`` lights what the quad does
    not.

    Exterior view (default): the camera frames the mesh's box from the front,
    above and to the right (:func:`frame_bounds`); the quad hangs above the
    camera, out of its view, centered over the mesh, with a half side equal
    to its height above the box center (a wide light, as seen from the mesh).

    Interior view (``interior=True``, for rooms such as the conference mesh
    whose ceiling would hide an outside light): the camera stands inside the
    box, 8 % of its longer horizontal side from the upper end of that side,
    at 45 % of its height, looking along it toward the lower end; the quad lies 3 % of the height under the top of the
    box over the middle 40 % of the floor plan.

    Parameters
    ----------
    vertices : (num_vertices, 3) array_like of float
    faces : (num_triangles, 3) array_like of int
    albedo, light_radiance, background : (3,) float
    camera : Camera, optional
        Replaces the default camera (the light stays where it is).
    interior : bool
    name : str

    Returns
    -------
    RenderScene
    """
    V, F = validate_mesh(vertices, faces)
    P = V[F.reshape(-1)]
    lo, hi = P.min(axis=0).astype(np.float64), P.max(axis=0).astype(np.float64)
    center = 0.5 * (lo + hi)
    size = np.maximum(hi - lo, 1e-6 * max(float(np.max(hi - lo)), 1e-30))
    if interior:
        along = 0 if size[0] >= size[2] else 2
        eye = center.copy()
        eye[1] = lo[1] + 0.45 * size[1]
        eye[along] = hi[along] - 0.08 * size[along]
        target = center.copy()
        target[1] = lo[1] + 0.35 * size[1]
        target[along] = lo[along]
        default_camera = Camera(position=tuple(eye), look_at=tuple(target), vfov_degrees=60.0)
        y = hi[1] - 0.03 * size[1]
        half_x, half_z = 0.2 * size[0], 0.2 * size[2]
    else:
        default_camera = frame_bounds(np.stack([lo, hi]))
        radius = 0.5 * float(np.linalg.norm(size))
        y = max(default_camera.position[1], hi[1]) + 0.05 * radius
        half_x = half_z = y - center[1]
    quad = np.array([
        [center[0] - half_x, y, center[2] - half_z],
        [center[0] + half_x, y, center[2] - half_z],
        [center[0] + half_x, y, center[2] + half_z],
        [center[0] - half_x, y, center[2] + half_z],
    ], dtype=np.float32)
    base = V.shape[0]
    quad_faces = np.array([[base, base + 1, base + 2], [base, base + 2, base + 3]], dtype=np.int32)
    all_vertices = np.concatenate([V, quad])
    all_faces = np.concatenate([F, quad_faces])
    tri_material = np.concatenate([np.zeros(F.shape[0], np.int32), np.ones(2, np.int32)])
    material_albedo = np.array([albedo, (0.0, 0.0, 0.0)], dtype=np.float32)
    material_emission = np.array([(0.0, 0.0, 0.0), light_radiance], dtype=np.float32)
    return RenderScene(all_vertices, all_faces, tri_material, material_albedo, material_emission,
                       camera or default_camera, background=np.asarray(background, np.float32),
                       name=name)


def icosphere(subdivisions: int = 1, radius: float = 1.0):
    """A sphere mesh from a subdivided icosahedron, faces wound inward.

    Parameters
    ----------
    subdivisions : int
        Each step splits every triangle in four (20 * 4**subdivisions triangles).
    radius : float

    Returns
    -------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
        Normals ``(v1 - v0) x (v2 - v0)`` point to the center.
    """
    from .scenes import icosphere as outward_icosphere

    sphere = outward_icosphere(int(subdivisions), radius)
    faces = np.ascontiguousarray(sphere.faces[:, ::-1], dtype=np.int32)  # outward -> inward
    return np.asarray(sphere.vertices, dtype=np.float32), faces


def furnace_scene(albedo: float = 0.5, emission: float = 1.0, subdivisions: int = 1) -> RenderScene:
    """The white furnace: inside a closed sphere whose every triangle emits and reflects.

    Every point sees ``Le + albedo * L`` in every direction, so the exact
    radiance everywhere is ``L = emission / (1 - albedo)``; a path tracer
    without a depth limit must reproduce it (Russian roulette included).

    Parameters
    ----------
    albedo : float in [0, 1)
    emission : float > 0
    subdivisions : int
        Of the :func:`icosphere`.

    Returns
    -------
    RenderScene
    """
    if not (0.0 <= albedo < 1.0):
        raise SceneError(f"furnace albedo must be in [0, 1), got {albedo!r}")
    V, F = icosphere(subdivisions)
    camera = Camera(position=(0.1, 0.05, -0.2), look_at=(0.3, -0.1, -1.0), vfov_degrees=70)
    return RenderScene(V, F, np.zeros(len(F), np.int32), [[albedo] * 3], [[emission] * 3], camera,
                       name=f"furnace (albedo {albedo:g})")


def _scene_attr(obj, names):
    for name in names:
        if isinstance(obj, dict) and name in obj:
            return obj[name]
        if hasattr(obj, name):
            return getattr(obj, name)
    return None


def _camera_from(obj) -> Optional[Camera]:
    if obj is None:
        return None
    if isinstance(obj, Camera):
        return obj
    position = _scene_attr(obj, ("position", "eye", "origin"))
    look_at = _scene_attr(obj, ("look_at", "target", "center"))
    if position is None or look_at is None:
        raise SceneError(f"cannot read a camera from {obj!r}: it needs a position and a look_at")
    up = _scene_attr(obj, ("up",))
    fov = _scene_attr(obj, ("vfov_degrees", "vfov", "fov_degrees", "fov", "fov_y"))
    return Camera(position=tuple(np.asarray(position, float)), look_at=tuple(np.asarray(look_at, float)),
                  up=tuple(np.asarray(up, float)) if up is not None else (0.0, 1.0, 0.0),
                  vfov_degrees=float(fov) if fov is not None else 40.0)


def as_render_scene(scene_or_mesh, camera: Optional[Camera] = None) -> RenderScene:
    """Turn what :func:`kdtree_gpu.render.render` accepts into a :class:`RenderScene`.

    Parameters
    ----------
    scene_or_mesh : RenderScene, scene object or dict, or (vertices, faces)
        A scene object (for example from :mod:`kdtree_gpu.scenes`) is read
        through its ``vertices``, ``faces``, ``tri_material`` (or
        ``material_ids``), ``material_albedo`` (or ``albedo``),
        ``material_emission`` (or ``emission``) and ``camera`` attributes or
        keys. A bare mesh, or a scene object without materials, gets
        :func:`mesh_scene`'s defaults.
    camera : Camera, optional
        Replaces the scene's camera.

    Returns
    -------
    RenderScene

    Raises
    ------
    SceneError
        Anything else, or a scene object missing one of the fields.
    """
    if isinstance(scene_or_mesh, RenderScene):
        scene = scene_or_mesh
    elif isinstance(scene_or_mesh, (tuple, list)) and len(scene_or_mesh) == 2:
        scene = mesh_scene(*scene_or_mesh)
    else:
        obj = scene_or_mesh
        V = _scene_attr(obj, ("vertices", "V"))
        F = _scene_attr(obj, ("faces", "F"))
        tri_material = _scene_attr(obj, ("tri_material", "material_ids", "tri_materials",
                                         "face_material", "materials_per_triangle"))
        albedo = _scene_attr(obj, ("material_albedo", "albedo"))
        emission = _scene_attr(obj, ("material_emission", "emission"))
        materials = _scene_attr(obj, ("materials", "material_table"))
        if materials is not None and (albedo is None or emission is None):
            albedo = _scene_attr(materials, ("albedo", "material_albedo"))
            emission = _scene_attr(materials, ("emission", "material_emission"))
        if V is not None and F is not None and tri_material is None and albedo is None \
                and emission is None:
            # a geometry-only scene: light and frame it like a bare mesh
            scene = mesh_scene(V, F, name=str(_scene_attr(obj, ("name",)) or "mesh"))
            return scene if camera is None else scene.with_camera(_camera_from(camera))
        missing = [n for n, v in (("vertices", V), ("faces", F), ("tri_material", tri_material),
                                  ("material_albedo", albedo), ("material_emission", emission))
                   if v is None]
        if missing:
            raise SceneError(f"cannot render {type(obj).__name__}: missing {', '.join(missing)} "
                             "(pass a RenderScene, a scene from kdtree_gpu.scenes, or (vertices, faces))")
        cam = _camera_from(_scene_attr(obj, ("camera", "camera_suggestion")))
        bg = _scene_attr(obj, ("background",))
        two_sided = bool(_scene_attr(obj, ("two_sided_emission",)) or False)
        name = _scene_attr(obj, ("name",)) or "scene"
        if cam is None:
            cam = frame_bounds(np.stack([np.min(np.asarray(V), axis=0), np.max(np.asarray(V), axis=0)]))
        scene = RenderScene(V, F, tri_material, albedo, emission, cam,
                            background=DEFAULT_BACKGROUND if bg is None else bg, name=str(name),
                            two_sided_emission=two_sided)
    if camera is not None:
        scene = scene.with_camera(_camera_from(camera))
    return scene


# --- per-triangle records and the light alias table ---------------------------

def triangle_records(vertices, faces):
    """16-byte aligned per-triangle records for the shading kernels.

    Returns
    -------
    tri_vertex : (num_triangles, 3, 4) float32
        The three corners, each padded to a float4 (one 16-byte load each).
    tri_normal : (num_triangles, 4) float32
        xyz: unit geometric normal ``normalize((v1 - v0) x (v2 - v0))``
        (zero for degenerate triangles); w: triangle area.
    """
    P = vertices[faces].astype(np.float64)
    cross = np.cross(P[:, 1] - P[:, 0], P[:, 2] - P[:, 0])
    length = np.linalg.norm(cross, axis=1)
    tri_normal = np.zeros((faces.shape[0], 4), dtype=np.float32)
    nonzero = length > 0
    tri_normal[nonzero, :3] = cross[nonzero] / length[nonzero, None]
    tri_normal[:, 3] = 0.5 * length
    tri_vertex = np.zeros((faces.shape[0], 3, 4), dtype=np.float32)
    tri_vertex[:, :, :3] = P
    return tri_vertex, tri_normal


def build_alias_table(weights):
    """Vose's alias table for sampling indices in proportion to ``weights``.

    Parameters
    ----------
    weights : (num_items,) float, >= 0, with a positive sum

    Returns
    -------
    alias_prob : (num_items,) float32
        Probability of keeping bucket ``i`` (else take ``alias_index[i]``).
    alias_index : (num_items,) int32
    pmf : (num_items,) float64
        ``weights / weights.sum()``: the probability of each item.

    Notes
    -----
    Sampling with one uniform ``u``: ``i = min(floor(u * n), n - 1)``,
    ``f = u * n - i``; the item is ``i`` if ``f < alias_prob[i]`` else
    ``alias_index[i]``.
    """
    weights = np.asarray(weights, dtype=np.float64).reshape(-1)
    n = weights.shape[0]
    total = weights.sum()
    if n == 0 or not total > 0:
        raise ValueError("build_alias_table needs at least one positive weight")
    pmf = weights / total
    scaled = pmf * n
    alias_prob = np.ones(n, dtype=np.float64)
    alias_index = np.arange(n, dtype=np.int32)
    small = [i for i in range(n) if scaled[i] < 1.0]
    large = [i for i in range(n) if scaled[i] >= 1.0]
    while small and large:
        s = small.pop()
        g = large.pop()
        alias_prob[s] = scaled[s]
        alias_index[s] = g
        scaled[g] = (scaled[g] + scaled[s]) - 1.0
        (small if scaled[g] < 1.0 else large).append(g)
    # leftovers are 1 up to rounding
    for i in small + large:
        alias_prob[i] = 1.0
        alias_index[i] = i
    return alias_prob.astype(np.float32), alias_index, pmf


def light_tables(scene: RenderScene):
    """Light triangles and their selection probabilities.

    Returns
    -------
    light_tri : (num_lights,) int32
        Emissive, non-degenerate triangles.
    light_alias_prob : (num_lights,) float32
    light_alias_index : (num_lights,) int32
        Alias table over ``light_tri`` with weights ``luminance(Le) * area``.
    tri_light_pmf : (num_triangles,) float32
        Probability that light sampling picks each triangle (0 for
        non-emissive ones); the MIS weight of an emitter hit by BSDF sampling
        needs it.
    """
    _, tri_normal = triangle_records(scene.vertices, scene.faces)
    area = tri_normal[:, 3].astype(np.float64)
    emission = scene.material_emission[scene.tri_material].astype(np.float64)
    power = (emission @ LUMINANCE_WEIGHTS) * area
    # a light whose luminance is 0 but which emits (pure blue of tiny weight)
    # still needs a chance to be sampled: floor the weight at 1e-6 of the mean
    emits = (emission.max(axis=1) > 0) & (area > 0)
    light_tri = np.flatnonzero(emits).astype(np.int32)
    tri_light_pmf = np.zeros(scene.num_triangles, dtype=np.float32)
    if light_tri.size == 0:
        return (light_tri, np.zeros(0, np.float32), np.zeros(0, np.int32), tri_light_pmf)
    weight = power[light_tri]
    weight = np.maximum(weight, 1e-6 * max(weight.mean(), 1e-30))
    alias_prob, alias_index, pmf = build_alias_table(weight)
    tri_light_pmf[light_tri] = pmf.astype(np.float32)
    return light_tri, alias_prob, alias_index, tri_light_pmf
