"""The subtree kernel: one split handed on as two exports, or a whole subtree."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_reference.events import event_less
from cpu_reference.subtree import build_subtree, sort_small
from cpu_reference.wald_havran import sorted_root_events
from kdtree_gpu import SAHConfig
from kdtree_gpu import encoding as enc
from kdtree_gpu.mesh import prepare_mesh


def soup(rng, n):
    centre = rng.uniform(-1, 1, size=(n, 1, 3))
    V = (centre + 0.2 * rng.normal(size=(n, 3, 3))).reshape(-1, 3).astype(np.float32)
    return V, np.arange(3 * n, dtype=np.int32).reshape(n, 3)


def run(V, F, config, split_once, start=None, count=None, events=None, num_tris=None,
        depth=0, box=None):
    V32, F32, tri_lo, tri_hi, valid, bounds = prepare_mesh(V, F)
    if events is None:
        *events, count = sorted_root_events(tri_lo, tri_hi, valid)
        start = np.zeros(3, np.int64)
        num_tris = int(valid.sum())
        box = bounds
    return build_subtree(
        V32, F32, *events, start, count, num_tris, depth, box[0].copy(), box[1].copy(),
        config.k_traversal, config.k_intersect, config.empty_bonus, config.leaf_size,
        config.resolved_max_depth(int(valid.sum())), config.axes == "longest", config.clip,
        split_once, 0, np.empty(F32.shape[0], np.int8), np.empty(F32.shape[0], np.int32))


@pytest.mark.parametrize("clip", [False, True], ids=["noclip", "clip"])
def test_split_once_exports_the_children_of_the_whole_build(clip):
    rng = np.random.default_rng(1)
    V, F = soup(rng, 200)
    config = SAHConfig(clip=clip)
    whole = run(V, F, config, split_once=False)
    (axis, split, child, count, leaf_tris, export_node, export_start, export_count,
     export_ntris, export_lo, export_hi, *pools) = run(V, F, config, split_once=True)
    # the root split as in the whole build; the children are empty leaves to be replaced
    assert (axis[0], split[0], child[0]) == (whole[0][0], whole[1][0], 1)
    assert axis.shape[0] == 3 and np.all(axis[1:] == enc.AXIS_LEAF) and leaf_tris.size == 0
    np.testing.assert_array_equal(export_node, [1, 2])
    bounds = prepare_mesh(V, F)[5]
    for e in range(2):
        # the children's boxes: the root's, cut at the plane
        lo, hi = bounds[0].copy(), bounds[1].copy()
        (hi if e == 0 else lo)[axis[0]] = split[0]
        np.testing.assert_array_equal(export_lo[e], lo)
        np.testing.assert_array_equal(export_hi[e], hi)
        # each export's events: sorted, one START or PLANAR per triangle on every axis
        for k in range(3):
            a, n = export_start[e, k], export_count[e, k]
            pos, kind, tri = (p[k, a:a + n] for p in pools)
            assert all(event_less(pos[i], kind[i], tri[i], pos[i + 1], kind[i + 1], tri[i + 1])
                       for i in range(n - 1))
            assert np.count_nonzero(kind != enc.EVENT_END) == export_ntris[e]
        # built on its own, an export gives the whole build's subtree below that child
        sub = run(V, F, config, False, export_start[e], export_count[e], pools,
                  int(export_ntris[e]), 1, np.stack([export_lo[e], export_hi[e]]))
        node = whole[2][0] + e
        assert sub[0][0] == whole[0][node] and sub[1][0] == whole[1][node]


def test_a_leaf_root_exports_nothing():
    V, F = soup(np.random.default_rng(2), 3)
    out = run(V, F, SAHConfig(leaf_size=8), split_once=True)
    assert out[0].tolist() == [enc.AXIS_LEAF]
    assert out[4].tolist() == [0, 1, 2] and out[5].size == 0


@pytest.mark.parametrize("n", [0, 1, 5, 32, 33, 100])
def test_sort_small_sorts_a_slice(n):
    rng = np.random.default_rng(n)
    values = rng.permutation(n + 6).astype(np.int32)
    expected = values.copy()
    expected[3:3 + n] = np.sort(values[3:3 + n])
    sort_small(values, 3, 3 + n)
    np.testing.assert_array_equal(values, expected)
