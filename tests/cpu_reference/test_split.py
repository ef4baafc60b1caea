"""Classification and event splicing of one split (rule R9), against direct rules."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_reference.split import classify_triangles, split_events
from cpu_reference.wald_havran import sorted_root_events
from kdtree_gpu import encoding as enc
from kdtree_gpu.mesh import prepare_mesh


def grid_soup(rng, n):
    centre = rng.uniform(-1, 1, size=(n, 1, 3))
    V = np.round((centre + 0.4 * rng.normal(size=(n, 3, 3))).reshape(-1, 3) * 2) / 2
    return V.astype(np.float32), np.arange(3 * n, dtype=np.int32).reshape(n, 3)


def root_node(rng):
    """A grid soup's root node in event pools, and a random split on one of its events.

    Returns faces, triangle boxes, valid flags, the sorted events, their
    counts per axis, the pools (room for both children: twice the events),
    the segment starts, the axis and the split position (on an event: ties
    and planar triangles on the plane).
    """
    V, F = grid_soup(rng, 40)
    _, _, tri_lo, tri_hi, valid, _ = prepare_mesh(V, F)
    pos, kind, tri, count = sorted_root_events(tri_lo, tri_hi, valid)
    pool = [np.zeros((3, 2 * pos.shape[1] + 4), dtype=a.dtype) for a in (pos, kind, tri)]
    for buf, a in zip(pool, (pos, kind, tri)):
        buf[:, :a.shape[1]] = a
    axis = int(rng.integers(3))
    split = pos[axis, int(rng.integers(count[axis]))]
    return (F, tri_lo, tri_hi, valid, (pos, kind, tri), count, pool, np.zeros(3, np.int64), axis,
            split)


@pytest.mark.parametrize("seed", range(12))
def test_classify_and_splice_follow_rule_r9(seed):
    rng = np.random.default_rng(seed)
    F, tri_lo, tri_hi, valid, (pos, kind, tri), count, pool, seg_start, axis, split = \
        root_node(rng)
    side = int(rng.choice([enc.SIDE_LEFT, enc.SIDE_RIGHT]))
    tri_class = np.full(F.shape[0], 99, np.int8)
    num_left, num_right = classify_triangles(*pool, seg_start, count, axis, split, side,
                                             tri_class)

    # R9 directly from the boxes
    ids = np.flatnonzero(valid)
    a, b = tri_lo[ids, axis], tri_hi[ids, axis]
    planar_on = (a == b) & (a == split)
    left = np.where(planar_on, side == enc.SIDE_LEFT, a < split)
    right = np.where(planar_on, side == enc.SIDE_RIGHT, b > split)
    expected = np.where(left & right, enc.CLASS_BOTH,
                        np.where(left, enc.CLASS_LEFT, enc.CLASS_RIGHT))
    np.testing.assert_array_equal(tri_class[ids], expected)
    assert (num_left, num_right) == (int(left.sum()), int(right.sum()))

    scratch = [np.zeros((3, pos.shape[1]), dtype=a.dtype) for a in (pos, kind, tri)]
    kept_left = np.zeros(3, np.int64)
    kept_right = np.zeros(3, np.int64)
    box = np.zeros((1, 3), np.float32)
    split_events(*pool, seg_start, count, tri_class, False, *scratch, np.zeros(1, np.int32),
                 box, box, kept_left, kept_right)
    # each child's events: the node's events of its triangles, in the node's order
    for k in range(3):
        cls = tri_class[tri[k, :count[k]]]
        goes_left = (cls & enc.CLASS_LEFT) != 0
        goes_right = (cls & enc.CLASS_RIGHT) != 0
        for buf, src, sc in zip(pool, (pos, kind, tri), scratch):
            np.testing.assert_array_equal(buf[k, :kept_left[k]], src[k, :count[k]][goes_left])
            np.testing.assert_array_equal(sc[k, :kept_right[k]], src[k, :count[k]][goes_right])


@pytest.mark.parametrize("seed", range(6))
def test_skipping_straddling_triangles_records_their_boxes(seed):
    rng = np.random.default_rng(100 + seed)
    F, tri_lo, tri_hi, valid, (pos, kind, tri), count, pool, seg_start, axis, split = \
        root_node(rng)
    tri_class = np.zeros(F.shape[0], np.int8)
    classify_triangles(*pool, seg_start, count, axis, split, enc.SIDE_LEFT, tri_class)
    both = np.flatnonzero(valid & (tri_class == enc.CLASS_BOTH))
    tri_slot = np.full(F.shape[0], -1, np.int32)
    tri_slot[both] = rng.permutation(both.shape[0])  # any order of rows will do
    both_lo = np.full((max(1, both.shape[0]), 3), np.nan, np.float32)
    both_hi = np.full((max(1, both.shape[0]), 3), np.nan, np.float32)
    scratch = [np.zeros((3, pos.shape[1]), dtype=a.dtype) for a in (pos, kind, tri)]
    kept_left = np.zeros(3, np.int64)
    kept_right = np.zeros(3, np.int64)
    split_events(*pool, seg_start, count, tri_class, True, *scratch, tri_slot, both_lo, both_hi,
                 kept_left, kept_right)
    np.testing.assert_array_equal(both_lo[tri_slot[both]], tri_lo[both])
    np.testing.assert_array_equal(both_hi[tri_slot[both]], tri_hi[both])
    for k in range(3):
        assert not np.isin(pool[2][k, :kept_left[k]], both).any()
        assert not np.isin(scratch[2][k, :kept_right[k]], both).any()
