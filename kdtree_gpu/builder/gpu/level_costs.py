"""The split-cost stages of a level run with one launch per stage (rules
R4-R8; the NumPy twins ``compute_split_costs`` and ``select_best_splits`` in
:mod:`kdtree_gpu.builder.stages`): the open/close scan, every candidate
plane's SAH cost, each segment's minimum and arg-min, and each node's best
plane. Small levels (below ``GpuSettings.small_level``) run the block-wide
kernels of ``cuda/build.cu``; the others cost their candidate planes only
(``cuda/cost_candidates.cu``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ... import encoding as enc
from ...compile_ahead import ModuleSpec
from ...kernels import get_function
from ...launch import launch
from ...primitives import inclusive_scan, tile_scan
from ..soa import BestSplit

i64, f64 = np.int64, np.float64


STAGE_SOURCE = "build.cu"  # the stages' module (and the root's: root.py, order.py)
CANDIDATE_SOURCE = "cost_candidates.cu"  # the candidate planes of the levels run by stages


def stage_kernel(name):
    """Kernel ``name`` of ``cuda/build.cu`` (the stages' module)."""
    return get_function(STAGE_SOURCE, name)


def _candidate_kernel(name):
    return get_function(CANDIDATE_SOURCE, name)


# what every build compiles (the root) and what a level run by stages adds
# (kdtree_gpu.compile_ahead.compile_modules)
STAGE_MODULE, CANDIDATE_MODULE = ModuleSpec(STAGE_SOURCE), ModuleSpec(CANDIDATE_SOURCE)


NULL = np.uint64(0)  # a null pointer argument


def or_null(a):
    """``a``, or a null pointer for ``None`` (an absent field: events without segments)."""
    return NULL if a is None else a


@dataclasses.dataclass
class OpenCloseScan:
    """The exclusive scan of a level's packed (opens, closes) counts (E + 1 items):
    small levels' whole (``ex``, int64; ``kd_small_event_scan``), the others'
    chunked by scan tiles (``kd_cost_prepass``): each item's counts since
    its tile began (``local``, 16 bits each) plus its tile's ``tile_prefix``
    (``KdPackedScan`` in ``cuda/scan.cuh``). The absent form's arrays are None.
    """

    ex: object = None
    local: object = None
    tile_prefix: object = None

    def args(self) -> tuple:
        """The cost pass's scan arguments: ``(ex,)`` (``kd_split_costs``), or
        ``(local, tile_prefix)`` (``kd_split_costs_candidates``)."""
        return (self.ex,) if self.ex is not None else (self.local, self.tile_prefix)

    def get(self):
        """The whole scan on the host (int64; the tests')."""
        if self.ex is not None:
            return self.ex.get()
        local = self.local.get().astype(np.int64)
        tile = np.repeat(self.tile_prefix.get(), enc.SCAN_TILE)[:local.size]
        return tile + ((local >> 16) << 32) + (local & 0xFFFF)


@dataclasses.dataclass
class SplitCosts:
    """What :func:`compute_split_costs_gpu` leaves for :func:`select_best_splits_gpu`.

    Attributes
    ----------
    open_close : OpenCloseScan
        Exclusive scan of the packed (opens, closes) counts.
    event_side : (E,) int8
    seg_argmin : (3n, 2) uint64
        Each segment's minimum cost bits and its lowest event index at that
        minimum (``encoding.INF_BITS``, ``encoding.NO_INDEX`` without a
        candidate), final when the cost pass ends (``KdSegArgmin``).
    event_cost : (2E,) uint32 or None
        Each event's float64 cost as two 32-bit halves (the high words, then
        the low words; :func:`event_costs` reads them back), only when asked
        for (``store_costs``: the tests compare them with the NumPy twin's).
    """

    open_close: OpenCloseScan
    event_side: object
    seg_argmin: object
    event_cost: object = None


def _cost_args(cfg, events, refs, nodes, open_close, level_active, event_cost, event_side,
               seg_argmin) -> tuple:
    """The arguments of ``kd_split_costs`` (``kd_split_costs_candidates``'s but their last,
    with a chunked scan); ``None`` arrays are null pointers (not stored)."""
    halves = _halves(event_cost)
    return (events.event_pos, or_null(events.event_seg), events.event_ref, refs.ref_node,
            *open_close.args(), nodes.seg_event_offset, nodes.node_ref_offset, nodes.node_lo,
            nodes.node_hi, i64(nodes.size), i64(events.size), i64(cfg.leaf_size),
            np.int32(level_active), np.int32(cfg.axes == "longest"), f64(cfg.k_traversal),
            f64(cfg.k_intersect), f64(cfg.empty_bonus), *map(or_null, halves),
            or_null(event_side), seg_argmin)


def compute_split_costs_gpu(cp, cfg, events, refs, nodes, level_active, small,
                            store_costs=False) -> SplitCosts:
    """R5-R7, and R8's arg-min: the cost of every candidate plane (``inf``
    elsewhere), each segment's minimum cost and its lowest event index at
    that minimum.

    The events' segments are read from ``events.event_seg``, or, where it is
    ``None`` (a level the level loop hands over; :func:`staged_segments`),
    derived from each event's place and its reference's node
    (``KdEventSegment``). No cost is stored (unless ``store_costs``): each
    warp of the pass finds the arg-min of the segments inside its 32 events
    (its 32 candidate planes, where the level is not ``small``), and the
    parts of the (at most two) segments that reach past them meet in their
    segments' pairs by 16-byte atomics (``kd_seg_argmin_lower``): the
    arg-mins are final when the pass ends. The open/close flags are
    derived from the kinds as their scan loads them.
    """
    n, num_events = nodes.size, events.size
    seg_argmin = cp.empty((3 * n, 2), dtype=np.uint64)
    kind, e = events.event_kind, i64(num_events)
    event_cost = cp.empty(2 * num_events, dtype=np.uint32) if store_costs else None
    event_side = cp.empty(num_events, dtype=np.int8)
    if small:
        open_close = OpenCloseScan(ex=cp.empty(num_events + 1, dtype=np.int64))
        launch("compute_split_costs: event scan", stage_kernel("kd_small_event_scan"),
               enc.SCAN_BLOCK, (kind, e, i64(3 * n), open_close.ex, seg_argmin))
        launch("compute_split_costs: costs", stage_kernel("kd_split_costs"), num_events,
               _cost_args(cfg, events, refs, nodes, open_close, level_active, event_cost,
                          event_side, seg_argmin))
        return SplitCosts(open_close, event_side, seg_argmin, event_cost)
    # The candidates only (cuda/cost_candidates.cu): a pass over the tiles
    # scans the open/close counts (stored chunked) and flags the candidate
    # planes, a mask per 32 events; the cost pass lists each tile's candidates
    # in shared memory and runs a lane each.
    local = cp.empty(num_events + 1, dtype=np.uint32)
    cand_mask = cp.empty(max(1, -(-num_events // 32)), dtype=np.uint32)  # (a mask a chunk)
    seg_range = cp.empty((3 * n, 2), dtype=np.float32)
    halves = _halves(event_cost)
    launch("compute_split_costs: segment ranges", _candidate_kernel("kd_segment_ranges"), 3 * n,
           (nodes.node_ref_offset, nodes.node_lo, nodes.node_hi, i64(n), i64(cfg.leaf_size),
            np.int32(level_active), np.int32(cfg.axes == "longest"), seg_range, seg_argmin))
    tile_prefix = tile_scan(
        cp, num_events + 1,
        (_candidate_kernel("kd_cost_prepass"),
         lambda tile: (kind, events.event_pos, or_null(events.event_seg), events.event_ref,
                       refs.ref_node, nodes.seg_event_offset, seg_range, i64(n), e, local, tile,
                       cand_mask, *map(or_null, halves))),
        None, "compute_split_costs: scan")
    open_close = OpenCloseScan(local=local, tile_prefix=tile_prefix)
    args = _cost_args(cfg, events, refs, nodes, open_close, level_active, event_cost,
                      event_side, seg_argmin)
    tiles = -(-num_events // enc.SCAN_TILE)
    launch("compute_split_costs: costs", _candidate_kernel("kd_split_costs_candidates"),
           tiles * enc.SCAN_BLOCK, (*args, cand_mask), block=enc.SCAN_BLOCK)
    return SplitCosts(open_close, event_side, seg_argmin, event_cost)


def _halves(event_cost) -> tuple:
    """The high and the low words of :func:`compute_split_costs_gpu`'s costs (views;
    ``(None, None)`` where they are not stored)."""
    if event_cost is None:
        return None, None
    num_events = event_cost.size // 2
    return event_cost[:num_events], event_cost[num_events:]


def event_costs(event_cost):
    """The float64 costs of :func:`compute_split_costs_gpu`'s halves (a new array)."""
    hi, lo = _halves(event_cost)
    return ((hi.astype(np.uint64) << np.uint64(32)) | lo).view(np.float64)


def select_best_splits_gpu(cp, cfg, events, nodes, costs, level_active, small, small_refs=0):
    """R8 and R4: each segment's lowest-index minimum, each node's best plane,
    whether it splits, and the scan of the (split, leaf references) pairs.

    Parameters
    ----------
    costs : SplitCosts
        From :func:`compute_split_costs_gpu` on the same level.
    small_refs : int
        A node to split of at most this many references is deferred
        (``kd_defer_small``): a leaf here, ``best.node_axis`` is
        ``encoding.SMALL_DEFERRED_AXIS``, its record is written by
        :func:`defer_records_gpu`. 0: none is.

    Returns
    -------
    best : BestSplit
    node_split : (n,) bool
    split_leaf_ex : (n + 1,) int64
        Inclusive scan of (split | leaf references << 32) after a leading 0.
    """
    n = nodes.size
    best = BestSplit(node_cost=cp.empty(n, dtype=np.float64),
                     node_axis=cp.empty(n, dtype=np.int8),
                     node_pos=cp.empty(n, dtype=np.float32),
                     node_side=cp.empty(n, dtype=np.int8))
    node_split = cp.empty(n, dtype=bool)
    split_leaf = cp.empty(n + 1, dtype=np.int64)
    # (the best events' costs are their segments' minima)
    select_args = (costs.seg_argmin, events.event_pos,
                   costs.event_side, nodes.node_ref_offset, i64(n), i64(cfg.leaf_size),
                   np.int32(level_active), f64(cfg.k_intersect), best.node_cost, best.node_axis,
                   best.node_pos, best.node_side, node_split, split_leaf, i64(small_refs))
    if small:
        split_leaf_ex = cp.empty(n + 1, dtype=np.int64)
        launch("select_best_splits", stage_kernel("kd_small_select_scan"), enc.SCAN_BLOCK,
               select_args + (split_leaf_ex,))
    else:
        launch("select_best_splits", stage_kernel("kd_select_splits"), n, select_args)
        split_leaf_ex = inclusive_scan(split_leaf, description="decide_leaves: scan")
    return best, node_split, split_leaf_ex
