"""Built-in procedural scenes: the Cornell box, spheres, triangle soups, quad grids, the furnace.

Every function is deterministic (same arguments, same arrays) and returns a
:class:`~kdtree_gpu.scenes.Scene`. Scenes made for rendering (the Cornell
boxes, the furnace) carry per-triangle material ids, a material table and a
camera; the geometry-only scenes leave those ``None`` (the renderer lights
and frames them, :func:`~kdtree_gpu.scenes.as_scene`).
"""

from __future__ import annotations

import math

import numpy as np

from ..mesh import validate_mesh
from .scene import Camera, Scene, SceneError


# --- building blocks ------------------------------------------------------------------
class _MeshBuilder:
    """Collects quads and triangles with a material id each."""

    def __init__(self):
        self.vertices, self.faces, self.material = [], [], []

    def add_triangles(self, vertices, faces, material):
        base = sum(len(v) for v in self.vertices)
        self.vertices.append(np.asarray(vertices, np.float64))
        self.faces.append(np.asarray(faces, np.int64) + base)
        self.material.append(np.full(len(faces), material, np.int32))

    def add_quad(self, corners, normal, material):
        """A planar quad ``p0 p1 p2 p3`` (in order around it) as two triangles.

        The winding is chosen so that the geometric normal ``(p1-p0) x (p2-p0)``
        points along ``normal`` (into the room for walls, down for the light).
        """
        p = np.asarray(corners, np.float64)
        if np.dot(np.cross(p[1] - p[0], p[2] - p[0]), normal) < 0:
            p = p[::-1]
        self.add_triangles(p, [[0, 1, 2], [0, 2, 3]], material)

    def add_box(self, centre, size, angle_degrees, material):
        """A closed box turned by ``angle_degrees`` about +y, normals outward."""
        c, s = math.cos(math.radians(angle_degrees)), math.sin(math.radians(angle_degrees))
        half = 0.5 * np.asarray(size, np.float64)
        signs = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], np.float64)
        local = signs * half
        rotated = np.stack([c * local[:, 0] + s * local[:, 2], local[:, 1],
                            -s * local[:, 0] + c * local[:, 2]], axis=1)
        corner = rotated + np.asarray(centre, np.float64)
        centre = np.asarray(centre, np.float64)
        for axis in range(3):
            for sign in (-1, 1):
                ids = np.flatnonzero(signs[:, axis] == sign)
                # order the 4 corners of this face around it
                a, b = [k for k in range(3) if k != axis]
                order = [(-1, -1), (1, -1), (1, 1), (-1, 1)]
                quad = [ids[np.flatnonzero((signs[ids, a] == i) & (signs[ids, b] == j))[0]]
                        for i, j in order]
                face_centre = corner[quad].mean(axis=0)
                self.add_quad(corner[quad], face_centre - centre, material)

    def build(self):
        return (np.concatenate(self.vertices).astype(np.float32),
                np.concatenate(self.faces).astype(np.int32),
                np.concatenate(self.material))


# Cornell box materials (reflectances and light of the classic Cornell box
# data as used by Mitsuba and pbrt scene files)
CORNELL_MATERIALS = (
    # name, albedo, emission
    ("white", (0.725, 0.71, 0.68), (0.0, 0.0, 0.0)),
    ("red", (0.63, 0.065, 0.05), (0.0, 0.0, 0.0)),
    ("green", (0.14, 0.45, 0.091), (0.0, 0.0, 0.0)),
    ("light", (0.78, 0.78, 0.78), (17.0, 12.0, 4.0)),
    ("object", (0.8, 0.8, 0.8), (0.0, 0.0, 0.0)),
)
WHITE, RED, GREEN, LIGHT, OBJECT = range(5)
LIGHT_HEIGHT = 1.98  # just below the ceiling at y = 2
LIGHT_HALF_SIZE = 0.235


def _cornell_room(builder):
    # floor, ceiling, back wall (white); left wall red, right wall green; open at z = +1
    up, down = (0, 1, 0), (0, -1, 0)
    builder.add_quad([(-1, 0, -1), (1, 0, -1), (1, 0, 1), (-1, 0, 1)], up, WHITE)
    builder.add_quad([(-1, 2, -1), (1, 2, -1), (1, 2, 1), (-1, 2, 1)], down, WHITE)
    builder.add_quad([(-1, 0, -1), (1, 0, -1), (1, 2, -1), (-1, 2, -1)], (0, 0, 1), WHITE)
    builder.add_quad([(-1, 0, -1), (-1, 0, 1), (-1, 2, 1), (-1, 2, -1)], (1, 0, 0), RED)
    builder.add_quad([(1, 0, -1), (1, 0, 1), (1, 2, 1), (1, 2, -1)], (-1, 0, 0), GREEN)
    h, y = LIGHT_HALF_SIZE, LIGHT_HEIGHT
    builder.add_quad([(-h, y, -h), (h, y, -h), (h, y, h), (-h, y, h)], down, LIGHT)


def _cornell_scene(name, builder):
    V, F, M = builder.build()
    albedo = np.array([m[1] for m in CORNELL_MATERIALS], np.float32)
    emission = np.array([m[2] for m in CORNELL_MATERIALS], np.float32)
    camera = Camera(position=(0.0, 1.0, 3.9), look_at=(0.0, 1.0, 0.0), up=(0.0, 1.0, 0.0),
                    vfov_degrees=40.0)
    return Scene(V, F, M, albedo, emission, camera=camera, name=name,
                 material_names=tuple(m[0] for m in CORNELL_MATERIALS))


def cornell_box() -> Scene:
    """The classic Cornell box, 36 triangles.

    The room spans x in [-1, 1], y in [0, 2], z in [-1, 1] (as McGuire's
    CornellBox-Original) and is open toward +z, where the suggested camera
    stands. White floor, ceiling and back wall, red left wall (x = -1), green
    right wall (x = +1), a short and a tall white box (closed, turned about
    y), and an emissive square light just below the ceiling facing down.

    Returns
    -------
    Scene
        With ``tri_material`` ids into :data:`CORNELL_MATERIALS`.
    """
    builder = _MeshBuilder()
    _cornell_room(builder)
    builder.add_box((0.33, 0.3, 0.37), (0.6, 0.6, 0.6), -17.0, WHITE)
    builder.add_box((-0.33, 0.6, -0.29), (0.6, 1.2, 0.6), 17.0, WHITE)
    return _cornell_scene("cornell", builder)


def cornell_box_with(vertices, faces, size: float = 1.2) -> Scene:
    """The Cornell box room (no inner boxes) with a mesh standing on its floor.

    Parameters
    ----------
    vertices : (num_vertices, 3) array_like of float
    faces : (num_triangles, 3) array_like of int
    size : float
        The mesh is scaled uniformly so that its largest extent is ``size``,
        centred on x = z = 0 and lowered onto the floor (y = 0).

    Returns
    -------
    Scene
        The room's triangles first, then the mesh's in their order (material
        ``"object"``).
    """
    V, F = validate_mesh(vertices, faces)
    V64 = V.astype(np.float64)
    lo, hi = V64.min(axis=0), V64.max(axis=0)
    extent = float((hi - lo).max())
    if not size > 0:
        raise ValueError(f"size must be > 0, got {size!r}")
    scale = size / extent if extent > 0 else 1.0
    placed = (V64 - [(lo[0] + hi[0]) / 2, lo[1], (lo[2] + hi[2]) / 2]) * scale
    builder = _MeshBuilder()
    _cornell_room(builder)
    builder.add_triangles(placed, F, OBJECT)
    return _cornell_scene("cornell_with_mesh", builder)


def icosphere(subdivisions: int = 3, radius: float = 1.0, inward: bool = False) -> Scene:
    """A sphere made by subdividing an icosahedron; ``20 * 4**subdivisions`` triangles.

    Closed and watertight (edges are shared, vertices are not duplicated);
    normals ``(v1 - v0) x (v2 - v0)`` point outward, or to the center with
    ``inward=True`` (the same triangles wound the other way, as the
    furnace needs them).
    """
    if not isinstance(subdivisions, int) or subdivisions < 0 or subdivisions > 8:
        raise ValueError(f"subdivisions must be an integer in [0, 8], got {subdivisions!r}")
    if not radius > 0:
        raise ValueError(f"radius must be > 0, got {radius!r}")
    phi = (1 + 5 ** 0.5) / 2
    points = [(-1, phi, 0), (1, phi, 0), (-1, -phi, 0), (1, -phi, 0),
              (0, -1, phi), (0, 1, phi), (0, -1, -phi), (0, 1, -phi),
              (phi, 0, -1), (phi, 0, 1), (-phi, 0, -1), (-phi, 0, 1)]
    tris = [(0, 11, 5), (0, 5, 1), (0, 1, 7), (0, 7, 10), (0, 10, 11),
            (1, 5, 9), (5, 11, 4), (11, 10, 2), (10, 7, 6), (7, 1, 8),
            (3, 9, 4), (3, 4, 2), (3, 2, 6), (3, 6, 8), (3, 8, 9),
            (4, 9, 5), (2, 4, 11), (6, 2, 10), (8, 6, 7), (9, 8, 1)]
    V = [np.array(p, np.float64) / np.linalg.norm(p) for p in points]
    F = tris
    for _ in range(subdivisions):
        midpoint = {}

        def middle(i, j):
            key = (min(i, j), max(i, j))
            if key not in midpoint:
                m = V[i] + V[j]
                V.append(m / np.linalg.norm(m))
                midpoint[key] = len(V) - 1
            return midpoint[key]

        new_faces = []
        for a, b, c in F:
            ab, bc, ca = middle(a, b), middle(b, c), middle(c, a)
            new_faces += [(a, ab, ca), (b, bc, ab), (c, ca, bc), (ab, bc, ca)]
        F = new_faces
    faces = np.array(F, np.int32)
    if inward:
        faces = np.ascontiguousarray(faces[:, ::-1])
    return Scene(np.array(V) * radius, faces, name=f"icosphere{subdivisions}")


def random_soup(n: int = 10_000, seed: int = 0, box_size: float = 1.0,
                triangle_size: float = 0.05) -> Scene:
    """``n`` random triangles in a cube (overlapping, intersecting, unconnected).

    Parameters
    ----------
    n : int
    seed : int
        Seed of ``numpy.random.default_rng``.
    box_size : float
        Triangle centres are uniform in ``[0, box_size]^3``.
    triangle_size : float
        Standard deviation of the vertex offsets from the centre.
    """
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    rng = np.random.default_rng(seed)
    centre = rng.random((n, 1, 3)) * box_size
    corners = centre + rng.normal(scale=triangle_size, size=(n, 3, 3))
    return Scene(corners.reshape(-1, 3), np.arange(3 * n).reshape(n, 3), name=f"soup{n}")


def quad_grid(n: int = 16, layers: int = 3, spacing: float = 1.0,
              quad_fraction: float = 0.8) -> Scene:
    """Axis-aligned square quads on planes of the three axes: many planar triangles.

    For every axis there are ``layers`` planes perpendicular to it, each with
    an ``n`` x ``n`` grid of separate quads (side ``quad_fraction * spacing``)
    whose coordinates are exact multiples of small binary fractions, so that
    many triangles share exactly the same plane and the same edges.
    ``2 * 3 * layers * n * n`` triangles.
    """
    if n < 1 or layers < 1:
        raise ValueError(f"n and layers must be >= 1, got n={n!r}, layers={layers!r}")
    if not 0 < quad_fraction <= 1:
        raise ValueError(f"quad_fraction must be in (0, 1], got {quad_fraction!r}")
    side = quad_fraction * spacing
    grid = np.arange(n) * spacing
    u, v = np.meshgrid(grid, grid, indexing="ij")
    u, v = u.reshape(-1), v.reshape(-1)
    corners_uv = np.stack([np.stack([u, v], -1), np.stack([u + side, v], -1),
                           np.stack([u + side, v + side], -1), np.stack([u, v + side], -1)], 1)
    extent = n * spacing
    vertices, faces = [], []
    for axis in range(3):
        a, b = [k for k in range(3) if k != axis]
        for layer in range(layers):
            w = (layer + 0.5) * extent / layers
            quad = np.zeros((u.size, 4, 3))
            quad[:, :, a] = corners_uv[:, :, 0]
            quad[:, :, b] = corners_uv[:, :, 1]
            quad[:, :, axis] = w
            base = sum(len(x) for x in vertices)
            ids = base + 4 * np.arange(u.size)[:, None]
            faces.append(np.concatenate([ids + [0, 1, 2], ids + [0, 2, 3]]))
            vertices.append(quad.reshape(-1, 3))
    return Scene(np.concatenate(vertices), np.concatenate(faces), name=f"quads{n}x{layers}")


def furnace_scene(albedo: float = 0.5, emission: float = 1.0, subdivisions: int = 1) -> Scene:
    """The white furnace: inside a closed sphere whose every triangle emits and reflects.

    Every point sees ``Le + albedo * L`` in every direction, so the exact
    radiance everywhere is ``L = emission / (1 - albedo)``; a path tracer
    without a depth limit must reproduce it (Russian roulette included).

    Parameters
    ----------
    albedo : float in [0, 1)
    emission : float > 0
    subdivisions : int
        Of the :func:`icosphere` (wound inward: its front faces emit).

    Returns
    -------
    Scene
    """
    if not (0.0 <= albedo < 1.0):
        raise SceneError(f"furnace albedo must be in [0, 1), got {albedo!r}")
    V, F = icosphere(int(subdivisions), inward=True).arrays()
    camera = Camera(position=(0.1, 0.05, -0.2), look_at=(0.3, -0.1, -1.0), vfov_degrees=70)
    return Scene(V, F, np.zeros(len(F), np.int32), [[albedo] * 3], [[emission] * 3], camera=camera,
                 name=f"furnace (albedo {albedo:g})")
