"""Small test meshes that reach every build rule, and the tree comparison of the tests.

The builder tests (``tests/kdtree_gpu/builder``, ``tests/cpu_reference``)
compare every builder with ``cpu_reference`` and the naive builder on these
scenes: random soups (distinct positions), integer coordinates (equal event
positions, planar triangles), axis-aligned quads (planes shared by many
triangles), duplicated faces, degenerate triangles, and long thin triangles
through clusters of small ones (every split straddles them: perfect splits
change the tree). Each generator takes a NumPy ``Generator`` and returns
``(vertices, faces)`` as float32 and int32 arrays.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..config import SAHConfig

# The meshes of the mesh folder ($KDTREE_GPU_MESH_DIR) the tests build.
REAL_MESHES = ["cornell_box", "suzanne", "spot", "teapot", "stanford_bunny", "sponza_dabrovic",
               "happy_buddha_100k", "lucy_100k", "stanford_dragon_res2", "stanford_armadillo",
               "conference"]

# Settings that reach every rule: the defaults, one axis per node, a leaf
# size and no empty bonus, a depth limit with other costs.
CONFIGS = [
    SAHConfig(),
    SAHConfig(axes="longest"),
    SAHConfig(leaf_size=2, empty_bonus=1.0),
    SAHConfig(max_depth=4, k_traversal=1.0, k_intersect=1.5),
]
CLIP_CONFIGS = [dataclasses.replace(c, clip=True) for c in CONFIGS]


def tight_loop_capacity(num_events, num_refs):
    """``GpuSettings.loop_capacity`` of level-loop buffers just as large as the
    level the loop starts from: nearly every level outgrows them, and the
    loop is launched again (the drivers' relaunch path on every level)."""
    return num_events, num_refs, 1, 1


def triangles(*tris):
    """Vertices and faces of unshared triangles given as 3x3 coordinate lists."""
    V = np.array(tris, dtype=np.float32).reshape(-1, 3)
    return V, np.arange(V.shape[0], dtype=np.int32).reshape(-1, 3)


def quad_x(x, y0=0.0, y1=1.0, z0=0.0, z1=1.0):
    """Two triangles of an axis-aligned quad in the plane ``x`` (coordinate lists)."""
    return ([[x, y0, z0], [x, y1, z0], [x, y1, z1]], [[x, y0, z0], [x, y1, z1], [x, y0, z1]])


def wedge(x0, x1):
    """A triangle whose box is ``[x0, x1] x [0, 1] x [0, 1]`` (a coordinate list)."""
    return [[x0, 0.0, 0.0], [x1, 1.0, 0.0], [0.5 * (x0 + x1), 0.0, 1.0]]


def soup(rng, n, scale=0.15):
    """Small random triangles in the unit cube."""
    centers = rng.random((n, 1, 3))
    V = (centers + scale * rng.random((n, 3, 3))).reshape(-1, 3).astype(np.float32)
    return V, np.arange(3 * n, dtype=np.int32).reshape(n, 3)


def grid_soup(rng, n):
    """Triangles with integer coordinates: many equal event positions and planar triangles."""
    V = (rng.integers(0, 8, (n, 1, 3)) + rng.integers(0, 2, (n, 3, 3))).reshape(-1, 3)
    # One triangle that is surely not degenerate, so no scene is all zero-area.
    V = np.concatenate([V, [[0, 0, 0], [1, 0, 0], [0, 1, 1]]])
    return V.astype(np.float32), np.arange(3 * n + 3, dtype=np.int32).reshape(n + 1, 3)


def quads(rng, n, duplicate=False):
    """Axis-aligned unit quads on an integer grid: planar-heavy, planes shared by many."""
    pts = []
    for _ in range(n):
        ax = int(rng.integers(0, 3))
        c = int(rng.integers(0, 4))
        u0, v0 = (int(x) for x in rng.integers(0, 3, 2))
        for du, dv in ((0, 0), (1, 0), (1, 1), (0, 1)):
            p = [0, 0, 0]
            p[ax], p[(ax + 1) % 3], p[(ax + 2) % 3] = c, u0 + du, v0 + dv
            pts.append(p)
    V = np.array(pts, dtype=np.float32)
    F = np.concatenate([[[4 * i, 4 * i + 1, 4 * i + 2], [4 * i, 4 * i + 2, 4 * i + 3]]
                        for i in range(n)]).astype(np.int32)
    if duplicate:
        F = np.concatenate([F, F[: max(1, len(F) // 3)]])
    return V, F


def with_degenerate(V, F):
    """Append a zero-area triangle (a repeated vertex) and a collinear one."""
    F = np.concatenate([F, [[0, 0, 1]], [[0, 1, 1]]]).astype(np.int32)
    return V, F


def needles_through_clouds(rng, n_cloud=300, n_needles=12):
    """Clusters of small triangles pierced by long thin ones (many straddle every split)."""
    centres = rng.random((4, 1, 3))
    cloud = (centres + 0.1 * rng.random((4, n_cloud // 4, 3))).reshape(-1, 1, 3)
    cloud = cloud + 0.02 * rng.random((cloud.shape[0], 3, 3))
    a, b = rng.random((n_needles, 3)), rng.random((n_needles, 3))
    needles = np.stack([a, b, b + 1e-3 * rng.standard_normal((n_needles, 3))], axis=1)
    V = np.concatenate([cloud, needles]).reshape(-1, 3).astype(np.float32)
    return V, np.arange(V.shape[0], dtype=np.int32).reshape(-1, 3)


def random_scene(seed):
    """One small scene of the five kinds above, by seed (a few to 60 triangles)."""
    rng = np.random.default_rng(seed)
    kind = seed % 5
    if kind == 0:
        return soup(rng, int(rng.integers(1, 60)))
    if kind == 1:
        return grid_soup(rng, int(rng.integers(1, 40)))
    if kind == 2:
        return quads(rng, int(rng.integers(1, 14)))
    if kind == 3:
        return quads(rng, int(rng.integers(1, 14)), duplicate=True)
    return with_degenerate(*soup(rng, int(rng.integers(2, 30))))


def deferring_scene(seed, base, soup_size=500):
    """A scene whose subtrees the small-node stage builds, of one of five kinds by
    ``seed`` (random generator ``base + seed``): a soup of ``soup_size`` small
    triangles, grid coordinates (equal positions, planar triangles), duplicated
    quads (nodes that never shrink), needles through clouds (references that
    straddle every plane), or :func:`random_scene`."""
    rng = np.random.default_rng(base + seed)
    kind = seed % 5
    if kind == 0:
        return soup(rng, soup_size, scale=0.05)
    if kind == 1:
        return grid_soup(rng, 400)
    if kind == 2:
        return quads(rng, 80, True)
    if kind == 3:
        return needles_through_clouds(rng)
    return random_scene(seed)


def assert_same_tree(reference, tree):
    """Identical trees (node by node from the root), the same counts, and a valid tree."""
    diff = reference.compare(tree)
    assert diff is None, diff
    assert tree.num_nodes == reference.num_nodes
    assert tree.num_refs == reference.num_refs
    assert tree.num_degenerate == reference.num_degenerate
    tree.check()
