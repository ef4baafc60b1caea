"""The builder's structures of arrays and kernel argument structs, declared once.

Layout of a level (the method of GAPT part 11, section 11.2, made exact)
------------------------------------------------------------------------
* Events of all nodes and all three axes in one :class:`EventSoA`, ordered
  by segment, then position, kind and reference. A segment is one (axis,
  node) pair: ``seg = axis * n + node`` for the ``n`` nodes of the level.
* Triangle references (node-triangle pairs) in one :class:`RefSoA`, ordered
  by node, then triangle index.
* Node boxes and offsets in one :class:`NodeSoA`.

Each SoA has a C twin (``c_name``) generated from the same declaration
(:func:`kdtree_gpu.soa.cuda_struct`): the level-loop kernel takes its
levels, scratch arrays and outputs as these structs, and its sizes and
settings as the scalar structs below, instead of a long list of parameters
that would have to match by position.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .. import encoding as enc
from ..soa import ScalarStruct, SoA, scalar_field, soa_field


@dataclasses.dataclass
class EventSoA(SoA):
    """Events of all nodes of a level, all three axes in one array.

    Attributes
    ----------
    event_pos : (num_events,) float32
    event_kind : (num_events,) int8
        ``EVENT_END < EVENT_PLANAR < EVENT_START``.
    event_ref : (num_events,) int32
        Index of the event's triangle reference in the level's ``RefSoA``.
    event_seg : (num_events,) int32
        ``axis * num_nodes + node``; events are sorted by segment first. The
        level loop's buffers hold none (0 rows), nor do the levels it hands
        to the per-stage path (``None``; that path stores them for the
        levels it runs itself, :func:`.gpu.level_stages.staged_segments`):
        the segment then follows from the event's place and its reference
        (:func:`.stages.event_segments`).
    """

    c_name = "KdEvents"

    event_pos: object = soa_field(enc.EVENT_POS_DTYPE)
    event_kind: object = soa_field(enc.EVENT_KIND_DTYPE)
    event_ref: object = soa_field(enc.EVENT_TRI_DTYPE)
    event_seg: object = soa_field(np.int32)

    @classmethod
    def allocate_level(cls, xp, n: int, segments: bool = True) -> "EventSoA":
        """A level's events (uninitialized); without ``segments``, ``event_seg`` is
        ``None``: the kernels derive each event's segment (``KdEventSegment``)."""
        events = cls.allocate(xp, n, **({} if segments else {"event_seg": 0}))
        if not segments:
            events.event_seg = None
        return events


@dataclasses.dataclass
class RefSoA(SoA):
    """Triangle references (node-triangle pairs) of a level, sorted by node.

    Attributes
    ----------
    ref_tri : (num_refs,) int32
        Triangle index into the mesh.
    ref_node : (num_refs,) int32
        Node (within the level) holding the reference.
    """

    c_name = "KdRefs"

    ref_tri: object = soa_field(np.int32)
    ref_node: object = soa_field(np.int32)


@dataclasses.dataclass
class NodeSoA(SoA):
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

    c_name = "KdNodes"

    node_lo: object = soa_field(np.float32, width=3)
    node_hi: object = soa_field(np.float32, width=3)
    node_ref_offset: object = soa_field(np.int64, extra=1)
    seg_event_offset: object = soa_field(np.int64, scale=3, extra=1)


@dataclasses.dataclass
class TreeNodeSoA(SoA):
    """The tree's node records as the builder writes them (see :class:`kdtree_gpu.KdTree`).

    Attributes
    ----------
    node_axis : (num_nodes,) int8
    node_split : (num_nodes,) float32
    node_child : (num_nodes,) int32
    node_count : (num_nodes,) int32
    """

    c_name = "KdTreeNodes"

    node_axis: object = soa_field(enc.NODE_AXIS_DTYPE)
    node_split: object = soa_field(enc.NODE_SPLIT_DTYPE)
    node_child: object = soa_field(enc.NODE_CHILD_DTYPE)
    node_count: object = soa_field(enc.NODE_COUNT_DTYPE)


@dataclasses.dataclass
class LevelScratch(SoA):
    """Per-level work arrays of the GPU stages, sized by level capacities.

    Rows: ``E`` events, ``R`` references, ``N`` nodes of the level (see
    :meth:`capacity_rows`). The stage functions of ``cuda/build_stages.cuh``
    name them the same way.
    """

    c_name = "KdLevelScratch"

    # (E + 1) one buffer, two lifetimes that do not overlap: the packed
    # (opens, closes) scan of the split search (read by the cost pass only),
    # then the scan of the events' (left, right) flags (routing, scatter).
    # Both flag scans are stored chunked (KdPackedScan in cuda/scan.cuh: 16-bit
    # counts since the start of a block's chunk, the chunks' bases in the
    # kernel's block sums), as is ref_lr_ex.
    event_scan: object = soa_field(np.uint32)
    # (the events' sides have no rows here: the level loop keeps them in the
    # next level's slot of the events; it stores no cost)
    # (6N) each segment's minimum cost bits and lowest event index at it, one
    # 16-byte pair a segment (KdSegArgmin in cuda/split_costs.cuh; its 16-byte
    # compare-and-swap needs the row aligned, as every array cut from a block is)
    seg_argmin: object = soa_field(np.uint64)
    best_cost: object = soa_field(np.float64)  # (N)
    best_axis: object = soa_field(np.int8)  # (N)
    best_pos: object = soa_field(np.float32)  # (N)
    best_side: object = soa_field(np.int8)  # (N)
    node_split: object = soa_field(np.bool_)  # (N)
    split_leaf: object = soa_field(np.int64)  # (N + 1) packed (split, leaf refs)
    split_leaf_ex: object = soa_field(np.int64)  # (N + 1) its scan
    ref_class: object = soa_field(np.uint8)  # (R)
    ref_lr_ex: object = soa_field(np.uint32)  # (R + 1) scan of the (left, right) flags
    # Perfect splits in the level loop (no rows without clipping; C new events):
    # (without them the children's offsets are read off the flag scans:
    # kd_child_offsets in cuda/build_stages.cuh)
    child_count: object = soa_field(np.int64)  # (8N + 2) child group sizes
    ref_lo: object = soa_field(np.float32)  # (3R) each reference's box in its node
    ref_hi: object = soa_field(np.float32)  # (3R)
    copy_lo: object = soa_field(np.float32)  # (6R) box of reference r's copy in child side:
    copy_hi: object = soa_field(np.float32)  # (6R) rows 2r + side
    new_count: object = soa_field(np.int64)  # (6N + 1) new events per child segment
    new_offset: object = soa_field(np.int64)  # (6N + 1) their scan
    new_cursor: object = soa_field(np.int32)  # (6N) places taken in each segment's list
    new_key: object = soa_field(np.uint64)  # (C) new events, listed by child segment
    new_rank: object = soa_field(np.int32)  # (C) kept events before each, in key order

    @staticmethod
    def capacity_rows(cap_events: int, cap_refs: int, cap_nodes: int,
                      cap_new: int = 0) -> dict:
        """Rows of each field for levels of up to these many events, references and
        nodes, and (perfect splits: ``cap_new`` > 0) new events."""
        e, r, n = cap_events, cap_refs, cap_nodes
        c = 1 if cap_new else 0  # the clipping rows
        return {"event_scan": e + 1, "seg_argmin": 6 * n,
                "best_cost": n, "best_axis": n, "best_pos": n,
                "best_side": n, "node_split": n, "split_leaf": n + 1, "split_leaf_ex": n + 1,
                "ref_class": r, "ref_lr_ex": r + 1, "child_count": c * (8 * n + 2),
                "ref_lo": c * 3 * r, "ref_hi": c * 3 * r, "copy_lo": c * 6 * r,
                "copy_hi": c * 6 * r, "new_count": c * (6 * n + 1),
                "new_offset": c * (6 * n + 1), "new_cursor": c * 6 * n, "new_key": cap_new,
                "new_rank": cap_new}


@dataclasses.dataclass
class BestSplit:
    """Per-node outcome of the split search (the NumPy pipeline's view of it).

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


# --- scalar structs of the level-loop kernel -------------------------------------
@dataclasses.dataclass
class LevelSizes(ScalarStruct):
    """Where a level stands: its sizes and what the tree holds before it."""

    c_name = "KdLevelSizes"

    num_nodes: int = scalar_field(np.int64)
    num_refs: int = scalar_field(np.int64)
    num_events: int = scalar_field(np.int64)
    level: int = scalar_field(np.int64)
    level_base: int = scalar_field(np.int64)  # tree nodes written before the level
    leaf_ref_base: int = scalar_field(np.int64)  # leaf_tris entries written before it
    # the loop buffers' slot that holds the level (-1: neither; its arrays are apart)
    slot: int = scalar_field(np.int64, -1)


@dataclasses.dataclass
class LoopCapacity(ScalarStruct):
    """Rows of the level buffers (per slot) and of the tree output."""

    c_name = "KdLoopCapacity"

    events: int = scalar_field(np.int64)
    refs: int = scalar_field(np.int64)
    nodes: int = scalar_field(np.int64)
    tree_nodes: int = scalar_field(np.int64)
    leaf_refs: int = scalar_field(np.int64)
    deferred: int = scalar_field(np.int64)  # records of deferred small nodes
    new_events: int = scalar_field(np.int64)  # new events of clipped references per level


@dataclasses.dataclass
class LoopSettings(ScalarStruct):
    """The build settings the level-loop kernel reads (from ``SAHConfig``)."""

    c_name = "KdLoopSettings"

    max_level_events: int = scalar_field(np.int64)  # larger levels go back to the host
    max_depth: int = scalar_field(np.int64)
    leaf_size: int = scalar_field(np.int64)
    longest_only: int = scalar_field(np.int32)
    k_traversal: float = scalar_field(np.float64)
    k_intersect: float = scalar_field(np.float64)
    empty_bonus: float = scalar_field(np.float64)
    # nodes to split with at most this many references are deferred (0: none)
    small_refs: int = scalar_field(np.int64)
    # with clip (the kernel kd_build_levels_grid_clip): a level whose child segment
    # would get more new events goes back to the host (its merge costs the
    # square of that count in the loop)
    clip_segment: int = scalar_field(np.int64)

    @staticmethod
    def for_build(cfg, max_depth: int, small_refs: int, max_level_events: int = 0,
                  clip_segment: int = 0):
        """The kernel argument for a build under ``cfg`` (``SAHConfig``); made
        once per distinct set of values (a build launches with the same few)."""
        return _loop_settings(max_level_events=int(max_level_events), max_depth=int(max_depth),
                              leaf_size=cfg.leaf_size, longest_only=int(cfg.axes == "longest"),
                              k_traversal=cfg.k_traversal,
                              k_intersect=cfg.k_intersect, empty_bonus=cfg.empty_bonus,
                              small_refs=int(small_refs), clip_segment=int(clip_segment))


@functools.lru_cache(maxsize=256)
def _loop_settings(**values):
    return LoopSettings(**values).struct()  # shared by every launch with these values


# Every struct the CUDA sources see, in dependency order (kdtree_gpu.kernels
# renders them into the generated preamble).
CUDA_STRUCTS = (EventSoA, RefSoA, NodeSoA, TreeNodeSoA, LevelScratch, LevelSizes, LoopCapacity,
                LoopSettings)
