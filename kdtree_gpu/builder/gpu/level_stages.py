"""One level with one launch per stage (the kernels of ``cuda/build.cu``; the
split-cost stages are :mod:`.level_costs`).

Used for levels too large for the level-loop kernel and on devices without
cooperative launch: one device-to-host read of four counts per level sizes
the next one, and every array has the level's exact size, except the
children's, which may be made at a guess before that read (the rows past the
counts unused; :func:`child_room`).

Each stage is a function of its own, named after its NumPy twin in
:mod:`kdtree_gpu.builder.stages` (the GPU tests call both on the same level
and compare their outputs); :func:`build_level_stages` runs them in order.
Levels below ``GpuSettings.small_level`` run the block-wide variants
(``kd_small_*``: one launch for the stages between two grid-wide
dependencies). Perfect splits (``SAHConfig(clip=True)``) of levels the
level-loop kernel leaves (with a child segment of more than
``GpuSettings.clip_segment`` new events, whose order a sort finds faster) run
the kernels of ``cuda/clip.cu`` (twins of :mod:`..clip`).
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from ... import encoding as enc
from ...compile_ahead import ModuleSpec
from ...kernels import get_function
from ...launch import launch, stage
from ...primitives import compact_indices, radix_sort, tile_scan
from ..soa import EventSoA, NodeSoA, RefSoA
from .level_costs import NULL, compute_split_costs_gpu, or_null, select_best_splits_gpu
from .level_costs import stage_kernel as _kernel
from .workspace import pooled

_CLIP_SOURCE = "clip.cu"
CLIP_MODULE = ModuleSpec(_CLIP_SOURCE)  # perfect splits' (compile_ahead.compile_modules)
i64, f64 = np.int64, np.float64


def _clip_kernel(name):
    return get_function(_CLIP_SOURCE, name)


def defer_records_gpu(cp, state, best, nodes, split_leaf_ex, level_base, leaf_ref_base):
    """The records of the nodes :func:`select_best_splits_gpu` deferred at this
    level, after ``state.num_deferred`` records (``state.deferred`` grows to
    hold one per node of the level: no count is read first).

    ``state.deferred`` lives across levels: made (or grown) inside the
    workspace's current context, the aside pool's for a large level.

    Returns
    -------
    (2,) int64 (device)
        This level's records and their references, read with the level's
        sizes (no read of its own: each read waits for the device).
    """
    need = state.num_deferred + nodes.size
    state.room_for_deferred(cp, need, max(need + need // 4, 1024))
    counts = cp.zeros(2, dtype=np.int64)
    launch("defer_records", _kernel("kd_defer_records"), nodes.size,
           (best.node_axis, nodes.node_ref_offset, split_leaf_ex, nodes.node_lo, nodes.node_hi,
            i64(nodes.size), i64(level_base), np.int32(state.level), i64(leaf_ref_base),
            i64(state.num_deferred), state.deferred, counts))
    return counts


def reference_boxes_gpu(cp, events, num_refs, num_nodes):
    """Each reference's box in its node, from its events (with clipping: R2).

    Returns
    -------
    ref_lo, ref_hi : (num_refs, 3) float32
    """
    ref_lo = cp.empty((num_refs, 3), dtype=np.float32)
    ref_hi = cp.empty((num_refs, 3), dtype=np.float32)
    launch("classify_triangles: reference boxes", _clip_kernel("kd_reference_boxes"),
           events.size, (events.struct(), i64(events.size), i64(num_nodes), ref_lo, ref_hi))
    return ref_lo, ref_hi


def classify_triangles_gpu(cp, refs, best, node_split, tri_lo, tri_hi, clip=False):
    """R9: the class of every reference (0 in a leaf). The references' and
    events' route flags come from it as :func:`route_to_children_gpu`'s scans
    load them.

    With ``clip``, ``tri_lo``/``tri_hi`` are the references' boxes
    (:func:`reference_boxes_gpu`) and a straddling reference's events route
    nowhere (:func:`clip_straddling_gpu` makes new ones).

    Returns
    -------
    ref_class : (R,) uint8
    """
    num_refs = refs.size
    ref_class = cp.empty(num_refs, dtype=np.uint8)
    launch("classify_triangles", _kernel("kd_classify"), max(num_refs, 1),
           (*refs.args(), best.node_axis, best.node_pos, best.node_side, node_split, tri_lo,
            tri_hi, i64(num_refs), ref_class, np.int32(clip)))
    return ref_class


@dataclasses.dataclass
class TiledEventScan:
    """The events' (left, right) scan of a large level, stored for no event.

    ``kd_event_lr_heads`` sums each tile of ``SCAN_TILE`` events and finds
    the scan before each warp's chunk of 32 events and before each
    segment's first event, within their tile; the scatter
    (``kd_scatter_chunks``) scans each chunk again. Storing the scan of every
    event took a third pass, 8 bytes an event written and read back.

    Attributes
    ----------
    tile_prefix : (tiles,) int64
        The scan before each tile of the E + 1 items (the events and their end).
    chunk_local : (chunks,) uint32
        The scan before each chunk within its tile (16-bit counts).
    seg_start : (3n,) int64
        The scan at the first event of each splitting node's segments.
    """

    tile_prefix: object
    chunk_local: object
    seg_start: object


def route_to_children_gpu(cp, nodes, node_split, split_leaf_ex, ref_class, events, clip, small):
    """Where every copy goes: the flag scans and the children's offsets, read off them.

    The flags are derived from ``ref_class`` as the scans load them
    (``KdLoadRefLR``, ``KdLoadEventLR`` in ``cuda/build_stages.cuh``): the
    packed (left, right) flags of each reference, and of each event from its
    reference's class (with ``clip``, none for a straddling reference's).

    Returns
    -------
    ref_lr_ex : (R + 1,) int64
    event_scan : (E + 1,) int64 (``small``), or TiledEventScan
        The events' exclusive scan, for :func:`split_refs_and_events_gpu`.
    child_ref_offset : (2n + 1,) int64
    child_event_offset : (6n + 1,) int64
    totals : (4,) int64
        Splitting nodes, child references, child events, leaf references.
    """
    n = nodes.size
    num_refs, num_events = int(ref_class.shape[0]), events.size
    r, e, event_ref, clip = i64(num_refs), i64(num_events), events.event_ref, np.int32(clip)
    totals = cp.empty(4, dtype=np.int64)
    ref_lr_ex = cp.empty(num_refs + 1, dtype=np.int64)
    # (the children's offsets are read off the flag scans: kd_child_offsets)
    child_offset = cp.empty(8 * n + 2, dtype=np.int64)
    child_ref_offset, child_event_offset = child_offset[:2 * n + 1], child_offset[2 * n + 1:]
    if small:
        event_lr_ex = cp.empty(num_events + 1, dtype=np.int64)
        launch("route", _kernel("kd_small_route"), enc.SCAN_BLOCK,
               (nodes.node_ref_offset, ref_lr_ex, nodes.seg_event_offset, event_lr_ex,
                node_split, split_leaf_ex, i64(n), child_ref_offset, child_event_offset,
                ref_class, r, ref_lr_ex, event_ref, clip, e, event_lr_ex, totals))
        event_scan = event_lr_ex
    else:
        tile_scan(cp, num_refs + 1,
                  (_kernel("kd_ref_lr_tile_sums"), lambda tile: (ref_class, r, tile)),
                  (_kernel("kd_ref_lr_tiles"), lambda tile: (ref_class, r, tile, ref_lr_ex)),
                  "route: reference scan")
        # The events' scan: the tiles' sums, and the scan before each chunk and
        # each segment's first event within their tile; then the tiles'
        # prefixes. The scatter scans each chunk again.
        head_local = cp.empty(3 * n + 1, dtype=np.uint32)
        chunk_local = cp.empty(-(-(num_events + 1) // 32), dtype=np.uint32)  # (a warp's)
        seg_start = cp.empty(3 * n, dtype=np.int64)
        tile_prefix = tile_scan(
            cp, num_events + 1,
            (_kernel("kd_event_lr_heads"),
             lambda tile: (event_ref, ref_class, clip, nodes.seg_event_offset, i64(n), e, tile,
                           chunk_local, head_local)),
            None, "route: event scan")
        event_scan = TiledEventScan(tile_prefix, chunk_local, seg_start)
        launch("route: child offsets", _kernel("kd_child_offsets_heads"), 6 * n + 1,
               (nodes.node_ref_offset, ref_lr_ex, nodes.seg_event_offset, NULL,
                node_split, split_leaf_ex, i64(n), child_ref_offset, child_event_offset,
                tile_prefix, head_local, seg_start, totals))
    return ref_lr_ex, event_scan, child_ref_offset, child_event_offset, totals


def emit_level_gpu(cp, nodes, node_split, best, split_leaf_ex, level_base, leaf_ref_base,
                   out):
    """R10 and make_child_nodes: the level's node records (into ``out``) and
    the children's boxes.

    Returns
    -------
    NodeSoA
        The children, boxes only (their offsets come from the routing), in
        rows for two per node: the first ``2 * num_split`` are written (the
        caller, who reads ``num_split`` later, cuts them out).
    """
    n = nodes.size
    child_nodes = NodeSoA.allocate(cp, 2 * n, node_ref_offset=0, seg_event_offset=0)
    launch("emit_level", _kernel("kd_emit_nodes"), n,
           (node_split, best.node_axis, best.node_pos, split_leaf_ex, nodes.node_lo,
            nodes.node_hi, i64(n), i64(level_base), i64(leaf_ref_base), *out.nodes.args(),
            child_nodes.node_lo, child_nodes.node_hi))
    return child_nodes


def child_arrays(cp, num_child_refs: int, num_child_events: int, segments: bool) -> tuple:
    """The (RefSoA, EventSoA) a level's scatter writes its children to, with rows for
    these counts (the read ones, or a guess made before the read: :func:`child_room`).
    The events store their segments with ``segments``: perfect splits (their
    kernels read them), or children run one launch per stage, whose cost pass
    and scatter then need no gather through the reference
    (:func:`staged_segments`); else ``event_seg`` is ``None`` (4 bytes per
    event less)."""
    return (RefSoA.allocate(cp, num_child_refs),
            EventSoA.allocate_level(cp, num_child_events, segments=segments))


def split_refs_and_events_gpu(cp, refs, events, nodes, ref_class, ref_lr_ex, event_scan,
                              split_leaf_ex, child_ref_offset, child_event_offset,
                              leaf_ref_base, leaf_tris, children, clip=False):
    """split_refs and split_events: stable compaction into the children (and
    the level's leaf lists into ``leaf_tris``), order kept, nothing re-sorted
    (with ``clip``, without the straddling references' events, into children
    that store their segments, which the clipping kernels read).
    ``event_scan`` is :func:`route_to_children_gpu`'s: with a
    :class:`TiledEventScan`, each warp scans its 32 events again.

    ``children``: the (RefSoA, EventSoA) to write (:func:`child_arrays`), at
    the counts or at a guess of them made before they were read; a copy
    bound past their rows is not written. ``leaf_tris`` must have room for
    the level's leaf entries.

    Returns
    -------
    RefSoA, EventSoA
        ``children``, written.
    """
    child_refs, child_events = children
    if clip and child_events.event_seg is None:
        raise ValueError("split_refs_and_events_gpu: with clip the children must store their "
                         "segments (child_arrays(..., segments=True))")
    if isinstance(event_scan, TiledEventScan):
        kernel = _kernel("kd_scatter_chunks")  # (each warp scans its events again)
        scan = (event_scan.tile_prefix, event_scan.chunk_local, event_scan.seg_start)
    else:
        kernel, scan = _kernel("kd_scatter"), (event_scan,)
    launch("split_refs_and_events", kernel, max(refs.size, events.size),
           (*refs.args(), ref_class, ref_lr_ex, nodes.node_ref_offset,
            split_leaf_ex, child_ref_offset, *map(or_null, events.args()), *scan,
            nodes.seg_event_offset, child_event_offset, i64(nodes.size), i64(refs.size),
            i64(events.size), i64(leaf_ref_base), leaf_tris, *child_refs.args(),
            *map(or_null, child_events.args()), np.int32(clip), i64(child_refs.size),
            i64(child_events.size)))
    return child_refs, child_events


# How much larger than the last level's growth the guess of the next level's
# counts is made (child_room): the share of the level's items.
CHILD_ROOM_MARGIN = 1 / 64


def child_room(growth, level: int, num_refs: int, num_events: int):
    """A guess of the children's references and events of a level, made before
    the level's counts are read (``None``: no guess), from the growth of the
    two levels before it (``growth``: level -> (child refs / refs, child events
    / events), of the levels run by stages), each grown as the last grew
    more than the one before, plus ``CHILD_ROOM_MARGIN``.

    The growth from one level to the next changes little and smoothly
    (armadillo: 1.0003 to 1.014 while the levels grow, then shrinking), and
    the workspace rounds blocks up to size classes 9% apart, so a guess a
    little above the last growth mostly costs no memory; one that falls short
    costs a second scatter (:func:`build_level_stages`).
    """
    last = growth.get(level - 1)
    if last is None:
        return None
    before = growth.get(level - 2, last)
    room = []
    for items, g, h in zip((num_refs, num_events), last, before):
        rate = g + max(0.0, g - h) + CHILD_ROOM_MARGIN
        room.append(min(2 * items, int(rate * items) + 64))
    return tuple(room)


def clip_straddling_gpu(cp, mesh, refs, ref_lo, ref_hi, ref_class, ref_lr_ex, nodes,
                        split_leaf_ex, child_ref_offset, child_nodes, kept, kept_offset,
                        num_split, lasting=contextlib.nullcontext):
    """Perfect splits: the straddling references' new events merged into the
    kept ones (:func:`kdtree_gpu.builder.clip.clip_straddling` on the GPU).

    One thread per copy clips it (``kd_clip_copies``, the reference's
    arithmetic); one key per event slot and one sort order the new events
    (``kd_clip_event_keys``); every event is then written at its place in
    the merged list (``kd_clip_place_new``, ``kd_clip_place_kept``): the
    twin's events and merge, fused. Reads the number of straddling
    references and of new events (two synchronizations). The merged events
    and their offsets are made inside ``lasting()`` (they outlive the level).

    Returns
    -------
    events : EventSoA
    seg_event_offset : (6 * num_split + 1,) int64
    """
    both = compact_indices(ref_class == enc.CLASS_BOTH)
    num_both = int(both.shape[0])
    if num_both == 0:
        return kept, kept_offset
    num_copies = 2 * num_both
    copy_lo = cp.empty((num_copies, 3), dtype=np.float32)
    copy_hi = cp.empty((num_copies, 3), dtype=np.float32)
    copy_ref = cp.empty(num_copies, dtype=np.int64)
    copy_seg = cp.empty((3, num_copies), dtype=np.int64)
    launch("clip_straddling: clip", _clip_kernel("kd_clip_copies"), num_copies,
           (*mesh, *refs.args(), ref_lo, ref_hi, both, i64(num_both), ref_lr_ex,
            nodes.node_ref_offset, split_leaf_ex, child_ref_offset, child_nodes.node_lo,
            child_nodes.node_hi, i64(nodes.size), copy_lo, copy_hi, copy_ref, copy_seg))
    keys = cp.empty(6 * num_copies, dtype=np.uint64)
    num_planar = cp.zeros(1, dtype=np.uint64)
    launch("clip_straddling: event keys", _clip_kernel("kd_clip_event_keys"), 3 * num_copies,
           (copy_lo, copy_hi, copy_seg, i64(num_copies), keys, num_planar))
    sorted_key, sorted_slot = radix_sort(keys, cp.arange(6 * num_copies, dtype=np.uint64))
    num_children = 2 * num_split
    child_ref_offset = child_ref_offset[:num_children + 1]
    kept_key = cp.empty(kept.size, dtype=np.uint64)
    launch("clip_straddling: kept keys", _clip_kernel("kd_clip_kept_keys"), kept.size,
           (kept.struct(), i64(kept.size), i64(num_children), child_ref_offset, kept_key))
    with stage(xp=cp, description="clip_straddling: count"):
        num_new = 6 * num_copies - int(num_planar.get()[0])
    num_segments = int(kept_offset.shape[0]) - 1
    with lasting():
        merged = EventSoA.allocate(cp, kept.size + num_new)
        offset = cp.empty(num_segments + 1, dtype=np.int64)
    place = cp.empty(num_new, dtype=np.int64)
    launch("clip_straddling: place new", _clip_kernel("kd_clip_place_new"), num_new,
           (sorted_slot, i64(num_new), i64(num_copies), copy_lo, copy_hi, copy_ref, copy_seg,
            kept_key, kept_offset, i64(num_children), child_ref_offset, place, merged.struct()))
    launch("clip_straddling: place kept", _clip_kernel("kd_clip_place_kept"),
           max(kept.size, num_segments + 1),
           (kept.struct(), i64(kept.size), place, sorted_key, i64(num_new), kept_offset,
            i64(num_segments), merged.struct(), offset))
    return merged, offset


def staged_segments(settings, num_events: int) -> bool:
    """Whether a level of ``num_events`` events stores its events' segments:
    where it will run one launch per stage (too large for the level loop, or
    no loop), 4 bytes an event that save its cost pass and scatter a gather
    each (``KdEventSegment``)."""
    return num_events > settings.loop_max_events or not settings.level_loop


def build_level_stages(cp, cfg, tri_lo, tri_hi, state, out, max_depth, settings, mesh=None):
    """Run one level from ``state`` with one launch per stage.

    Parameters
    ----------
    tri_lo, tri_hi : (num_triangles, 3) float32 (device)
    mesh : (vertices, faces) on the device, needed with ``cfg.clip``
    state : LoopState
    out : TreeOutput
    max_depth : int
    settings : GpuSettings

    Returns
    -------
    LoopState
        The next level, or done.
    """
    events, refs, nodes = state.events, state.refs, state.nodes
    n, num_refs, num_events = nodes.size, refs.size, events.size
    workspace = state.workspace
    # a large level's temporaries are made anew, its children in a pool of their own
    large = workspace.begin_level(num_events)
    level, level_base, leaf_ref_base = state.level, state.level_base, state.leaf_ref_base
    state.level_sizes.append((n, num_refs, num_events))
    state.stage_levels.append(level)
    level_active = level < max_depth
    small = max(num_events, num_refs, 8 * n + 2) < settings.small_level
    costs = compute_split_costs_gpu(cp, cfg, events, refs, nodes, level_active, small)
    best, node_split, split_leaf_ex = select_best_splits_gpu(cp, cfg, events, nodes, costs,
                                                             level_active, small, state.small_refs)
    # Each array is dropped after its last use, so that later stages reuse its memory.
    del costs
    children = workspace.aside if large else contextlib.nullcontext  # what outlives the level
    deferred = None
    if state.small_refs:
        # (the records outlive the build's levels: never the caller's pool)
        with workspace.aside() if large else pooled():
            deferred = defer_records_gpu(cp, state, best, nodes, split_leaf_ex, level_base,
                                         leaf_ref_base)
    box_lo, box_hi = tri_lo, tri_hi
    if cfg.clip:
        box_lo, box_hi = reference_boxes_gpu(cp, events, num_refs, n)
    ref_class = classify_triangles_gpu(cp, refs, best, node_split, box_lo, box_hi, cfg.clip)
    ref_lr_ex, event_scan, child_ref_offset, child_event_offset, totals = route_to_children_gpu(
        cp, nodes, node_split, split_leaf_ex, ref_class, events, cfg.clip, small)
    # The level's node records, its children's boxes and, where a guess of the
    # counts is made, the scatter need no count of the read below: queued
    # before it, they keep the GPU busy while the host reads (H100, armadillo
    # subdivided twice: 0.37 ms of idle GPU per level, 26 levels, when the
    # node records came after the read; then 0.2-1.8 ms from the read to the
    # scatter's launch, the children's arrays made in between). The tree's
    # room holds the level's nodes and its leaf entries (at most a reference
    # each), so that the scatter may write them before the read. (Growth by
    # doubling from nothing. A first room of two nodes and one leaf entry per
    # triangle made armadillo subdivided twice 10% faster, but its peak 418
    # bytes per triangle instead of 283, H100, when each growth gave the
    # pools' unused blocks back.)
    out.reserve(level_base + n, leaf_ref_base + num_refs, level_base, leaf_ref_base)
    with children():
        child_nodes = emit_level_gpu(cp, nodes, node_split, best, split_leaf_ex, level_base,
                                     leaf_ref_base, out)
    if deferred is not None:
        totals = cp.concatenate((totals, deferred))
    reader = workspace.count_read()
    reader.start(totals)  # (the one deliberate device-to-host read per level)
    scatter = (cp, refs, events, nodes, ref_class, ref_lr_ex, event_scan, split_leaf_ex,
               child_ref_offset, child_event_offset)
    guess = child_room(state.growth, level, num_refs, num_events)
    guessed = None
    if guess is not None:
        with children():
            guessed = child_arrays(cp, *guess, cfg.clip or staged_segments(settings, guess[1]))
            split_refs_and_events_gpu(*scatter, leaf_ref_base, out.leaf, guessed, cfg.clip)
    with stage(xp=cp, description="read_level_counts"):
        counts = reader.result()
    num_split, num_child_refs, num_child_events, num_leaf_refs = counts[:4]
    if deferred is not None:
        state.num_deferred += counts[4]
        state.deferred_refs += counts[5]
    state.growth[level] = (num_child_refs / max(num_refs, 1), num_child_events / max(num_events, 1))
    segments = staged_segments(settings, num_child_events)
    if guessed is not None and not (
            num_child_refs <= guess[0] and num_child_events <= guess[1]
            and (guessed[1].event_seg is not None) == (cfg.clip or segments)):
        guessed = None  # (short, or the wrong arrays: launched again at the counts)
        state.scatter_relaunches += 1
    child_nodes = child_nodes.prefix(2 * num_split)  # (the boxes of the split nodes' children)
    with children():
        if guessed is not None:
            child_refs = guessed[0].prefix(num_child_refs)
            child_events = guessed[1].prefix(num_child_events)
        else:
            child_refs, child_events = split_refs_and_events_gpu(
                *scatter, leaf_ref_base, out.leaf,
                child_arrays(cp, num_child_refs, num_child_events, cfg.clip or segments), cfg.clip)
        del guessed
        node_ref_offset = child_ref_offset[:2 * num_split + 1]
        seg_event_offset = child_event_offset[:6 * num_split + 1]
        if large:  # (the route's arrays are temporaries)
            node_ref_offset, seg_event_offset = node_ref_offset.copy(), seg_event_offset.copy()
    if cfg.clip and num_split:
        child_events, seg_event_offset = clip_straddling_gpu(
            cp, mesh, refs, box_lo, box_hi, ref_class, ref_lr_ex, nodes, split_leaf_ex,
            child_ref_offset, child_nodes, child_events, seg_event_offset, num_split,
            lasting=children)
    # Both levels' arrays are alive here: the build's high-water mark.
    workspace.sample()
    state.level_base = level_base + n
    state.leaf_ref_base = leaf_ref_base + num_leaf_refs
    state.level = level + 1
    if num_split == 0:
        state.done = True
        return state
    child_nodes.node_ref_offset = node_ref_offset
    child_nodes.seg_event_offset = seg_event_offset
    state.events, state.refs, state.nodes = child_events, child_refs, child_nodes
    return state
