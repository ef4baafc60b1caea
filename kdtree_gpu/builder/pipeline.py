"""The level loop on ``xp`` arrays: the stage functions in the order of the method.

This is the NumPy pipeline (``kd.build(..., device="cpu", kernels="xp")``),
and on CuPy arrays the twin of the CUDA drivers in :mod:`kdtree_gpu.builder.gpu`
(``device="cuda", kernels="xp"``), which the GPU tests compare against.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import encoding as enc
from ..launch import stage
from ..primitives import exclusive_scan
from .soa import EventSoA, NodeSoA, RefSoA, TreeNodeSoA
from .clip import clip_straddling, reference_boxes
from .stages import (classify_triangles, compute_split_costs, create_root_events, decide_leaves,
                     emit_level, make_child_nodes, route_to_children, select_best_splits,
                     split_events, split_refs)


@dataclasses.dataclass
class XpLevel:
    """One level of the NumPy pipeline: its SoAs and where it sits in the tree."""

    events: EventSoA
    refs: RefSoA
    nodes: NodeSoA
    level: int = 0
    level_base: int = 0  # tree nodes written before it
    leaf_ref_base: int = 0  # leaf_tris entries written before it


def root_level_xp(xp, tri_lo_h, tri_hi_h, valid_h, bounds_h):
    """The root level (R1, R3) on ``xp`` arrays.

    Returns
    -------
    XpLevel
    tri_lo, tri_hi : (num_triangles, 3) float32 on ``xp``
    """
    ref_tri_h = np.flatnonzero(valid_h).astype(np.int32)
    num_root = int(ref_tri_h.shape[0])
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
    return XpLevel(events, refs, nodes), tri_lo, tri_hi


def run_level(xp, cfg, lvl: XpLevel, tri_lo, tri_hi, max_depth: int, mesh=None) -> dict:
    """Every stage of one level, in the order of the method.

    ``mesh`` is ``(vertices, faces)`` on ``xp``, needed with ``cfg.clip``.

    Returns
    -------
    dict
        Each stage's outputs by name (``event_cost``, ``event_side``, ``best``,
        ``node_split``, ``split_rank``, with clipping ``ref_lo`` and ``ref_hi``,
        ``ref_class``, ``ref_route``,
        ``event_route``, ``seg_child_left``, the four counts, ``level_arrays``),
        and ``next``: the next :class:`XpLevel`, or ``None`` when no node splits.
        The GPU tests compare these with the CUDA stages, stage by stage.
    """
    events, refs, nodes, level = lvl.events, lvl.refs, lvl.nodes, lvl.level
    n = nodes.size
    out = {}
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
        out["event_cost"], out["event_side"] = compute_split_costs(
            xp, events, nodes, node_active, node_axis_mask, cfg)
    with stage(xp=xp, description="select_best_splits"):
        best = out["best"] = select_best_splits(xp, events, nodes, out["event_cost"],
                                                out["event_side"])
    with stage(xp=xp, description="decide_leaves"):
        node_split = out["node_split"] = decide_leaves(xp, nodes, best, node_active, cfg)
        split_rank = out["split_rank"] = exclusive_scan(node_split, dtype=np.int64)
    with stage(xp=xp, description="classify_triangles"):
        if cfg.clip:
            # a reference's box in its node: its triangle's, clipped above (R2)
            ref_lo, ref_hi = out["ref_lo"], out["ref_hi"] = reference_boxes(xp, events,
                                                                           refs.size, n)
            ref_class = classify_triangles(xp, refs, best, node_split, ref_lo, ref_hi,
                                           per_reference=True)
        else:
            ref_class = classify_triangles(xp, refs, best, node_split, tri_lo, tri_hi)
        out["ref_class"] = ref_class
    with stage(xp=xp, description="route_refs"):
        # Child groups: 2 per splitting node; 2n is a bound that needs no sync.
        node_child_left = xp.where(node_split, 2 * split_rank[:-1], 2 * n)
        ref_route = out["ref_route"] = route_to_children(
            xp, (ref_class & enc.CLASS_LEFT) != 0, (ref_class & enc.CLASS_RIGHT) != 0,
            refs.ref_node, nodes.node_ref_offset, node_child_left, 2 * n)
    with stage(xp=xp, description="route_events"):
        event_class = ref_class[events.event_ref]
        if cfg.clip:
            # straddling references get new events in each child (clip_straddling)
            event_class = xp.where(event_class == enc.CLASS_BOTH, np.uint8(0), event_class)
        num_split_dev = split_rank[-1]
        seg = xp.arange(3 * n, dtype=np.int64)
        seg_node = seg % n
        seg_axis = seg // n
        # Child segment of (axis, node): axis * (2 * num_split) + 2 * rank(node).
        seg_child_left = out["seg_child_left"] = xp.where(
            node_split[seg_node], seg_axis * (2 * num_split_dev) + 2 * split_rank[:-1][seg_node],
            6 * n)
        event_route = out["event_route"] = route_to_children(
            xp, (event_class & enc.CLASS_LEFT) != 0, (event_class & enc.CLASS_RIGHT) != 0,
            events.event_seg, nodes.seg_event_offset, seg_child_left, 6 * n)
        leaf_count = (ref_class == 0).sum()
    with stage(xp=xp, description="read_level_counts"):
        # The one deliberate device-to-host read per level: sizes of the next level.
        counts = xp.stack([num_split_dev, ref_route.total, event_route.total,
                           leaf_count.astype(np.int64)])
        num_split, num_child_refs, num_child_events, num_leaf_refs = (
            int(c) for c in (counts.get() if xp is not np else counts))
        out.update(num_split=num_split, num_child_refs=num_child_refs,
                   num_child_events=num_child_events, num_leaf_refs=num_leaf_refs)
    with stage(xp=xp, description="emit_level"):
        out["level_arrays"] = emit_level(xp, nodes, node_split, best, split_rank, refs,
                                         ref_class, lvl.level_base, lvl.leaf_ref_base,
                                         num_leaf_refs)
    out["next"] = None
    if num_split == 0:
        return out
    with stage(xp=xp, description="split_refs"):
        child_refs = split_refs(xp, refs, ref_route, num_child_refs, split_rank)
    with stage(xp=xp, description="split_events"):
        child_events = split_events(xp, events, event_route, num_child_events, seg_child_left,
                                    ref_route)
    with stage(xp=xp, description="make_child_nodes"):
        child_lo, child_hi = make_child_nodes(xp, nodes, node_split, best, split_rank, num_split)
    seg_event_offset = event_route.child_offset[:6 * num_split + 1]
    if cfg.clip:
        with stage(xp=xp, description="clip_straddling"):
            child_events, seg_event_offset = clip_straddling(
                xp, mesh[0], mesh[1], refs, ref_lo, ref_hi, ref_class, ref_route, best, nodes,
                split_rank, seg_child_left, child_lo, child_hi, child_events, seg_event_offset,
                num_split)
    child_nodes = NodeSoA(node_lo=child_lo, node_hi=child_hi,
                          node_ref_offset=ref_route.child_offset[:2 * num_split + 1],
                          seg_event_offset=seg_event_offset)
    out["next"] = XpLevel(child_events, child_refs, child_nodes, level + 1,
                          lvl.level_base + n, lvl.leaf_ref_base + num_leaf_refs)
    return out


def build_levels_xp(xp, cfg, tri_lo_h, tri_hi_h, valid_h, bounds_h, mesh_h=None):
    """Run the stages level by level on ``xp`` arrays.

    Parameters
    ----------
    xp : module
        ``numpy`` or ``cupy``.
    cfg : SAHConfig
    tri_lo_h, tri_hi_h : (num_triangles, 3) float32 (host)
    valid_h : (num_triangles,) bool (host)
    bounds_h : (2, 3) float32 (host)
        From :func:`kdtree_gpu.mesh.prepare_mesh`.
    mesh_h : (vertices, faces), optional
        The prepared mesh (host), needed with ``cfg.clip``.

    Returns
    -------
    TreeNodeSoA
        The tree's node records (``xp`` arrays).
    leaf_tris : (num_leaf_refs,) int32
    levels : int
    level_sizes : list of (nodes, refs, events)
    """
    lvl, tri_lo, tri_hi = root_level_xp(xp, tri_lo_h, tri_hi_h, valid_h, bounds_h)
    max_depth = cfg.resolved_max_depth(lvl.refs.size)
    mesh = None
    if cfg.clip:
        with stage(xp=xp, description="upload"):
            mesh = tuple(xp.asarray(a) for a in mesh_h)
    parts = []
    level_sizes = []
    while lvl is not None:
        level_sizes.append((lvl.nodes.size, lvl.refs.size, lvl.events.size))
        result = run_level(xp, cfg, lvl, tri_lo, tri_hi, max_depth, mesh)
        parts.append(result["level_arrays"])
        levels = lvl.level + 1
        lvl = result["next"]
    with stage(xp=xp, description="concatenate_output"):
        result = [xp.concatenate(column) for column in zip(*parts)]
    return TreeNodeSoA(*result[:4]), result[4], levels, level_sizes
