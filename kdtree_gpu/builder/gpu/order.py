"""The build's own triangle order: Morton order in, the given indices out.

The passes that gather triangle boxes by reference (the classification of
each level run by stages, the subtree stage's nodes) read one row per
reference. In the order a mesh comes in, the triangles of one node may lie
anywhere in a box array far larger than L2 (a subdivided mesh puts a face's
four children a quarter of the array apart), and each row read is a sector
of its own. A build of at least ``GpuSettings.morton_min_triangles``
triangles therefore numbers them by the Morton code of their boxes' centres
(:func:`morton_order_cuda`, at mesh preparation), builds on those numbers,
and names the finished leaves' triangles by their given indices again,
each leaf ascending as the tree format asks (:func:`rename_leaves_cuda`).

The tree is the same: no rule of the build looks at a triangle's index
except to order events of one position and kind, and leaf lists, neither of
which changes a decision (the tests compare both orders' trees with
``cpu_reference``). Measured on an H200 (``benchmarks/probe_triangle_order.py``,
warm ``kd.build`` from CuPy arrays): armadillo subdivided three times (22M
triangles) 246 to 220 ms, its kernels 230 to 201 ms (the classification
19.1 to 5.6 ms, the subtree stage 54.9 to 48.2 ms, the scatter 57.2 to
52.7 ms; the order itself about 3.9 ms: keys 0.3, sort 1.4, permutation 1.2,
renaming the leaves 0.9); subdivided twice (5.5M) the kernels 55 to 50 ms,
whether its triangles come in the subdivision's order or shuffled (57 ms
before). A mesh whose own order already keeps a node's triangles together
gains nothing and pays the order (conference subdivided twice, 5.3M: about
2% slower); ``benchmarks/results/triangle_order_h200.md``.

:func:`morton_keys` is the NumPy twin of the keys (the tests' oracle).
"""

from __future__ import annotations

import numpy as np

from ... import encoding as enc
from ...kernels import get_function
from ...launch import launch, stage
from ...primitives import segment_ids
from ..soa import TreeNodeSoA

_SOURCE = "build.cu"
i64 = np.int64


def _spread(x):
    """The low ``MORTON_BITS`` bits of each of ``x``, bit i moved to bit 3 i (uint64)."""
    x = x.astype(np.uint64)
    out = np.zeros_like(x)
    for bit in range(enc.MORTON_BITS):
        out |= ((x >> np.uint64(bit)) & np.uint64(1)) << np.uint64(3 * bit)
    return out


def morton_keys(tri_lo, tri_hi, valid, bounds):
    """The sort keys of ``kd_morton_keys`` on the host (NumPy): ``(invalid << 63) |
    (code << 32) | index``, code the Morton code of each box's centre quantized to
    ``MORTON_BITS`` bits an axis over ``bounds`` (clamped), in the kernel's float32
    arithmetic.

    Parameters
    ----------
    tri_lo, tri_hi : (m, 3) float32
    valid : (m,) bool or int
    bounds : (2, 3) float32
        The root box (the valid triangles' union).

    Returns
    -------
    (m,) uint64
    """
    f = np.float32
    half = f(0.5)
    lo, hi = np.asarray(bounds, dtype=f)
    cells = f((1 << enc.MORTON_BITS) - 1)
    centre = half * np.asarray(tri_lo, dtype=f) + half * np.asarray(tri_hi, dtype=f)
    extent = half * hi - half * lo
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        x = np.where(extent > 0, (half * centre - half * lo) / extent * cells, f(0))
    x = np.fmin(np.fmax(np.nan_to_num(x, nan=0.0), f(0)), cells).astype(np.uint32)
    code = _spread(x[:, 0]) | (_spread(x[:, 1]) << np.uint64(1)) \
        | (_spread(x[:, 2]) << np.uint64(2))
    index = np.arange(len(code), dtype=np.uint64)
    invalid = (np.asarray(valid) == 0).astype(np.uint64)
    return (invalid << np.uint64(63)) | (code << np.uint64(32)) | index


def morton_order_cuda(cp, given_lo, given_hi, valid, summary, tri_lo, tri_hi):
    """Number the triangles in Morton order (valid ones first, ties by index).

    Parameters
    ----------
    given_lo, given_hi : (m, 3) float32 (device)
        The triangles' boxes in the given order (``kd_prepare_triangles``).
    valid : (m,) int64 (device)
        Their valid flags; rewritten in the new order.
    summary : (SUMMARY_SLOTS,) uint64 (device)
        The preparation's summary (the root box).
    tri_lo, tri_hi : (m, 3) float32 (device)
        Written: the boxes in the new order.

    Returns
    -------
    (m,) int32 (device)
        ``order[i]``: the given index of the build's triangle ``i``.
    """
    m = int(given_lo.shape[0])
    keys = cp.empty(m, dtype=np.uint64)
    launch("prepare_mesh: morton keys", get_function(_SOURCE, "kd_morton_keys"), m,
           (given_lo, given_hi, valid, i64(m), summary, keys))
    with stage(xp=cp, description="prepare_mesh: morton sort"):
        keys.sort()  # in place (radix)
    order = cp.empty(m, dtype=np.int32)
    launch("prepare_mesh: morton order", get_function(_SOURCE, "kd_morton_permute"), m,
           (keys, i64(m), given_lo, given_hi, tri_lo, tri_hi, valid, order))
    return order


def rename_leaves_cuda(cp, arrays, order) -> int:
    """Name the finished tree's leaf entries by the given triangle indices
    (``order``), each leaf ascending; in place.

    Parameters
    ----------
    arrays : dict
        The tree's device arrays (``node_axis``, ``node_split``, ``node_child``,
        ``node_count``, ``leaf_tris``), as :meth:`.output.TreeOutput.finish` returns them.
    order : (m,) int32 (device)
        From :func:`morton_order_cuda`.

    Returns
    -------
    int
        Leaves of more than ``LEAF_SORT_MAX`` entries (sorted by a radix sort
        of their entries' (leaf, triangle) keys after the kernel; one read).
    """
    nodes = TreeNodeSoA(*(arrays[name] for name in ("node_axis", "node_split", "node_child",
                                                    "node_count")))
    leaf_tris = arrays["leaf_tris"]
    num_nodes = nodes.size
    # a listed leaf holds more than LEAF_SORT_MAX entries: room for all there can be
    big = cp.zeros(2 + leaf_tris.size // (enc.LEAF_SORT_MAX + 1), dtype=np.uint64)
    launch("rename leaves: each leaf", get_function(_SOURCE, "kd_rename_leaves"), max(num_nodes, 1),
           (nodes.struct(), i64(num_nodes), order, leaf_tris, big))
    count = int(big[0].get())
    if count:
        _sort_leaves(cp, nodes, leaf_tris, big[1:1 + count])
    return count


def _sort_leaves(cp, nodes, leaf_tris, listed):
    """Sort the entries of the ``listed`` leaves in place: one radix sort of
    ``(rank of the leaf << 32) | triangle`` over their entries (``cp``: CuPy, or
    NumPy for the tests)."""
    listed = listed.astype(np.int64)
    start = nodes.node_child[listed].astype(np.int64)
    offsets = cp.concatenate([cp.zeros(1, dtype=np.int64),
                              cp.cumsum(nodes.node_count[listed].astype(np.int64))])
    total = int(offsets[-1])
    # entry j of the listed leaves: its leaf's rank, and its place in leaf_tris
    rank = segment_ids(offsets, total)
    place = start[rank] + cp.arange(total, dtype=np.int64) - offsets[rank]
    keys = (rank.astype(np.uint64) << np.uint64(32)) | leaf_tris[place].astype(np.uint64)
    keys.sort()
    leaf_tris[place] = (keys & np.uint64(0xFFFFFFFF)).astype(leaf_tris.dtype)
