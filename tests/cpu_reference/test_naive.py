"""The fast Wald & Havran builder equals the naive one on many small scenes.

The naive builder (:mod:`cpu_reference.naive`) counts every candidate plane
directly; the fast one sweeps sorted events. Equal trees check the sweep,
the event order and ties, the classification, the event splicing and the
perfect splits. Every scene is generated from a seed, so a failure names a
reproducible case.
"""

from __future__ import annotations

import numpy as np
import pytest

from cpu_reference import naive, wald_havran
from kdtree_gpu import SAHConfig
from kdtree_gpu.mesh import load_mesh

SEEDS_PER_CASE = 32  # 4 generators x 2 clip x 2 axes x 32 = 512 scenes


# --- scene generators: (seed) -> (vertices, faces) ----------------------------
def make_soup(rng):
    """Random triangles of random sizes in a box."""
    n = int(rng.integers(1, 36))
    centre = rng.uniform(-1, 1, size=(n, 1, 3))
    size = rng.choice([0.05, 0.3, 1.0], size=(n, 1, 1))
    V = (centre + size * rng.normal(size=(n, 3, 3))).reshape(-1, 3).astype(np.float32)
    return V, np.arange(3 * n, dtype=np.int32).reshape(n, 3)


def make_grid_quads(rng):
    """Axis-aligned quads with integer coordinates: many ties, many planar triangles."""
    n = int(rng.integers(1, 14))
    tris = []
    for _ in range(n):
        axis = int(rng.integers(3))
        u, v = [k for k in range(3) if k != axis]
        lo = rng.integers(0, 4, size=3)
        hi = lo + rng.integers(1, 3, size=3)
        c = [[0, 0, 0] for _ in range(4)]
        for corner, (su, sv) in enumerate(((0, 0), (1, 0), (1, 1), (0, 1))):
            c[corner][axis] = lo[axis]
            c[corner][u] = hi[u] if su else lo[u]
            c[corner][v] = hi[v] if sv else lo[v]
        tris += [[c[0], c[1], c[2]], [c[0], c[2], c[3]]]
        if rng.random() < 0.2:  # a sloped triangle between grid points
            tris.append([c[0], c[1], [x + 1 for x in c[3]]])
    V = np.array(tris, dtype=np.float32).reshape(-1, 3)
    return V, np.arange(V.shape[0], dtype=np.int32).reshape(-1, 3)


def make_duplicates(rng):
    """Triangles repeated (same vertices, or same vertex indices), on a coarse grid."""
    V, F = make_soup(rng)
    V = np.round(V * 4) / 4
    k = int(rng.integers(1, F.shape[0] + 1))
    pick = rng.integers(0, F.shape[0], size=k)
    copies_by_index = F[pick]
    copies_by_value = np.arange(V.shape[0], V.shape[0] + 3 * k, dtype=np.int32).reshape(k, 3)
    V = np.concatenate([V, V[F[pick]].reshape(-1, 3)])
    F = np.concatenate([F, copies_by_index, copies_by_value])
    return V.astype(np.float32), F[rng.permutation(F.shape[0])]


def make_with_degenerates(rng):
    """Quads or soup with zero-area triangles mixed in."""
    V, F = make_grid_quads(rng) if rng.random() < 0.5 else make_soup(rng)
    m = int(rng.integers(1, 6))
    base = V[rng.integers(0, V.shape[0], size=m)]
    step = rng.normal(size=(m, 3)).astype(np.float32)
    degenerate = np.stack([base, base + step, base + 2 * step], axis=1)  # collinear
    degenerate[::2, 2] = degenerate[::2, 0]  # repeated vertex
    start = V.shape[0]
    V = np.concatenate([V, degenerate.reshape(-1, 3)]).astype(np.float32)
    F = np.concatenate([F, np.arange(start, start + 3 * m, dtype=np.int32).reshape(m, 3)])
    return V, F[rng.permutation(F.shape[0])]


GENERATORS = {
    "soup": make_soup,
    "grid_quads": make_grid_quads,
    "duplicates": make_duplicates,
    "degenerates": make_with_degenerates,
}

# settings cycled over the seeds of each case
CONFIG_VARIANTS = [
    {},
    {"leaf_size": 2},
    {"max_depth": 3},
    {"k_traversal": 1.0, "k_intersect": 1.5},
    {"empty_bonus": 1.0},
    {"k_traversal": 40.0, "k_intersect": 10.0, "empty_bonus": 0.5},
    {"leaf_size": 1, "max_depth": 6},
]


def assert_same(V, F, config, label):
    fast = wald_havran.build(V, F, config)
    slow = naive.build(V, F, config)
    diff = fast.compare(slow)
    assert diff is None, f"{label}: {diff}"
    assert fast.num_degenerate == slow.num_degenerate
    fast.check()
    # same tree, nodes in another order: the float sum may differ in the last bits
    assert fast.stats()["sah_cost"] == pytest.approx(slow.stats()["sah_cost"], rel=1e-12), label
    return fast


@pytest.mark.parametrize("axes", ["all", "longest"])
@pytest.mark.parametrize("clip", [False, True], ids=["noclip", "clip"])
@pytest.mark.parametrize("generator", list(GENERATORS))
def test_fast_equals_naive(generator, clip, axes):
    splits = 0
    for seed in range(SEEDS_PER_CASE):
        rng = np.random.default_rng([seed, list(GENERATORS).index(generator)])
        V, F = GENERATORS[generator](rng)
        variant = CONFIG_VARIANTS[seed % len(CONFIG_VARIANTS)]
        config = SAHConfig(clip=clip, axes=axes, **variant)
        tree = assert_same(V, F, config, f"{generator} seed={seed} {config}")
        splits += tree.num_nodes > 1
    assert splits >= SEEDS_PER_CASE // 2  # the scenes do get split


def test_fast_equals_naive_on_cornell_box(mesh_dir):
    V, F = load_mesh(mesh_dir / "cornell_box.ply")
    for clip in (False, True):
        for axes in ("all", "longest"):
            assert_same(V, F, SAHConfig(clip=clip, axes=axes), f"cornell clip={clip} {axes}")


def test_fast_equals_naive_on_suzanne(mesh_dir):
    V, F = load_mesh(mesh_dir / "suzanne.ply")
    for clip in (False, True):
        assert_same(V, F, SAHConfig(clip=clip), f"suzanne clip={clip}")
