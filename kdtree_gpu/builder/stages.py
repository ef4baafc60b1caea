"""The build stages on ``xp`` arrays: the method as the NumPy pipeline runs it.

Each stage is one verb-named function that runs unchanged on NumPy
(``device="cpu", kernels="xp"``) and on CuPy arrays (``device="cuda",
kernels="xp"``); ``xp`` is the array module. They are the readable
specification of the GPU kernels (``cuda/build_stages.cuh`` holds the fused
CUDA forms, one device function per stage), built from the parallel
primitives of :mod:`kdtree_gpu.primitives` (scans, segmented arg-min, radix
sort, binary search), and they follow the build rules R1-R10 of
:mod:`cpu_reference`. :func:`kdtree_gpu.builder.pipeline.build_levels_xp` runs
them level by level:

1. :func:`create_root_events` (R3), once;
2. per level: :func:`compute_split_costs` (R5-R7), :func:`select_best_splits`
   and :func:`decide_leaves` (R4, R8), :func:`classify_triangles` (R9),
   :func:`route_to_children` (where every copy goes), :func:`emit_level`
   (R10), :func:`split_refs` and :func:`split_events` (stable compaction into
   the children, never re-sorted), :func:`make_child_nodes`.

Layouts are those of :mod:`kdtree_gpu.builder.soa`.
"""

from __future__ import annotations

import numpy as np

from .. import encoding as enc
from ..config import box_half_area, split_cost_xp
from ..primitives import (exclusive_scan, float_to_ordered_uint, radix_sort, segmented_argmin,
                          upper_bound)
from .soa import BestSplit, ChildRoute, EventSoA, RefSoA

# Packing of the root sort key of the NumPy pipeline: (position bits << 32) |
# (kind << 30) | reference; the CUDA root sort packs the axis too
# (encoding.KEY_REF_BITS).
_REF_BITS = 30


def create_root_events(xp, tri_lo, tri_hi, ref_tri):
    """Make the root's events for the three axes and sort them (R3).

    Parameters
    ----------
    tri_lo, tri_hi : (num_triangles, 3) float32
        Triangle boxes.
    ref_tri : (num_refs,) int32
        The root's (non-degenerate) triangles, ascending.

    Returns
    -------
    EventSoA
        Sorted by (axis, position, kind, reference) with a single node.
    """
    num_refs = int(ref_tri.shape[0])
    refs = xp.arange(num_refs, dtype=np.int64)
    pos_parts, kind_parts, ref_parts, seg_parts = [], [], [], []
    for axis in range(3):
        lo = tri_lo[ref_tri, axis]
        hi = tri_hi[ref_tri, axis]
        planar = lo == hi
        # Non-planar triangles: an END at hi and a START at lo; planar: one PLANAR at lo.
        nonplanar = ~planar
        end_pos = hi[nonplanar]
        end_ref = refs[nonplanar]
        start_pos = lo[nonplanar]
        planar_pos = lo[planar]
        planar_ref = refs[planar]
        pos = xp.concatenate([end_pos, planar_pos, start_pos])
        ref = xp.concatenate([end_ref, planar_ref, end_ref])
        kind = xp.concatenate([
            xp.full(end_pos.shape[0], enc.EVENT_END, dtype=np.int64),
            xp.full(planar_pos.shape[0], enc.EVENT_PLANAR, dtype=np.int64),
            xp.full(start_pos.shape[0], enc.EVENT_START, dtype=np.int64),
        ])
        # Unique 64-bit keys: any sort yields the one order of rule R3.
        key = ((float_to_ordered_uint(pos).astype(np.uint64) << np.uint64(32))
               | (kind.astype(np.uint64) << np.uint64(_REF_BITS))
               | ref.astype(np.uint64))
        _, order = radix_sort(key, xp.arange(key.shape[0], dtype=np.int64))
        pos_parts.append(pos[order])
        kind_parts.append(kind[order].astype(enc.EVENT_KIND_DTYPE))
        ref_parts.append(ref[order].astype(np.int32))
        seg_parts.append(xp.full(key.shape[0], axis, dtype=np.int32))
    return EventSoA(
        event_pos=xp.concatenate(pos_parts).astype(enc.EVENT_POS_DTYPE),
        event_kind=xp.concatenate(kind_parts),
        event_ref=xp.concatenate(ref_parts),
        event_seg=xp.concatenate(seg_parts),
    )


def event_segments(xp, event_ref, ref_node, seg_event_offset, num_nodes: int):
    """Each event's segment ``axis * n + node`` from its place and its reference.

    A level's events of one axis are contiguous from ``seg_event_offset[axis
    * n]`` and an event's node is its reference's: the level-loop kernel
    keeps no segment per event and derives it this way (``KdEventSegment`` in
    ``cuda/split_costs.cuh``), as do the per-stage kernels without perfect
    splits; with them, a level leaving the loop for the per-stage path gets
    its segments from here.
    """
    n = int(num_nodes)
    e = xp.arange(int(event_ref.shape[0]), dtype=np.int64)
    axis = (e >= seg_event_offset[n]).astype(np.int32) + (e >= seg_event_offset[2 * n])
    return (axis * np.int32(n) + ref_node[event_ref]).astype(np.int32)


def _half_area(d):
    return box_half_area(d[..., 0], d[..., 1], d[..., 2])


def compute_split_costs(xp, events, nodes, node_active, node_axis_mask, cfg):
    """SAH cost of every candidate plane of every node (R5-R7).

    A candidate is the first event of each run of equal positions within a
    segment. With exclusive scans over the kinds, the counts at the plane of
    such an event ``e`` in segment ``s`` (first event ``s0``) whose run ends
    at ``g_end`` are::

        N_L = opens before e      (START and PLANAR events, positions < p)
        N_P = planars in the run
        N_R = N - closes up to g_end (END and PLANAR events, positions <= p)

    Parameters
    ----------
    events : EventSoA
    nodes : NodeSoA
    node_active : (num_nodes,) bool
        Nodes still allowed to split (R4).
    node_axis_mask : (3, num_nodes) bool
        Axes evaluated per node (all, or only the longest).

    Returns
    -------
    event_cost : (num_events,) float64
        Cost of the plane at each candidate event, ``inf`` elsewhere.
    event_side : (num_events,) int8
        p_side of each candidate.
    """
    n = nodes.size
    num_events = events.size
    pos, kind, seg = events.event_pos, events.event_kind, events.event_seg
    head = xp.ones(num_events, dtype=bool)
    if num_events > 1:
        head[1:] = (seg[1:] != seg[:-1]) | (pos[1:] != pos[:-1])
    run_id = xp.cumsum(head, dtype=np.int64)
    # One past the last event of each event's run of equal positions.
    run_end = upper_bound(run_id, run_id)

    is_planar = kind == enc.EVENT_PLANAR
    open_ex = exclusive_scan(is_planar | (kind == enc.EVENT_START), dtype=np.int64)
    close_ex = exclusive_scan(is_planar | (kind == enc.EVENT_END), dtype=np.int64)
    planar_ex = exclusive_scan(is_planar, dtype=np.int64)

    idx = xp.arange(num_events, dtype=np.int64)
    seg64 = seg.astype(np.int64)
    seg_start = nodes.seg_event_offset[seg64]
    node = seg64 % n
    axis = seg64 // n
    node_n = (nodes.node_ref_offset[1:] - nodes.node_ref_offset[:-1])[node]

    n_left = open_ex[idx] - open_ex[seg_start]
    n_planar = planar_ex[run_end] - planar_ex[idx]
    n_right = node_n - (close_ex[run_end] - close_ex[seg_start])

    lo = nodes.node_lo[node].astype(np.float64)
    hi = nodes.node_hi[node].astype(np.float64)
    p = pos.astype(np.float64)
    extent = hi - lo
    area = _half_area(extent)
    rows = xp.arange(num_events)
    ext_left = extent.copy()
    ext_left[rows, axis] = p - lo[rows, axis]
    ext_right = extent.copy()
    ext_right[rows, axis] = hi[rows, axis] - p
    area_left = _half_area(ext_left)
    area_right = _half_area(ext_right)

    nl = n_left.astype(np.float64)
    nr = n_right.astype(np.float64)
    npl = n_planar.astype(np.float64)
    cost_left = split_cost_xp(xp, cfg, area_left, area_right, area, nl + npl, nr)
    cost_right = split_cost_xp(xp, cfg, area_left, area_right, area, nl, nr + npl)
    plane_left = cost_left <= cost_right
    cost = xp.where(plane_left, cost_left, cost_right)

    inside = (pos > nodes.node_lo[node, axis]) & (pos < nodes.node_hi[node, axis])
    candidate = head & inside & node_active[node] & node_axis_mask[axis, node]
    event_cost = xp.where(candidate, cost, np.inf)
    event_side = xp.where(plane_left, enc.SIDE_LEFT, enc.SIDE_RIGHT).astype(np.int8)
    return event_cost, event_side


def select_best_splits(xp, events, nodes, event_cost, event_side):
    """Best plane per node: lowest cost, then lowest axis, then lowest position (R8).

    Returns
    -------
    BestSplit
    """
    n = nodes.size
    # Lowest index on ties = lowest position within a segment.
    seg_best = segmented_argmin(event_cost, nodes.seg_event_offset)  # (3n,)
    has = seg_best >= 0
    safe = xp.where(has, seg_best, 0)
    seg_cost = xp.where(has, event_cost[safe], np.inf).reshape(3, n)
    best_axis = xp.zeros(n, dtype=np.int64)
    best_cost = seg_cost[0].copy()
    for axis in (1, 2):
        better = seg_cost[axis] < best_cost  # strict: ties keep the lower axis
        best_axis = xp.where(better, axis, best_axis)
        best_cost = xp.where(better, seg_cost[axis], best_cost)
    nodes_idx = xp.arange(n, dtype=np.int64)
    best_event = safe.reshape(3, n)[best_axis, nodes_idx]
    return BestSplit(
        node_cost=best_cost,
        node_axis=best_axis.astype(np.int8),
        node_pos=events.event_pos[best_event],
        node_side=event_side[best_event],
    )


def decide_leaves(xp, nodes, best, node_active, cfg):
    """Split only where allowed and where the best cost beats ``K_I * N`` (R4, R8).

    Returns
    -------
    (num_nodes,) bool
        True for nodes that split.
    """
    node_n = (nodes.node_ref_offset[1:] - nodes.node_ref_offset[:-1]).astype(np.float64)
    return node_active & (best.node_cost < cfg.k_intersect * node_n)


def classify_triangles(xp, refs, best, node_split, box_lo, box_hi, per_reference=False):
    """Class of every reference: 0 (its node is a leaf), left, right or both (R9).

    Parameters
    ----------
    box_lo, box_hi : (num_triangles, 3) or, with ``per_reference``, (num_refs, 3) float32
        The triangles' boxes, or (with clipping) each reference's box in its node.

    Returns
    -------
    (num_refs,) uint8
        ``CLASS_LEFT`` / ``CLASS_RIGHT`` bits; 0 for references of leaf nodes.
    """
    node = refs.ref_node
    axis = best.node_axis[node].astype(np.int64)
    p = best.node_pos[node]
    row = xp.arange(refs.size) if per_reference else refs.ref_tri
    a = box_lo[row, axis]
    b = box_hi[row, axis]
    cls = xp.full(refs.size, enc.CLASS_BOTH, dtype=np.uint8)
    cls = xp.where(b <= p, np.uint8(enc.CLASS_LEFT), cls)
    cls = xp.where(a >= p, np.uint8(enc.CLASS_RIGHT), cls)
    side_cls = xp.where(best.node_side[node] == enc.SIDE_LEFT,
                        np.uint8(enc.CLASS_LEFT), np.uint8(enc.CLASS_RIGHT))
    cls = xp.where((a == b) & (a == p), side_cls, cls)
    return xp.where(node_split[node], cls, np.uint8(0)).astype(np.uint8)


def route_to_children(xp, flag_left, flag_right, elem_group, group_offset, group_child_left,
                      num_child_groups_max):
    """Stable compaction addresses of the elements' copies into child groups.

    Parameters
    ----------
    flag_left, flag_right : (num_elements,) bool
        Whether an element is copied to the left / right child of its group.
    elem_group : (num_elements,) int
        Group of each element (elements are sorted by group).
    group_offset : (num_groups + 1,) int64
        Elements of group ``g`` are ``[group_offset[g], group_offset[g+1])``.
    group_child_left : (num_groups,) int64
        Left child group of each group; ``num_child_groups_max`` (a dummy group)
        for groups that do not split (they have no flagged elements).
    num_child_groups_max : int
        Upper bound on the number of child groups (host value, no sync).

    Returns
    -------
    ChildRoute
    """
    left_ex = exclusive_scan(flag_left, dtype=np.int64)
    right_ex = exclusive_scan(flag_right, dtype=np.int64)
    g_start, g_end = group_offset[:-1], group_offset[1:]
    child_count = xp.zeros(num_child_groups_max + 2, dtype=np.int64)
    child_count[group_child_left] = left_ex[g_end] - left_ex[g_start]
    child_count[group_child_left + 1] = right_ex[g_end] - right_ex[g_start]
    child_offset = exclusive_scan(child_count[:num_child_groups_max], dtype=np.int64)
    total = child_offset[-1]
    group = elem_group
    base_left = child_offset[xp.minimum(group_child_left, num_child_groups_max)][group]
    base_right = child_offset[xp.minimum(group_child_left + 1, num_child_groups_max)][group]
    rank_left = left_ex[:-1] - left_ex[g_start[group]]
    rank_right = right_ex[:-1] - right_ex[g_start[group]]
    dst_left = xp.where(flag_left, base_left + rank_left, total)
    dst_right = xp.where(flag_right, base_right + rank_right, total)
    return ChildRoute(dst_left, dst_right, child_offset, total)


def split_refs(xp, refs, route, num_child_refs, split_rank):
    """Copy the references into the children, order kept (stable compaction).

    Returns
    -------
    RefSoA
        The next level's references, sorted by child node.
    """
    child_tri = xp.empty(num_child_refs + 1, dtype=np.int32)
    child_node = xp.empty(num_child_refs + 1, dtype=np.int32)
    left_child = (2 * split_rank[:-1])[refs.ref_node].astype(np.int32)
    child_tri[route.dst_left] = refs.ref_tri
    child_node[route.dst_left] = left_child
    child_tri[route.dst_right] = refs.ref_tri
    child_node[route.dst_right] = left_child + 1
    return RefSoA(ref_tri=child_tri[:num_child_refs], ref_node=child_node[:num_child_refs])


def split_events(xp, events, route, num_child_events, seg_child_left, ref_route):
    """Copy every axis's events into the children, order kept (no re-sort).

    An event follows its reference: it is copied to the side(s) its
    triangle was classified to, and points at the reference's copy there.

    Returns
    -------
    EventSoA
        The next level's events, sorted by child segment, then position.
    """
    size = num_child_events + 1
    pos = xp.empty(size, dtype=enc.EVENT_POS_DTYPE)
    kind = xp.empty(size, dtype=enc.EVENT_KIND_DTYPE)
    ref = xp.empty(size, dtype=np.int32)
    seg = xp.empty(size, dtype=np.int32)
    child_seg = seg_child_left[events.event_seg].astype(np.int32)
    for dst, ref_dst, seg_step in ((route.dst_left, ref_route.dst_left, 0),
                                   (route.dst_right, ref_route.dst_right, 1)):
        pos[dst] = events.event_pos
        kind[dst] = events.event_kind
        ref[dst] = ref_dst[events.event_ref].astype(np.int32)
        seg[dst] = child_seg + seg_step
    n = num_child_events
    return EventSoA(event_pos=pos[:n], event_kind=kind[:n], event_ref=ref[:n], event_seg=seg[:n])


def emit_level(xp, nodes, node_split, best, split_rank, refs, ref_class, level_base,
               leaf_ref_base, num_leaf_refs):
    """Node records of this level and the triangle lists of its leaves (R10).

    Children of the ``r``-th splitting node of the level are nodes
    ``level_base + n + 2r`` and ``+ 1`` of the tree (siblings adjacent); leaf
    triangles keep the references' order, ascending within a leaf.

    Returns
    -------
    node_axis : (n,) int8
    node_split_pos : (n,) float32
    node_child : (n,) int32
    node_count : (n,) int32
    leaf_tris : (num_leaf_refs,) int32
    """
    n = nodes.size
    node_n = nodes.node_ref_offset[1:] - nodes.node_ref_offset[:-1]
    leaf_n = xp.where(node_split, 0, node_n)
    leaf_offset = exclusive_scan(leaf_n, dtype=np.int64)
    node_axis = xp.where(node_split, best.node_axis, enc.AXIS_LEAF).astype(enc.NODE_AXIS_DTYPE)
    node_split_pos = xp.where(node_split, best.node_pos, np.float32(0)).astype(np.float32)
    node_child = xp.where(node_split, level_base + n + 2 * split_rank[:-1],
                          leaf_ref_base + leaf_offset[:-1]).astype(np.int32)
    node_count = leaf_n.astype(np.int32)
    in_leaf = ref_class == 0
    leaf_ex = exclusive_scan(in_leaf, dtype=np.int64)
    leaf_tris = xp.empty(num_leaf_refs + 1, dtype=np.int32)
    leaf_tris[xp.where(in_leaf, leaf_ex[:-1], num_leaf_refs)] = refs.ref_tri
    return node_axis, node_split_pos, node_child, node_count, leaf_tris[:num_leaf_refs]


def make_child_nodes(xp, nodes, node_split, best, split_rank, num_split):
    """Boxes of the children: left = ``hi[axis] = p``, right = ``lo[axis] = p``.

    Returns
    -------
    child_lo, child_hi : (2 * num_split, 3) float32
    """
    n = nodes.size
    rows = xp.arange(n)
    axis = best.node_axis.astype(np.int64)
    left_hi = nodes.node_hi.copy()
    left_hi[rows, axis] = best.node_pos
    right_lo = nodes.node_lo.copy()
    right_lo[rows, axis] = best.node_pos
    # Non-splitting nodes write to a dummy row that is dropped.
    dst = xp.where(node_split, 2 * split_rank[:-1], 2 * num_split)
    child_lo = xp.empty((2 * num_split + 2, 3), dtype=np.float32)
    child_hi = xp.empty((2 * num_split + 2, 3), dtype=np.float32)
    child_lo[dst] = nodes.node_lo
    child_hi[dst] = left_hi
    child_lo[xp.minimum(dst + 1, 2 * num_split)] = right_lo
    child_hi[xp.minimum(dst + 1, 2 * num_split)] = nodes.node_hi
    return child_lo[:2 * num_split], child_hi[:2 * num_split]
