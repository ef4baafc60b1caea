"""The scene type: a triangle mesh with optional materials and camera.

A :class:`Scene` is what the builders (``kd.build(*scene.arrays())``) and
the path tracer (:func:`kdtree_gpu.render.render`) consume. Geometry-only
scenes (the sphere, the triangle soups) leave the materials and the camera
out; :func:`as_scene` completes any input of ``render`` into a scene with
both, and :func:`mesh_scene` gives a bare mesh a default camera framing its
bounds and a large emissive quad above it.

Lights
------
Every triangle whose material emits is an area light. Emission leaves the
front face only, the side its normal ``(v1 - v0) x (v2 - v0)`` points to
(as the Cornell box's light, wound to face down), unless
``Scene.two_sided_emission`` is set. Lambertian reflection is two-sided, so
reflecting meshes with arbitrary winding render the same. The light tables
the renderer samples are made from the scene in
:mod:`kdtree_gpu.render.scene`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from ..mesh import validate_mesh

DEFAULT_ALBEDO = (0.7, 0.7, 0.7)
DEFAULT_LIGHT_RADIANCE = (2.0, 2.0, 2.0)
DEFAULT_BACKGROUND = (0.0, 0.0, 0.0)
DEFAULT_VFOV_DEGREES = 40.0


class SceneError(ValueError):
    """A scene that cannot be used; the message names the problem."""


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
    vfov_degrees: float = DEFAULT_VFOV_DEGREES

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
class Scene:
    """A triangle mesh with optional materials and camera.

    The three material fields go together: all given, or all ``None``
    (geometry only).

    Attributes
    ----------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
    tri_material : (num_triangles,) int32 or None
        Material id of each triangle, in ``[0, num_materials)``.
    material_albedo : (num_materials, 3) float32 or None
        Lambertian reflectance per RGB channel (linear), in ``[0, 1]``.
    material_emission : (num_materials, 3) float32 or None
        Emitted radiance ``Le`` per RGB channel (linear), ``>= 0``, from the
        front face (see ``two_sided_emission``).
    camera : Camera or None
    background : (3,) float32
        Radiance of rays that leave the scene (not sampled by next-event
        estimation, so it is reached by BSDF sampling only).
    name : str
    two_sided_emission : bool
        Emitters emit from both faces (default: front face only).
    material_names : tuple of str
        Names of the materials, where the scene has them.
    """

    vertices: np.ndarray
    faces: np.ndarray
    tri_material: Optional[np.ndarray] = None
    material_albedo: Optional[np.ndarray] = None
    material_emission: Optional[np.ndarray] = None
    camera: Optional[Camera] = None
    background: np.ndarray = dataclasses.field(
        default_factory=lambda: np.array(DEFAULT_BACKGROUND, dtype=np.float32))
    name: str = "scene"
    two_sided_emission: bool = False
    material_names: tuple = ()

    def __post_init__(self):
        self.vertices, self.faces = validate_mesh(self.vertices, self.faces)
        given = [getattr(self, n) is not None for n in _MATERIAL_FIELDS]
        if any(given) and not all(given):
            raise SceneError(f"{', '.join(_MATERIAL_FIELDS)} go together: give all three or none")
        if all(given):
            self._check_materials()
        if self.camera is not None and not isinstance(self.camera, Camera):
            raise SceneError(f"camera must be a Camera, got {type(self.camera).__name__}")
        self.background = np.asarray(self.background, dtype=np.float32).reshape(-1)
        if self.background.shape != (3,) or not np.all(np.isfinite(self.background)) \
                or np.any(self.background < 0):
            raise SceneError(f"background must be 3 finite numbers >= 0, got {self.background!r}")
        self.material_names = tuple(self.material_names)

    def _check_materials(self):
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

    @property
    def has_materials(self) -> bool:
        """Whether the scene carries materials (else it is geometry only)."""
        return self.tri_material is not None

    @property
    def material(self) -> Optional[np.ndarray]:
        """Alias of :attr:`tri_material`."""
        return self.tri_material

    @property
    def num_triangles(self) -> int:
        return int(self.faces.shape[0])

    @property
    def bounds(self) -> np.ndarray:
        """(2, 3) float32: box of all vertices used by a triangle."""
        P = self.vertices[self.faces.reshape(-1)]
        return np.stack([P.min(axis=0), P.max(axis=0)])

    def arrays(self):
        """``(vertices, faces)``, e.g. for ``kdtree_gpu.build(*scene.arrays())``."""
        return self.vertices, self.faces

    def with_camera(self, camera: Camera) -> "Scene":
        """A copy that looks through ``camera``."""
        return dataclasses.replace(self, camera=camera)


_MATERIAL_FIELDS = ("tri_material", "material_albedo", "material_emission")


def frame_bounds(bounds, vfov_degrees: float = DEFAULT_VFOV_DEGREES, direction=(0.35, 0.45, 1.0),
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
               interior: bool = False, name: str = "mesh") -> Scene:
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
    at 45 % of its height, looking along it toward the lower end; the quad
    lies 3 % of the height under the top of the box over the middle 40 % of
    the floor plan.

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
    Scene
        With materials and a camera.
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
    return Scene(np.concatenate([V, quad]), np.concatenate([F, quad_faces]),
                 tri_material=np.concatenate([np.zeros(F.shape[0], np.int32), np.ones(2, np.int32)]),
                 material_albedo=np.array([albedo, (0.0, 0.0, 0.0)], dtype=np.float32),
                 material_emission=np.array([(0.0, 0.0, 0.0), light_radiance], dtype=np.float32),
                 camera=camera or default_camera, background=np.asarray(background, np.float32),
                 name=name, material_names=("mesh", "light"))


# --- what the renderer accepts --------------------------------------------------------
def _field(obj, names):
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
    position = _field(obj, ("position", "eye", "origin"))
    look_at = _field(obj, ("look_at", "target", "center"))
    if position is None or look_at is None:
        raise SceneError(f"cannot read a camera from {obj!r}: it needs a position and a look_at")
    up = _field(obj, ("up",))
    fov = _field(obj, ("vfov_degrees", "vfov", "fov_degrees", "fov", "fov_y"))
    return Camera(position=tuple(np.asarray(position, float)), look_at=tuple(np.asarray(look_at, float)),
                  up=tuple(np.asarray(up, float)) if up is not None else (0.0, 1.0, 0.0),
                  vfov_degrees=float(fov) if fov is not None else DEFAULT_VFOV_DEGREES)


def _framing_camera(vertices) -> Camera:
    # the box of every vertex, used by a triangle or not
    V = np.asarray(vertices)
    return frame_bounds(np.stack([np.min(V, axis=0), np.max(V, axis=0)]))


def _scene_from_object(obj) -> Scene:
    """A scene from any object or dict with scene fields (see :func:`as_scene`)."""
    V = _field(obj, ("vertices", "V"))
    F = _field(obj, ("faces", "F"))
    tri_material = _field(obj, ("tri_material", "material_ids", "tri_materials",
                                "face_material", "materials_per_triangle"))
    albedo = _field(obj, ("material_albedo", "albedo"))
    emission = _field(obj, ("material_emission", "emission"))
    materials = _field(obj, ("materials", "material_table"))
    if materials is not None and (albedo is None or emission is None):
        albedo = _field(materials, ("albedo", "material_albedo"))
        emission = _field(materials, ("emission", "material_emission"))
    name = str(_field(obj, ("name",)) or "")
    if V is not None and F is not None and tri_material is None and albedo is None \
            and emission is None:
        # geometry only: lit and framed like a bare mesh (its own camera is not read)
        return mesh_scene(V, F, name=name or "mesh")
    missing = [n for n, v in (("vertices", V), ("faces", F), ("tri_material", tri_material),
                              ("material_albedo", albedo), ("material_emission", emission))
               if v is None]
    if missing:
        raise SceneError(f"cannot render {type(obj).__name__}: missing {', '.join(missing)} "
                         "(pass a Scene, (vertices, faces), or an object with scene fields)")
    background = _field(obj, ("background",))
    camera = _camera_from(_field(obj, ("camera", "camera_suggestion")))
    return Scene(V, F, tri_material, albedo, emission, camera=camera or _framing_camera(V),
                 background=DEFAULT_BACKGROUND if background is None else background,
                 name=name or "scene",
                 two_sided_emission=bool(_field(obj, ("two_sided_emission",)) or False))


def as_scene(scene_or_mesh, camera=None) -> Scene:
    """What :func:`kdtree_gpu.render.render` accepts, as a scene with materials and a camera.

    Parameters
    ----------
    scene_or_mesh : Scene, (vertices, faces), or an object or dict with scene fields
        A :class:`Scene` with materials keeps them; without a camera it
        gets one framing its vertices (:func:`frame_bounds`). A
        geometry-only scene or a bare mesh is lit and framed by
        :func:`mesh_scene` (a geometry-only scene's own camera is kept). Any
        other object is read through its ``vertices``, ``faces``,
        ``tri_material`` (or ``material_ids``), ``material_albedo`` (or
        ``albedo``), ``material_emission`` (or ``emission``), ``camera``,
        ``background`` and ``name`` attributes or keys.
    camera : Camera or an object or dict with camera fields, optional
        Replaces the scene's camera.

    Returns
    -------
    Scene
        With materials and a camera.

    Raises
    ------
    SceneError
        Anything else, or an object missing one of the fields.
    """
    if isinstance(scene_or_mesh, Scene):
        scene = scene_or_mesh
        if not scene.has_materials:
            scene = mesh_scene(scene.vertices, scene.faces, camera=scene.camera, name=scene.name)
    elif isinstance(scene_or_mesh, (tuple, list)) and len(scene_or_mesh) == 2:
        scene = mesh_scene(*scene_or_mesh)
    else:
        scene = _scene_from_object(scene_or_mesh)
    if camera is not None:
        scene = scene.with_camera(_camera_from(camera))
    elif scene.camera is None:
        scene = scene.with_camera(_framing_camera(scene.vertices))
    return scene
