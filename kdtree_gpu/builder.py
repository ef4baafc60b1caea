"""Level-by-level full-SAH kd-tree builder (GPU with CuPy, CPU with NumPy).

The method of the GAPT part 11 post (section 11.2), generalized to Wald &
Havran's exact rules (the build rules R1-R10 in :mod:`cpu_reference`):

* per axis, structure-of-arrays events (position, kind, reference, segment)
  built and sorted once at the root;
* per level, for all nodes of the level at once:
  :func:`compute_split_costs` (left / planar / right counts from scans, the
  SAH cost of every candidate plane, planar triangles tried on both sides),
  :func:`select_best_splits` (segmented arg-min with the reference's
  tie-breaking), :func:`decide_leaves`, :func:`classify_triangles`,
  :func:`emit_level` (node records and leaf triangle lists),
  :func:`split_refs` and :func:`split_events` (stable compaction of the
  triangle references and of every axis's events into the children: order
  kept, never re-sorted), :func:`make_child_nodes`;
* stop when a level has no node left.

The same stage functions run on NumPy arrays (``device="cpu"``) and on CuPy
arrays (``device="cuda"``, ``kernels="xp"``); ``xp`` is the array module of
the backend. On the GPU the default runs their element-wise work in CUDA
(device functions in ``cuda/build_stages.cuh``, one per stage), either all
levels in one cooperative launch of the level-loop kernel
(:func:`build_levels_grid`, ``cuda/build_loop.cu``) or, for levels too large
for it and on devices without cooperative launch, one launch per stage
(:func:`build_level_stages`, ``cuda/build.cu``).

The three axes' events live in one array, ordered by segment, then position,
kind and reference. A segment is one (axis, node) pair: ``seg = axis * n + node``
for the ``n`` nodes of the level. Triangle references (``ref_*``) are ordered
by node, then triangle index.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

import numpy as np

from . import encoding as enc
from .device import resolve_device
from .config import SAHConfig
from .mesh import coerce_mesh, prepare_mesh
from .launch import stage
from .primitives import exclusive_scan, segmented_argmin, upper_bound
from .tree import KdTree

# Packing of the root sort key: (position bits << 32) | (kind << 30) | reference.
_REF_BITS = 30
# The GPU root sort packs the axis too and leaves 28 bits for the reference.
MAX_TRIANGLES = (1 << 28) - 1


# --- structures of arrays ------------------------------------------------------
@dataclasses.dataclass
class EventSoA:
    """Events of all nodes of a level, all three axes in one array.

    Attributes
    ----------
    event_pos : (num_events,) float32
    event_kind : (num_events,) int8
        ``EVENT_END < EVENT_PLANAR < EVENT_START``.
    event_ref : (num_events,) int32
        Index of the event's triangle reference in the level's ``RefSoA``.
    event_seg : (num_events,) int32
        ``axis * num_nodes + node``; events are sorted by segment first.
    """

    event_pos: object
    event_kind: object
    event_ref: object
    event_seg: object

    @property
    def size(self) -> int:
        return int(self.event_pos.shape[0])


@dataclasses.dataclass
class RefSoA:
    """Triangle references (node-triangle pairs) of a level, sorted by node.

    Attributes
    ----------
    ref_tri : (num_refs,) int32
        Triangle index into the mesh.
    ref_node : (num_refs,) int32
        Node (within the level) holding the reference.
    """

    ref_tri: object
    ref_node: object

    @property
    def size(self) -> int:
        return int(self.ref_tri.shape[0])


@dataclasses.dataclass
class NodeSoA:
    """Nodes of one level.

    Attributes
    ----------
    node_lo, node_hi : (num_nodes, 3) float32
        Node boxes.
    node_ref_offset : (num_nodes + 1,) int64
        Node ``i`` owns references ``[node_ref_offset[i], node_ref_offset[i+1])``.
    seg_event_offset : (3 * num_nodes + 1,) int64
        Segment ``s = axis * num_nodes + node`` owns events
        ``[seg_event_offset[s], seg_event_offset[s+1])``.
    """

    node_lo: object
    node_hi: object
    node_ref_offset: object
    seg_event_offset: object

    @property
    def size(self) -> int:
        return int(self.node_lo.shape[0])


@dataclasses.dataclass
class BestSplit:
    """Per-node outcome of the split search.

    Attributes
    ----------
    node_cost : (num_nodes,) float64
        Best split cost (``inf`` when there is no candidate).
    node_axis : (num_nodes,) int8
    node_pos : (num_nodes,) float32
    node_side : (num_nodes,) int8
        Side of the planar triangles lying in the plane (``SIDE_LEFT``/``SIDE_RIGHT``).
    """

    node_cost: object
    node_axis: object
    node_pos: object
    node_side: object


# --- build stages ----------------------------------------------------------------
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
    from .primitives import float_to_ordered_uint, radix_sort

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


def _split_cost_xp(xp, cfg, area_left, area_right, area_node, n_left, n_right):
    # The element-wise twin of config.split_cost: same operations, same order.
    cost = cfg.k_traversal + cfg.k_intersect * ((area_left * n_left + area_right * n_right)
                                                / area_node)
    empty = (n_left == 0) | (n_right == 0)
    return xp.where(empty, cost * cfg.empty_bonus, cost)


def _half_area(d):
    return (d[..., 0] * d[..., 1] + d[..., 1] * d[..., 2]) + d[..., 2] * d[..., 0]


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
    cost_left = _split_cost_xp(xp, cfg, area_left, area_right, area, nl + npl, nr)
    cost_right = _split_cost_xp(xp, cfg, area_left, area_right, area, nl, nr + npl)
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


def classify_triangles(xp, refs, best, node_split, tri_lo, tri_hi):
    """Class of every reference: 0 (its node is a leaf), left, right or both (R9).

    Returns
    -------
    (num_refs,) uint8
        ``CLASS_LEFT`` / ``CLASS_RIGHT`` bits; 0 for references of leaf nodes.
    """
    node = refs.ref_node
    axis = best.node_axis[node].astype(np.int64)
    p = best.node_pos[node]
    a = tri_lo[refs.ref_tri, axis]
    b = tri_hi[refs.ref_tri, axis]
    cls = xp.full(refs.size, enc.CLASS_BOTH, dtype=np.uint8)
    cls = xp.where(b <= p, np.uint8(enc.CLASS_LEFT), cls)
    cls = xp.where(a >= p, np.uint8(enc.CLASS_RIGHT), cls)
    side_cls = xp.where(best.node_side[node] == enc.SIDE_LEFT,
                        np.uint8(enc.CLASS_LEFT), np.uint8(enc.CLASS_RIGHT))
    cls = xp.where((a == b) & (a == p), side_cls, cls)
    return xp.where(node_split[node], cls, np.uint8(0)).astype(np.uint8)


@dataclasses.dataclass
class ChildRoute:
    """Where the left and right copies of grouped elements go in the children.

    Elements (references or events) are grouped (by node or segment); the
    copies of group ``g``'s elements go, in order, to child groups
    ``child_left[g]`` and ``child_left[g] + 1``.

    Attributes
    ----------
    dst_left, dst_right : (num_elements,) int64
        Destination index of each copy; ``total`` (a dummy slot) where none.
    child_offset : (num_child_groups_max + 1,) int64
        Exclusive scan of the child group sizes.
    total : 0-d int64
        Number of copies (device scalar until read).
    """

    dst_left: object
    dst_right: object
    child_offset: object
    total: object


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


# --- the driver -------------------------------------------------------------------
def _as_mesh_arrays(vertices, faces):
    if faces is None:
        if hasattr(vertices, "vertices") and hasattr(vertices, "faces"):
            return vertices.vertices, vertices.faces
        raise TypeError("build() needs (vertices, faces) or a mesh object with .vertices and .faces")
    return vertices, faces


def build(vertices, faces=None, config: Optional[SAHConfig] = None, device: str = "auto",
          profile: bool = False, kernels: str = "fused") -> KdTree:
    """Build a full-SAH kd-tree level by level.

    Parameters
    ----------
    vertices : (num_vertices, 3) array_like of float, or a mesh object
        Vertex positions; or a ``trimesh.Trimesh`` (anything with
        ``.vertices`` and ``.faces``) with ``faces`` left out.
    faces : (num_triangles, 3) array_like of int, optional
    config : SAHConfig, optional
        Defaults to ``SAHConfig()``.
    device : {"auto", "cuda", "gpu", "cpu"}
        ``"cuda"`` runs the pipeline on CuPy, ``"cpu"`` the same pipeline on
        NumPy, ``"auto"`` picks CUDA when a GPU is usable.
    profile : bool
        Record a per-stage time table in ``tree.build_info["profile"]``.
    kernels : {"fused", "stages", "xp"}
        On the GPU: ``"fused"`` (default) runs the levels in the level-loop
        kernel of ``cuda/build_loop.cu`` (a few launches for the whole tree,
        every size kept on the device), or one launch per stage where the
        device cannot run cooperative launches; ``"stages"`` always launches
        each stage (the kernels of ``cuda/build.cu``, one read of the next
        level's sizes per level); ``"xp"`` runs the same stage functions as
        the NumPy pipeline on CuPy arrays (the kernels' twin, for testing).

    Returns
    -------
    KdTree
        The same tree as ``cpu_reference.build`` under the same settings
        (node order may differ).

    Raises
    ------
    MeshError
        Invalid mesh (see ``kdtree_gpu.mesh.validate_mesh``).
    NotImplementedError
        ``config.clip=True`` on the GPU.
    MemoryError
        The build does not fit in device memory (the GPU stays usable).
    """
    cfg = SAHConfig() if config is None else config
    if not isinstance(cfg, SAHConfig):
        raise TypeError(f"config must be a SAHConfig, got {type(cfg).__name__}")
    if kernels not in ("fused", "stages", "xp"):
        raise ValueError(f"kernels must be 'fused', 'stages' or 'xp', got {kernels!r}")
    dev = resolve_device(device).kind
    vertices, faces = _as_mesh_arrays(vertices, faces)
    if cfg.clip:
        if dev == "cuda":
            raise NotImplementedError(
                "perfect splits (clip=True) are not implemented in the GPU builder yet; "
                "use device='cpu' (which runs cpu_reference.build) or clip=False")
        import cpu_reference

        tree = cpu_reference.build(vertices, faces, cfg)
        tree.build_info["requested_device"] = "cpu"
        return tree

    import contextlib

    from .launch import Profiler

    if np.shape(faces)[0] > MAX_TRIANGLES:
        raise ValueError(f"too many triangles: {np.shape(faces)[0]} (at most {MAX_TRIANGLES})")
    t0 = time.perf_counter()
    if dev == "cuda":
        import cupy as cp

        fused = kernels != "xp"
        if fused:
            V, F = coerce_mesh(vertices, faces)
        else:
            V, F, tri_lo, tri_hi, valid, bounds = prepare_mesh(vertices, faces)
        try:
            with (Profiler() if profile else contextlib.nullcontext()) as prof:
                if fused:
                    host, info = _build_levels_cuda(
                        cp, cfg, V, F, loop="grid" if kernels == "fused" else "stages")
                else:
                    arrays = _build_levels(cp, cfg, tri_lo, tri_hi, valid, bounds)
                    host = [a.get() for a in arrays[:5]]
                    info = {"levels": arrays[5], "level_sizes": arrays[6], "bounds": bounds,
                            "num_degenerate": int((~valid).sum())}
        except (cp.cuda.memory.OutOfMemoryError, MemoryError) as exc:
            # CuPy's pool raises OutOfMemoryError; CUB's temporary storage a
            # MemoryError ("std::bad_alloc"). Free the cache so the GPU stays usable.
            cp.get_default_memory_pool().free_all_blocks()
            raise MemoryError(
                f"the kd-tree build of {F.shape[0]} triangles does not fit in GPU memory "
                f"({exc}); try device='cpu' or a smaller mesh") from None
        bounds = info.pop("bounds")
        num_degenerate = info.pop("num_degenerate")
        build_info = {"builder": "kdtree_gpu.level", "device": "cuda", "kernels": kernels,
                      **info}
    else:
        V, F, tri_lo, tri_hi, valid, bounds = prepare_mesh(vertices, faces)
        with (Profiler() if profile else contextlib.nullcontext()) as prof:
            arrays = _build_levels(np, cfg, tri_lo, tri_hi, valid, bounds)
        host = list(arrays[:5])
        num_degenerate = int((~valid).sum())
        build_info = {"builder": "kdtree_gpu.level", "device": "cpu", "levels": arrays[5],
                      "level_sizes": arrays[6]}
    build_info["seconds"] = time.perf_counter() - t0
    if profile:
        build_info["profile"] = prof.as_dict()
        build_info["profile_table"] = prof.report()
    node_axis, node_split, node_child, node_count, leaf_tris = host
    return KdTree(node_axis=node_axis, node_split=node_split, node_child=node_child,
                  node_count=node_count, leaf_tris=leaf_tris, bounds=bounds, vertices=V,
                  faces=F, config=cfg, num_degenerate=num_degenerate,
                  build_info=build_info)


def _build_levels(xp, cfg, tri_lo_h, tri_hi_h, valid_h, bounds_h):
    """Run the level loop; return the concatenated node arrays and leaf list."""
    ref_tri_h = np.flatnonzero(valid_h).astype(np.int32)
    num_root = int(ref_tri_h.shape[0])
    max_depth = cfg.resolved_max_depth(num_root)
    with stage(xp=xp, description="upload"):
        tri_lo = xp.asarray(tri_lo_h)
        tri_hi = xp.asarray(tri_hi_h)
        ref_tri = xp.asarray(ref_tri_h)
    with stage(xp=xp, description="create_root_events"):
        events = create_root_events(xp, tri_lo, tri_hi, ref_tri)
    refs = RefSoA(ref_tri=ref_tri, ref_node=xp.zeros(num_root, dtype=np.int32))
    # Per axis, every triangle has one planar event or two others (read from
    # the host boxes, as the CUDA loop does, rather than counted on the events).
    planar_h = (tri_lo_h[ref_tri_h] == tri_hi_h[ref_tri_h]).sum(axis=0)
    seg_count = [2 * num_root - int(p) for p in planar_h]
    nodes = NodeSoA(
        node_lo=xp.asarray(bounds_h[0:1]).astype(np.float32),
        node_hi=xp.asarray(bounds_h[1:2]).astype(np.float32),
        node_ref_offset=xp.asarray(np.array([0, num_root], dtype=np.int64)),
        seg_event_offset=xp.asarray(np.concatenate([[0], np.cumsum(seg_count)]).astype(np.int64)),
    )
    out_axis, out_split, out_child, out_count, out_leaf = [], [], [], [], []
    level_base = 0
    leaf_ref_base = 0
    level = 0
    level_sizes = []
    while nodes.size > 0:
        n = nodes.size
        level_sizes.append((n, refs.size, events.size))
        with stage(xp=xp, description="compute_split_costs"):
            node_n = nodes.node_ref_offset[1:] - nodes.node_ref_offset[:-1]
            node_active = (node_n > cfg.leaf_size) & (level < max_depth)
            if cfg.axes == "longest":
                # float64 extents, as in the reference (R5)
                longest = xp.argmax(nodes.node_hi.astype(np.float64)
                                    - nodes.node_lo.astype(np.float64), axis=1)
                node_axis_mask = xp.arange(3)[:, None] == longest[None, :]
            else:
                node_axis_mask = xp.ones((3, n), dtype=bool)
            event_cost, event_side = compute_split_costs(xp, events, nodes, node_active,
                                                         node_axis_mask, cfg)
        with stage(xp=xp, description="select_best_splits"):
            best = select_best_splits(xp, events, nodes, event_cost, event_side)
        with stage(xp=xp, description="decide_leaves"):
            node_split = decide_leaves(xp, nodes, best, node_active, cfg)
            split_rank = exclusive_scan(node_split, dtype=np.int64)
        with stage(xp=xp, description="classify_triangles"):
            ref_class = classify_triangles(xp, refs, best, node_split, tri_lo, tri_hi)
        with stage(xp=xp, description="route_refs"):
            # Child groups: 2 per splitting node; 2n is a bound that needs no sync.
            node_child_left = xp.where(node_split, 2 * split_rank[:-1], 2 * n)
            ref_route = route_to_children(
                xp, (ref_class & enc.CLASS_LEFT) != 0, (ref_class & enc.CLASS_RIGHT) != 0,
                refs.ref_node, nodes.node_ref_offset, node_child_left, 2 * n)
        with stage(xp=xp, description="route_events"):
            event_class = ref_class[events.event_ref]
            num_split_dev = split_rank[-1]
            seg = xp.arange(3 * n, dtype=np.int64)
            seg_node = seg % n
            seg_axis = seg // n
            # Child segment of (axis, node): axis * (2 * num_split) + 2 * rank(node).
            seg_child_left = xp.where(node_split[seg_node],
                                      seg_axis * (2 * num_split_dev) + 2 * split_rank[:-1][seg_node],
                                      6 * n)
            event_route = route_to_children(
                xp, (event_class & enc.CLASS_LEFT) != 0, (event_class & enc.CLASS_RIGHT) != 0,
                events.event_seg, nodes.seg_event_offset, seg_child_left, 6 * n)
            leaf_count = (ref_class == 0).sum()
        with stage(xp=xp, description="read_level_counts"):
            # The one deliberate device-to-host read per level: sizes of the next level.
            counts = xp.stack([num_split_dev, ref_route.total, event_route.total,
                               leaf_count.astype(np.int64)])
            num_split, num_child_refs, num_child_events, num_leaf_refs = (
                int(c) for c in (counts.get() if xp is not np else counts))
        with stage(xp=xp, description="emit_level"):
            level_arrays = emit_level(xp, nodes, node_split, best, split_rank, refs, ref_class,
                                      level_base, leaf_ref_base, num_leaf_refs)
            for out, arr in zip((out_axis, out_split, out_child, out_count, out_leaf),
                                level_arrays):
                out.append(arr)
        level_base += n
        leaf_ref_base += num_leaf_refs
        level += 1
        if num_split == 0:
            break
        with stage(xp=xp, description="split_refs"):
            child_refs = split_refs(xp, refs, ref_route, num_child_refs, split_rank)
        with stage(xp=xp, description="split_events"):
            events = split_events(xp, events, event_route, num_child_events, seg_child_left,
                                  ref_route)
        with stage(xp=xp, description="make_child_nodes"):
            child_lo, child_hi = make_child_nodes(xp, nodes, node_split, best, split_rank,
                                                  num_split)
            nodes = NodeSoA(node_lo=child_lo, node_hi=child_hi,
                            node_ref_offset=ref_route.child_offset[:2 * num_split + 1],
                            seg_event_offset=event_route.child_offset[:6 * num_split + 1])
        refs = child_refs
    with stage(xp=xp, description="concatenate_output"):
        result = [xp.concatenate(parts) for parts in
                  (out_axis, out_split, out_child, out_count, out_leaf)]
    return (*result, level, level_sizes)


# --- the fused CUDA level loop ---------------------------------------------------------
_SCAN_TILE = 256 * 8  # KD_SCAN_TILE in cuda/build.cu


_SCAN_SMALL = 8 * _SCAN_TILE  # up to this size, one block scans in one launch
# Levels whose arrays are all below this size use the block-wide kernels
# (kd_small_*): one block does several stages, one launch instead of several.
_SMALL_LEVEL = 1 << 16
_kernel_cache = {}


def _kernel(name):
    # Looked up ~30 times per level: keep the lookup to one dict access per
    # (device, kernel) after the first compile through the module factory.
    import cupy

    key = (cupy.cuda.Device().id, name)
    kernel = _kernel_cache.get(key)
    if kernel is None:
        from .kernels import get_function

        kernel = _kernel_cache[key] = get_function("build.cu", name)
    return kernel


def scan_inclusive_cuda(cp, values, description):
    """Inclusive scan of an int64 CuPy array with the three-launch scan of build.cu.

    Its NumPy twin is ``np.cumsum``; CuPy's ``cumsum`` gives the same
    numbers with more host work per call, which dominates small levels.

    Returns
    -------
    (n,) int64
    """
    from .launch import launch

    n = int(values.shape[0])
    out = cp.empty(n, dtype=np.int64)
    if n == 0:
        return out
    i64 = np.int64
    if n <= _SCAN_SMALL:
        launch(description, _kernel("kd_scan_small_pair"), 256,
               (values, i64(n), out, values, i64(0), out))
        return out
    num_tiles = (n + _SCAN_TILE - 1) // _SCAN_TILE
    tile = cp.empty(num_tiles, dtype=np.int64)
    launch(description + ": tile sums", _kernel("kd_scan_tile_sums"), num_tiles * 256,
           (values, i64(n), tile))
    launch(description + ": tile prefix", _kernel("kd_scan_tile_prefix"), 256,
           (tile, i64(num_tiles)))
    launch(description + ": tiles", _kernel("kd_scan_tiles"), num_tiles * 256,
           (values, i64(n), tile, out))
    return out


# Initial summary of kd_prepare_triangles: flags, counts, then the box's
# minimum (largest key) and maximum (smallest key) in ordered-bit form.
_PREPARE_INIT = np.array([0, 0, 0, 0, 0] + [0xFFFFFFFF] * 3 + [0] * 3, dtype=np.uint64)


def scan_pair_cuda(cp, first, second, description):
    """Two inclusive int64 scans; one launch when both arrays are small."""
    from .launch import launch

    n0, n1 = int(first.shape[0]), int(second.shape[0])
    if n0 > _SCAN_SMALL or n1 > _SCAN_SMALL:
        return (scan_inclusive_cuda(cp, first, description + " (1)"),
                scan_inclusive_cuda(cp, second, description + " (2)"))
    out0 = cp.empty(n0, dtype=np.int64)
    out1 = cp.empty(n1, dtype=np.int64)
    launch(description, _kernel("kd_scan_small_pair"), 2 * 256,
           (first, np.int64(n0), out0, second, np.int64(n1), out1))
    return out0, out1


_prepare_init_cache = {}


def prepare_mesh_cuda(cp, V, F):
    """Rule R1 on the device: triangle boxes, degenerate test, the root level.

    Parameters
    ----------
    V : (num_vertices, 3) float32, F : (num_triangles, 3) int32
        Host arrays from :func:`kdtree_gpu.mesh.coerce_mesh`.

    Returns
    -------
    tri_lo, tri_hi : (num_triangles, 3) float32 (device)
    refs : RefSoA
        The root's references: the non-degenerate triangles, ascending.
    nodes : NodeSoA
        The root node (box and offsets; events per axis from ``planar``).
    bounds : (2, 3) float32 (host)
    planar : (3,) int (host)
        Valid triangles that are flat on each axis (one event instead of two).
    num_degenerate : int
    """
    from .mesh import MeshError, validate_mesh
    from .launch import launch

    m = int(F.shape[0])
    V_d = cp.asarray(V)
    F_d = cp.asarray(F)
    tri_lo = cp.empty((m, 3), dtype=np.float32)
    tri_hi = cp.empty((m, 3), dtype=np.float32)
    valid = cp.empty(m, dtype=np.int64)
    device = cp.cuda.Device().id
    init = _prepare_init_cache.get(device)
    if init is None:
        init = _prepare_init_cache[device] = cp.asarray(_PREPARE_INIT)
    summary = init.copy()
    launch("prepare_mesh", _kernel("kd_prepare_triangles"), m,
           (V_d, F_d, np.int64(V.shape[0]), np.int64(m), tri_lo, tri_hi, valid, summary))
    # One deliberate read: problems, root box and event counts size everything after.
    host = summary.get()
    if host[0] != 0:
        validate_mesh(V, F)  # names the first bad vertex or face
        raise MeshError("invalid mesh (non-finite coordinates or out-of-range indices)")
    num_valid = int(host[1])
    if num_valid == 0:
        raise MeshError(f"all {m} triangles are degenerate (zero area); nothing to build")
    bits = host[5:11].astype(np.uint32)
    # Undo the order-preserving transform of kd_ordered_bits32 (as
    # kd_float_from_ordered_bits32 does on the device).
    bits = np.where(bits & np.uint32(0x80000000), bits & np.uint32(0x7FFFFFFF), ~bits)
    bounds = bits.astype(np.uint32).view(np.float32).reshape(2, 3).copy()
    planar = host[2:5].astype(np.int64)
    # The root level: references numbered by a scan of the valid flags.
    valid_scan = scan_inclusive_cuda(cp, valid, "prepare_mesh: number references")
    refs = RefSoA(ref_tri=cp.empty(num_valid, dtype=np.int32),
                  ref_node=cp.empty(num_valid, dtype=np.int32))
    nodes = NodeSoA(node_lo=cp.empty((1, 3), dtype=np.float32),
                    node_hi=cp.empty((1, 3), dtype=np.float32),
                    node_ref_offset=cp.empty(2, dtype=np.int64),
                    seg_event_offset=cp.empty(4, dtype=np.int64))
    launch("prepare_mesh: root level", _kernel("kd_root_level"), m,
           (valid_scan, np.int64(m), summary, refs.ref_tri, refs.ref_node, nodes.node_lo,
            nodes.node_hi, nodes.node_ref_offset, nodes.seg_event_offset))
    return tri_lo, tri_hi, refs, nodes, bounds, planar, m - num_valid


def create_root_events_cuda(cp, tri_lo, tri_hi, ref_tri, planar):
    """Rule R3 on the device: one key per event, three radix sorts, decode.

    Returns
    -------
    EventSoA
    axis_counts : list of int
        Events per axis.
    """
    from .launch import launch

    num_refs = int(ref_tri.shape[0])
    keys = cp.empty(3 * 2 * num_refs, dtype=np.uint64)
    launch("create_root_events: keys", _kernel("kd_root_event_keys"), num_refs,
           (tri_lo, tri_hi, ref_tri, np.int64(num_refs), keys))
    counts = [2 * num_refs - int(p) for p in planar]
    total = sum(counts)
    with stage(xp=cp, description="create_root_events: sort"):
        # Keys are unique and start with the axis, so one sort gives rule R3's
        # order on every axis; planar triangles' unused slots hold the largest
        # key and sort after all real events.
        sorted_keys = cp.sort(keys)
    events = EventSoA(event_pos=cp.empty(total, dtype=enc.EVENT_POS_DTYPE),
                      event_kind=cp.empty(total, dtype=enc.EVENT_KIND_DTYPE),
                      event_ref=cp.empty(total, dtype=np.int32),
                      event_seg=cp.empty(total, dtype=np.int32))
    launch("create_root_events: decode", _kernel("kd_root_events_decode"), total,
           (sorted_keys, np.int64(total), events.event_pos, events.event_kind, events.event_ref,
            events.event_seg))
    return events, counts


class _OutputBuffers:
    """Device node arrays and leaf list, written level by level at offsets,
    grown by doubling (no per-level concatenation)."""

    def __init__(self, cp, node_capacity, leaf_capacity):
        self.cp = cp
        self.node = [cp.empty(node_capacity, dtype=dt) for dt in
                     (enc.NODE_AXIS_DTYPE, enc.NODE_SPLIT_DTYPE, enc.NODE_CHILD_DTYPE,
                      enc.NODE_COUNT_DTYPE)]
        self.leaf = cp.empty(leaf_capacity, dtype=enc.LEAF_TRIS_DTYPE)

    @staticmethod
    def _grow(cp, arr, need):
        if need <= arr.shape[0]:
            return arr
        bigger = cp.empty(max(need, 2 * arr.shape[0]), dtype=arr.dtype)
        bigger[:arr.shape[0]] = arr
        return bigger

    def reserve(self, num_nodes, num_leaf_refs):
        self.node = [self._grow(self.cp, a, num_nodes) for a in self.node]
        self.leaf = self._grow(self.cp, self.leaf, num_leaf_refs)

    # Trees up to this many bytes are packed for one copy (below it, each
    # copy's synchronization costs more than the packing); larger ones copy
    # array by array (packing measured slower on an H200 for 260 MB).
    PACK_BYTES = 1 << 24

    def download(self, num_nodes, num_leaf_refs):
        """The tree's arrays on the host. A small tree is packed into one
        device buffer and copied once (one synchronization instead of five).

        Returns
        -------
        list of numpy.ndarray
            node_axis, node_split, node_child, node_count (num_nodes,) and
            leaf_tris (num_leaf_refs,).
        """
        cp = self.cp
        parts = [a[:num_nodes] for a in self.node] + [self.leaf[:num_leaf_refs]]
        if sum(part.nbytes for part in parts) > self.PACK_BYTES:
            return [part.get() for part in parts]
        offsets, total = [], 0
        for part in parts:
            offsets.append(total)
            total += (part.nbytes + 7) // 8 * 8  # keep every part 8-byte aligned
        packed = cp.empty(total, dtype=np.uint8)
        for part, offset in zip(parts, offsets):
            packed[offset:offset + part.nbytes].view(part.dtype)[...] = part
        host = packed.get()
        return [host[offset:offset + part.nbytes].view(part.dtype)
                for part, offset in zip(parts, offsets)]


@dataclasses.dataclass
class _LoopState:
    """Where the level loop stands: the current level and what is written."""

    events: EventSoA
    refs: RefSoA
    nodes: NodeSoA
    level: int = 0
    level_base: int = 0  # tree nodes written
    leaf_ref_base: int = 0  # leaf_tris entries written
    level_sizes: list = dataclasses.field(default_factory=list)
    done: bool = False
    peak_bytes: int = 0  # device memory pool in use at the loop's high-water mark
    launches: int = 0  # launches of the level-loop kernel
    stage_levels: list = dataclasses.field(default_factory=list)  # levels run by stages


_LOOP_BLOCK = 512  # KD_LOOP_BLOCK in cuda/build_loop.cu
# Levels of up to this many events run in the level-loop kernel; larger ones
# with one launch per stage, whose kernels, sized to the level, move memory
# faster than the loop's fixed grid (measured on an H200: the loop wins up
# to a few million events per level and loses about 20% at tens of millions).
LOOP_MAX_EVENTS = 1 << 23
_loop_kernel_cache = {}


def level_loop_kernel(cp):
    """The level-loop kernel and its cooperative grid on the current device.

    Returns
    -------
    (cupy.RawKernel, int) or None
        The kernel ``kd_build_levels_grid`` and the number of blocks that are
        resident at once (blocks per multiprocessor times multiprocessors),
        or ``None`` when the device cannot run cooperative launches.
    """
    device = cp.cuda.Device()
    if device.id in _loop_kernel_cache:
        return _loop_kernel_cache[device.id]
    attributes = device.attributes
    result = None
    if attributes.get("CooperativeLaunch", 0):
        from cupy_backends.cuda.api import driver

        from .kernels import get_function

        kernel = get_function("build_loop.cu", "kd_build_levels_grid", cooperative=True)
        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr,
                                                                  _LOOP_BLOCK, 0)
        if per_sm > 0:
            result = (kernel, per_sm * attributes["MultiProcessorCount"])
    _loop_kernel_cache[device.id] = result
    return result


def _level_buffers(cp, cap_events, cap_refs, cap_nodes):
    """Two level buffers (slot s at ``[s]``) and the per-level scratch of the
    level-loop kernel, in its parameter order."""
    empty = cp.empty
    levels = (
        empty((2, cap_events), dtype=enc.EVENT_POS_DTYPE),  # event_pos
        empty((2, cap_events), dtype=enc.EVENT_KIND_DTYPE),  # event_kind
        empty((2, cap_events), dtype=np.int32),  # event_ref
        empty((2, cap_events), dtype=np.int32),  # event_seg
        empty((2, cap_refs), dtype=np.int32),  # ref_tri
        empty((2, cap_refs), dtype=np.int32),  # ref_node
        empty((2, cap_nodes, 3), dtype=np.float32),  # node_lo
        empty((2, cap_nodes, 3), dtype=np.float32),  # node_hi
        empty((2, 2 * cap_nodes + 1), dtype=np.int64),  # node_ref_offset
        empty((2, 6 * cap_nodes + 1), dtype=np.int64),  # seg_event_offset
    )
    scratch = (
        empty(cap_events + 1, dtype=np.int64),  # open_close_ex
        empty(3 * cap_nodes, dtype=np.uint64),  # seg_min_cost
        empty(3 * cap_nodes, dtype=np.uint64),  # seg_best
        empty(cap_events, dtype=np.float64),  # event_cost
        empty(cap_events, dtype=np.int8),  # event_side
        empty(cap_nodes, dtype=np.float64),  # best_cost
        empty(cap_nodes, dtype=np.int8),  # best_axis
        empty(cap_nodes, dtype=np.float32),  # best_pos
        empty(cap_nodes, dtype=np.int8),  # best_side
        empty(cap_nodes, dtype=bool),  # node_split
        empty(cap_nodes + 1, dtype=np.int64),  # split_leaf
        empty(cap_nodes + 1, dtype=np.int64),  # split_leaf_ex
        empty(cap_refs, dtype=np.uint8),  # ref_class
        empty(cap_refs + 1, dtype=np.int64),  # ref_lr
        empty(cap_refs + 1, dtype=np.int64),  # ref_lr_ex
        empty(cap_events + 1, dtype=np.int64),  # event_lr_ex
        empty(8 * cap_nodes + 2, dtype=np.int64),  # child_count
    )
    return levels, scratch


def first_loop_capacity(num_events, num_refs):
    """Capacities of the level loop's first buffers, from the root's sizes.

    Room for the events to grow fourfold and the references eightfold (the
    first levels grow by less than 2x each, the last ones shed events into
    leaves); levels seldom have more nodes than twice the root's references;
    trees hold about 2-8 nodes and leaf entries per triangle. A build that
    outgrows them costs one more launch.

    Returns
    -------
    cap_events, cap_refs, cap_nodes, cap_tree : int
        Events, references and nodes per level; tree nodes and leaf entries.
    """
    return (4 * num_events + 4096, 8 * num_refs + 1024, 2 * num_refs + 1024,
            8 * num_refs + 256)


def build_levels_grid(cp, cfg, tri_lo, tri_hi, state, out, max_depth, loop):
    """Run levels from ``state`` in cooperative launches of the level-loop kernel.

    The kernel ``kd_build_levels_grid`` calls the same stage functions as the
    launch-per-stage loop, level after level, with a grid barrier between
    stages and every size kept on the device: one launch and one read for
    all the levels that fit in its buffers, instead of about ten launches,
    twenty allocations and one read per level. When a level's children (or
    its part of the tree) would not fit, the kernel stops before that level
    writes anything and says what it needs; the loop is launched again from
    that level with buffers twice that size, or, when the level's children
    would have more than ``LOOP_MAX_EVENTS`` events, returns that level to
    the caller (who runs it with one launch per stage).

    Parameters
    ----------
    tri_lo, tri_hi : (num_triangles, 3) float32 (device)
    state : _LoopState
        The level to start from: the root, or a level the per-stage loop
        handed back.
    out : _OutputBuffers
        Grown when the tree outgrows it.
    max_depth : int
    loop : (cupy.RawKernel, int)
        From :func:`level_loop_kernel`.

    Returns
    -------
    _LoopState
        Done, or the first level whose children are too large for the loop.
    """
    from .launch import launch

    i64, f64 = np.int64, np.float64
    kernel, grid = loop
    pool = cp.get_default_memory_pool()
    cap_e, cap_r, cap_n, cap_tree = first_loop_capacity(state.events.size, state.refs.size)
    cap_e = max(state.events.size, min(cap_e, LOOP_MAX_EVENTS))
    cap_r = max(state.refs.size, min(cap_r, LOOP_MAX_EVENTS // 3 + 1))
    cap_n = max(state.nodes.size, cap_n)
    out.reserve(state.level_base + cap_tree, state.leaf_ref_base + cap_tree)
    block_sum = cp.empty(3 * grid, dtype=np.int64)
    while True:
        ev, refs, nodes = state.events, state.refs, state.nodes
        levels, scratch = _level_buffers(cp, cap_e, cap_r, cap_n)
        status = cp.zeros(enc.LOOP_SLOTS + 3 * (max_depth + 1), dtype=np.int64)
        launch("build_levels_grid", kernel, grid * _LOOP_BLOCK,
               (tri_lo, tri_hi,
                ev.event_pos, ev.event_kind, ev.event_ref, ev.event_seg, refs.ref_tri,
                refs.ref_node, nodes.node_lo, nodes.node_hi, nodes.node_ref_offset,
                nodes.seg_event_offset, i64(nodes.size), i64(refs.size), i64(ev.size),
                i64(state.level), i64(state.level_base), i64(state.leaf_ref_base),
                *levels, i64(cap_e), i64(cap_r), i64(cap_n), *scratch, block_sum,
                *out.node, i64(out.node[0].shape[0]), out.leaf, i64(out.leaf.shape[0]),
                i64(LOOP_MAX_EVENTS), i64(max_depth), i64(cfg.leaf_size),
                np.int32(cfg.axes == "longest"), f64(cfg.k_traversal), f64(cfg.k_intersect),
                f64(cfg.empty_bonus), status),
               block=_LOOP_BLOCK)
        state.launches += 1
        state.peak_bytes = max(state.peak_bytes, pool.used_bytes())
        with stage(xp=cp, description="read_level_counts"):
            # One read for all the levels of the launch.
            record = status.get()
        level = int(record[enc.LOOP_LEVEL])
        sizes = record[enc.LOOP_SLOTS + 3 * state.level:enc.LOOP_SLOTS + 3 * level]
        state.level_sizes += [tuple(int(x) for x in row) for row in sizes.reshape(-1, 3)]
        state.level = level
        state.level_base = int(record[enc.LOOP_LEVEL_BASE])
        state.leaf_ref_base = int(record[enc.LOOP_LEAF_BASE])
        if int(record[enc.LOOP_STATE]) == enc.LOOP_DONE:
            state.done = True
            return state
        # Stopped at a level: go on from it with buffers twice what it needs.
        slot = int(record[enc.LOOP_BUFFER])
        if slot >= 0:
            n, num_refs, num_events = (int(record[k]) for k in (
                enc.LOOP_NODES, enc.LOOP_REFS, enc.LOOP_EVENTS))
            pos, kind, ref, seg, tri, node, lo, hi, ref_offset, seg_offset = levels
            state.events = EventSoA(pos[slot, :num_events], kind[slot, :num_events],
                                    ref[slot, :num_events], seg[slot, :num_events])
            state.refs = RefSoA(tri[slot, :num_refs], node[slot, :num_refs])
            state.nodes = NodeSoA(lo[slot, :n], hi[slot, :n], ref_offset[slot, :n + 1],
                                  seg_offset[slot, :3 * n + 1])
        need_events = int(record[enc.LOOP_NEED_EVENTS])
        if need_events > LOOP_MAX_EVENTS:
            return state
        cap_e = max(cap_e, min(2 * need_events, LOOP_MAX_EVENTS))
        cap_r = max(cap_r, 2 * int(record[enc.LOOP_NEED_REFS]))
        cap_n = max(cap_n, 2 * int(record[enc.LOOP_NEED_NODES]))
        out.reserve(2 * int(record[enc.LOOP_NEED_TREE_NODES]),
                    2 * int(record[enc.LOOP_NEED_LEAF_REFS]))


def build_level_stages(cp, cfg, tri_lo, tri_hi, state, out, max_depth):
    """Run one level from ``state`` with one launch per stage (the kernels of
    ``cuda/build.cu``) and one device-to-host read of four counts; every
    other size is a host value, and arrays have the level's exact sizes.

    Returns
    -------
    _LoopState
        The next level, or done.
    """
    from .launch import launch

    i64, f64 = np.int64, np.float64
    events, refs, nodes = state.events, state.refs, state.nodes
    n, num_refs, num_events = nodes.size, refs.size, events.size
    level, level_base, leaf_ref_base = state.level, state.level_base, state.leaf_ref_base
    longest_only = np.int32(cfg.axes == "longest")
    state.level_sizes.append((n, num_refs, num_events))
    state.stage_levels.append(level)
    level_active = np.int32(level < max_depth)
    # Small levels run the block-wide kernels: one launch per group of
    # stages between grid-wide dependencies (launch overhead dominates them).
    small = max(num_events, num_refs, 8 * n + 2) < _SMALL_LEVEL
    # -- compute_split_costs (R5-R7)
    open_close_ex = cp.empty(num_events + 1, dtype=np.int64)
    seg_min_cost = cp.empty(3 * n, dtype=np.uint64)
    seg_best = cp.empty(3 * n, dtype=np.uint64)
    if small:
        launch("compute_split_costs: event scan", _kernel("kd_small_event_scan"), 256,
               (events.event_kind, i64(num_events), i64(3 * n), open_close_ex, seg_min_cost,
                seg_best))
    else:
        open_close = cp.empty(num_events + 1, dtype=np.int64)
        launch("compute_split_costs: event flags", _kernel("kd_event_flags"),
               max(num_events, 3 * n),
               (events.event_pos, events.event_kind, events.event_seg, i64(num_events),
                i64(3 * n), open_close, seg_min_cost, seg_best))
        open_close_ex = scan_inclusive_cuda(cp, open_close, "compute_split_costs: scan")
    event_cost = cp.empty(num_events, dtype=np.float64)
    event_side = cp.empty(num_events, dtype=np.int8)
    launch("compute_split_costs: costs", _kernel("kd_split_costs"), num_events,
           (events.event_pos, events.event_seg, open_close_ex,
            nodes.seg_event_offset, nodes.node_ref_offset, nodes.node_lo, nodes.node_hi,
            i64(n), i64(num_events), i64(cfg.leaf_size), level_active, longest_only,
            f64(cfg.k_traversal), f64(cfg.k_intersect), f64(cfg.empty_bonus), event_cost,
            event_side, seg_min_cost))
    # -- select_best_splits (R8): the cost kernel left each segment's
    # minimum cost; this pass finds its lowest event index.
    launch("select_best_splits: segmented argmin", _kernel("kd_segment_argmin"), num_events,
           (event_cost, events.event_seg, seg_min_cost, i64(num_events), seg_best))
    best = BestSplit(node_cost=cp.empty(n, dtype=np.float64),
                     node_axis=cp.empty(n, dtype=np.int8),
                     node_pos=cp.empty(n, dtype=np.float32),
                     node_side=cp.empty(n, dtype=np.int8))
    node_split = cp.empty(n, dtype=bool)
    split_leaf = cp.empty(n + 1, dtype=np.int64)
    select_args = (seg_best, event_cost, events.event_pos, event_side, nodes.node_ref_offset,
                   i64(n), i64(cfg.leaf_size), level_active, f64(cfg.k_intersect),
                   best.node_cost, best.node_axis, best.node_pos, best.node_side, node_split,
                   split_leaf)
    # -- decide_leaves (R4, R8)
    if small:
        split_leaf_ex = cp.empty(n + 1, dtype=np.int64)
        launch("select_best_splits", _kernel("kd_small_select_scan"), 256,
               select_args + (split_leaf_ex,))
    else:
        launch("select_best_splits", _kernel("kd_select_splits"), n, select_args)
        split_leaf_ex = scan_inclusive_cuda(cp, split_leaf, "decide_leaves: scan")
    # -- classify_triangles (R9) and the routing flags of the events
    ref_class = cp.empty(num_refs, dtype=np.uint8)
    ref_lr = cp.empty(num_refs + 1, dtype=np.int64)
    event_lr = cp.empty(num_events + 1, dtype=np.int64)
    launch("classify_triangles", _kernel("kd_classify"), max(num_refs, num_events),
           (refs.ref_tri, refs.ref_node, events.event_ref, best.node_axis, best.node_pos,
            best.node_side, node_split, tri_lo, tri_hi, i64(num_refs), i64(num_events),
            ref_class, ref_lr, event_lr))
    # -- route_refs and route_events: where every copy goes
    totals = cp.empty(4, dtype=np.int64)
    if small:
        ref_lr_ex = cp.empty(num_refs + 1, dtype=np.int64)
        event_lr_ex = cp.empty(num_events + 1, dtype=np.int64)
        child_count = cp.empty(8 * n + 2, dtype=np.int64)
        child_offset = cp.empty(8 * n + 2, dtype=np.int64)
        child_ref_count, child_event_count = child_count[:2 * n + 1], child_count[2 * n + 1:]
        child_ref_offset = child_offset[:2 * n + 1]
        child_event_offset = child_offset[2 * n + 1:]
        launch("route", _kernel("kd_small_route"), 256,
               (nodes.node_ref_offset, ref_lr_ex, nodes.seg_event_offset, event_lr_ex,
                node_split, split_leaf_ex, i64(n), child_ref_count, child_event_count,
                ref_lr, i64(num_refs), ref_lr_ex, event_lr, i64(num_events), event_lr_ex,
                child_ref_offset, child_event_offset, totals))
    else:
        ref_lr_ex, event_lr_ex = scan_pair_cuda(cp, ref_lr, event_lr, "route: scans")
        child_count = cp.zeros(8 * n + 2, dtype=np.int64)
        child_ref_count, child_event_count = child_count[:2 * n + 1], child_count[2 * n + 1:]
        launch("route: child counts", _kernel("kd_child_counts"), 4 * n,
               (nodes.node_ref_offset, ref_lr_ex, nodes.seg_event_offset, event_lr_ex,
                node_split, split_leaf_ex, i64(n), child_ref_count, child_event_count))
        child_ref_offset, child_event_offset = scan_pair_cuda(
            cp, child_ref_count, child_event_count, "route: offset scans")
        launch("read_level_counts", _kernel("kd_level_totals"), 1,
               (split_leaf_ex, child_ref_offset, child_event_offset, i64(n), totals))
    with stage(xp=cp, description="read_level_counts"):
        # The one deliberate device-to-host read per level: sizes of the next level.
        num_split, num_child_refs, num_child_events, num_leaf_refs = (
            int(c) for c in totals.get())
    # -- emit_level (R10) and make_child_nodes
    out.reserve(level_base + n, leaf_ref_base + num_leaf_refs)
    child_lo = cp.empty((2 * num_split, 3), dtype=np.float32)
    child_hi = cp.empty((2 * num_split, 3), dtype=np.float32)
    launch("emit_level", _kernel("kd_emit_nodes"), n,
           (node_split, best.node_axis, best.node_pos, split_leaf_ex, nodes.node_lo,
            nodes.node_hi, i64(n), i64(level_base), i64(leaf_ref_base), *out.node,
            child_lo, child_hi))
    # -- split_refs and split_events (and the level's leaf lists)
    child_tri = cp.empty(num_child_refs, dtype=np.int32)
    child_node = cp.empty(num_child_refs, dtype=np.int32)
    ev_pos = cp.empty(num_child_events, dtype=enc.EVENT_POS_DTYPE)
    ev_kind = cp.empty(num_child_events, dtype=enc.EVENT_KIND_DTYPE)
    ev_ref = cp.empty(num_child_events, dtype=np.int32)
    ev_seg = cp.empty(num_child_events, dtype=np.int32)
    launch("split_refs_and_events", _kernel("kd_scatter"), max(num_refs, num_events),
           (refs.ref_tri, refs.ref_node, ref_class, ref_lr_ex, nodes.node_ref_offset,
            split_leaf_ex, child_ref_offset, events.event_pos, events.event_kind,
            events.event_ref, events.event_seg, event_lr_ex, nodes.seg_event_offset,
            child_event_offset, i64(n), i64(num_refs), i64(num_events), i64(leaf_ref_base),
            out.leaf, child_tri, child_node, ev_pos, ev_kind, ev_ref, ev_seg))
    # Both levels' arrays are alive here: the build's high-water mark.
    state.peak_bytes = max(state.peak_bytes, cp.get_default_memory_pool().used_bytes())
    state.level_base = level_base + n
    state.leaf_ref_base = leaf_ref_base + num_leaf_refs
    state.level = level + 1
    if num_split == 0:
        state.done = True
        return state
    state.events = EventSoA(ev_pos, ev_kind, ev_ref, ev_seg)
    state.refs = RefSoA(child_tri, child_node)
    state.nodes = NodeSoA(node_lo=child_lo, node_hi=child_hi,
                          node_ref_offset=child_ref_offset[:2 * num_split + 1],
                          seg_event_offset=child_event_offset[:6 * num_split + 1])
    return state


def _build_levels_cuda(cp, cfg, V, F, loop="grid"):
    """The level loop on the GPU, in the kernels of ``cuda/build_loop.cu``
    and ``cuda/build.cu``.

    Same stages, same rules and same outputs as :func:`_build_levels`, which
    is these kernels' NumPy twin (the GPU tests compare the two).

    ``loop="grid"`` runs levels of up to ``LOOP_MAX_EVENTS`` events in the
    level-loop kernel (:func:`build_levels_grid`: a few launches for all of
    them) where the device can run cooperative launches, and larger levels
    with one launch per stage (:func:`build_level_stages`), where the launch
    cost is small beside the work and kernels sized to the level move
    memory faster. ``loop="stages"`` runs every level with one launch per
    stage.

    Returns
    -------
    node_axis, node_split, node_child, node_count, leaf_tris : host arrays
    info : dict
        levels, level_sizes, level_loop ("grid" when the level-loop kernel
        ran, else "stages"), loop_launches, stage_levels (the levels run with
        one launch per stage), num_degenerate, bounds, peak_device_bytes.
    """
    pool = cp.get_default_memory_pool()
    peak = pool.used_bytes()
    with stage(xp=cp, description="prepare_mesh"):
        tri_lo, tri_hi, refs, nodes, bounds, planar, num_degenerate = prepare_mesh_cuda(cp, V, F)
    num_root = refs.size
    max_depth = cfg.resolved_max_depth(num_root)
    with stage(xp=cp, description="create_root_events"):
        events, _ = create_root_events_cuda(cp, tri_lo, tri_hi, refs.ref_tri, planar)
    state = _LoopState(events, refs, nodes)
    grid_loop = level_loop_kernel(cp) if loop == "grid" else None
    cap_tree = first_loop_capacity(events.size, num_root)[3]
    out = _OutputBuffers(cp, cap_tree, cap_tree)
    while not state.done:
        if grid_loop is not None and state.events.size <= LOOP_MAX_EVENTS:
            state = build_levels_grid(cp, cfg, tri_lo, tri_hi, state, out, max_depth, grid_loop)
            if state.done:
                break
            # The loop stopped at a level whose children are too large for it.
        state = build_level_stages(cp, cfg, tri_lo, tri_hi, state, out, max_depth)
    peak = max(peak, state.peak_bytes)
    with stage(xp=cp, description="download"):
        host = out.download(state.level_base, state.leaf_ref_base)
    info = {"levels": state.level, "level_sizes": state.level_sizes,
            "level_loop": "grid" if state.launches else "stages",
            "loop_launches": state.launches, "stage_levels": state.stage_levels,
            "bounds": bounds, "num_degenerate": num_degenerate, "peak_device_bytes": int(peak)}
    return host, info
