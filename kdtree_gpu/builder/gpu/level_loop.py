"""Levels in one cooperative launch: the level-loop kernel (``cuda/build_loop.cu``).

One launch per stage costs the host a launch, allocations and, per level, a
read of the next level's sizes: small and mid-size builds are bound by that
host work. The kernel ``kd_build_levels_grid`` calls the same stage
functions (``cuda/build_stages.cuh``) level after level, with a grid barrier
between stages and every size kept on the device: one launch and one read
for all the levels that fit in its buffers.
"""

from __future__ import annotations

import functools

import numpy as np

from ... import encoding as enc
from ...compile_ahead import ModuleSpec
from ...kernels import cooperative_function
from ...launch import launch, stage
from ..settings import widest_level
from ..soa import (EventSoA, LevelScratch, LevelSizes, LoopCapacity, LoopSettings, NodeSoA,
                   RefSoA)
from .workspace import BlockLayout, arrays_in_one_block, pooled


# The level loop's entry points, (module, kernel) by (perfect splits, one block
# a multiprocessor): a module each, so that a machine's first build compiles
# only the loop it runs (H200, NVRTC: build_loop.cu with both of its
# two-block loops took 10.1 s).
LOOP_ENTRIES = {(False, False): ("build_loop.cu", "kd_build_levels_grid"),
                (False, True): ("build_loop_one_block.cu", "kd_build_levels_grid_one_block"),
                (True, False): ("build_loop_clip.cu", "kd_build_levels_grid_clip")}


def loop_module(clip: bool = False, one_block: bool = False) -> ModuleSpec:
    """The module of :func:`level_loop_kernel`'s kernel
    (:func:`kdtree_gpu.compile_ahead.compile_modules`)."""
    return ModuleSpec(LOOP_ENTRIES[bool(clip), bool(one_block) and not clip][0], cooperative=True)


def level_loop_kernel(cp, clip: bool = False, one_block: bool = False):
    """The level-loop kernel and its cooperative grid on the current device.

    Parameters
    ----------
    clip : bool
        Perfect splits: ``kd_build_levels_grid_clip`` (a module of its own).
    one_block : bool
        Without perfect splits, the kernel of one block a multiprocessor
        (``kd_build_levels_grid_one_block``: 128 registers and no spills,
        faster on levels of up to about a million events); else two
        (``kd_build_levels_grid``, 64 registers).

    Returns
    -------
    (cupy.RawKernel, int) or None
        The kernel and the number of blocks that are resident at once
        (blocks per multiprocessor times multiprocessors), or ``None`` when
        the device cannot run cooperative launches.
    """
    source, name = LOOP_ENTRIES[bool(clip), bool(one_block) and not clip]
    return cooperative_function(source, name, enc.LOOP_BLOCK)


# The auto grid gives each thread about this many events of the widest level
# a launch can expect (settings.widest_level: 3.5x its start level's) per pass.
# Measured on an H200 (loop kernel alone, blocks 1 to 264): suzanne (5.8k root
# events) 2.78 ms with 1 block, 1.06 with 8, 0.91 with 32-64, 1.13 with all
# 264; cornell_box (216) 0.37 ms with 1-132 blocks, 0.46 with 264; the bunny
# and larger are fastest with every block. One event per thread picks 40
# blocks for suzanne and 2 for the Cornell box.
LOOP_EVENTS_PER_THREAD = 1


def loop_grid(num_events: int, resident: int, settings, max_items: int = 0) -> int:
    """Blocks of a level-loop launch that starts at a level of ``num_events`` events.

    Each of a level's stages ends at a grid barrier whose cost grows with
    the blocks; a pass over a level's events costs a memory round trip per
    grid-strided step. A small mesh's levels are mostly barriers, so it gets
    few blocks; a mesh whose widest level fills every resident block's
    threads ``LOOP_EVENTS_PER_THREAD`` times gets them all.
    ``settings.loop_blocks`` > 0 chooses the number (at most ``resident``).
    Either way, the grid has at least enough blocks that each block's chunk
    of a scan of ``max_items`` (the buffers' capacity plus one) holds at most
    ``encoding.SCAN_CHUNK_MAX`` items, as the kernel's chunked scans need
    (:func:`loop_plan` keeps the capacities within the resident blocks' reach).
    The tree does not depend on the grid: every scan and reduction of the
    kernel is over integers or an exact minimum.
    """
    if settings.loop_blocks:
        grid = settings.loop_blocks
    else:
        widest = widest_level(num_events)
        grid = -(-widest // (enc.LOOP_BLOCK * LOOP_EVENTS_PER_THREAD))
    return max(1, min(resident, max(grid, -(-max_items // enc.SCAN_CHUNK_MAX))))


@functools.lru_cache(maxsize=64)
def _buffer_layout(cap_events: int, cap_refs: int, cap_nodes: int, cap_new: int) -> BlockLayout:
    # children of a level are routed into offsets of 2n + 1 and 6n + 1 groups
    node_rows = {"node_ref_offset": 2 * (2 * cap_nodes + 1),
                 "seg_event_offset": 2 * (6 * cap_nodes + 1)}
    scratch_rows = LevelScratch.capacity_rows(cap_events, cap_refs, cap_nodes, cap_new)
    # no event_seg rows: the kernel derives an event's segment (KdEventSegment)
    return BlockLayout([(EventSoA, EventSoA.shapes(2 * cap_events, event_seg=0)),
                        (RefSoA, RefSoA.shapes(2 * cap_refs)),
                        (NodeSoA, NodeSoA.shapes(2 * cap_nodes, **node_rows)),
                        (LevelScratch, LevelScratch.shapes(0, **scratch_rows))])


class LevelBuffers:
    """Two levels (ping-pong: slot ``s`` of an array starts at ``s`` times its
    capacity) and the per-level scratch of the level-loop kernel, in one
    device block (:class:`.workspace.BlockLayout`): one allocation, and one
    block given back when the loop outgrows it. The kernel gets the four
    structs straight from the block's address (a small build's host time
    is mostly such bookkeeping); array views are made only on request."""

    def __init__(self, cp, cap_events: int, cap_refs: int, cap_nodes: int, cap_new: int = 0):
        self.cap_events, self.cap_refs, self.cap_nodes = cap_events, cap_refs, cap_nodes
        self.block = _buffer_layout(cap_events, cap_refs, cap_nodes, cap_new).allocate(cp)

    def structs(self) -> tuple:
        """The kernel structs of the events, references, nodes and scratch."""
        return tuple(self.block.struct(i) for i in range(4))

    # views of the block's four structures (EventSoA, RefSoA, NodeSoA, LevelScratch)
    events = property(lambda self: self.block.soa(0))
    refs = property(lambda self: self.block.soa(1))
    nodes = property(lambda self: self.block.soa(2))
    scratch = property(lambda self: self.block.soa(3))

    def level(self, slot: int, n: int, num_refs: int, num_events: int):
        """Views of the level held in ``slot``: ``(EventSoA, RefSoA, NodeSoA)``; the
        events' ``event_seg`` is None (the buffers hold none: :func:`copied_level`)."""
        e0, r0, n0 = slot * self.cap_events, slot * self.cap_refs, slot * self.cap_nodes
        ro, so = slot * (2 * self.cap_nodes + 1), slot * (6 * self.cap_nodes + 1)
        ev, rf, nd = self.events, self.refs, self.nodes
        return (EventSoA(*(a[e0:e0 + num_events] for a in ev.args()[:3]), None),
                RefSoA(*(a[r0:r0 + num_refs] for a in rf.args())),
                NodeSoA(nd.node_lo[n0:n0 + n], nd.node_hi[n0:n0 + n],
                        nd.node_ref_offset[ro:ro + n + 1], nd.seg_event_offset[so:so + 3 * n + 1]))


# The first buffers of a loop that starts from a level handed over by the stages
# with fewer events than its parent, with deferral: that many eighths of the start
# level. Deep in the tree, deferral empties the loop's levels (armadillo subdivided
# once, H100: the stages hand over level 29, 7.3M events after 8.9M, and the loop
# splits no node of it: buffers for 1.5 times it were the build's peak, 306 of its
# 579 bytes per triangle; 552 with these). A level that outgrows them starts a
# launch with larger ones.
SHRINKING_EIGHTHS = 9

# The fewest events a loop buffer holds: a chunk of 32, the cost pass's unit
# (the default capacities add thousands; a capacity callable may give a
# level's own size).
LOOP_MIN_EVENTS = 32


def loop_plan(cfg, settings, num_events: int, num_refs: int, num_nodes: int,
              resident: int = 0, parent_events: int = 0):
    """How the level loop runs from a start level of these sizes, in launches of
    at most ``resident`` blocks (0: any number); ``parent_events``: the events
    of the level before it (run by stages), 0 for the root. A start level with
    fewer events than its parent gets buffers for
    ``SHRINKING_EIGHTHS / 8`` of it (with deferral).

    Returns
    -------
    (max_events, small, capacities) or None
        The most events a level of the loop may hold, the deferral bound
        ``small_refs`` (0: none), and the first buffers' ``(cap_events,
        cap_refs, cap_nodes, cap_new, (tree nodes, leaf entries))``; None when the level is
        for the per-stage path: more events than ``settings.loop_max_events``,
        than the resident blocks' scan chunks hold, or, with perfect splits,
        than a new event's key can number. ``max_events`` is the stay bound
        (``settings.loop_stay_bound()``) within the same limits.
    """
    # (a start level within the entry bound; its children within the stay bound)
    max_events = settings.loop_stay_bound()
    if resident:
        # the kernel's scans of a level's events (one more item than events)
        # are cut into one chunk per block, each within SCAN_CHUNK_MAX items
        max_events = min(max_events, resident * enc.SCAN_CHUNK_MAX - 1)
    if cfg.clip:
        # a new event's key holds its reference's index below 2**CLIP_KIND_SHIFT,
        # and a level has at most a third as many references as events
        max_events = min(max_events, 3 << enc.CLIP_KIND_SHIFT)
    if num_events > min(max_events, settings.loop_max_events):
        return None
    # the small-node kernel does not clip: with clip=True no node is deferred
    small = 0 if cfg.clip else settings.small_refs_for(num_refs)
    cap_e, cap_r, cap_n, cap_tree = settings.loop_capacities(num_events, num_refs, small)
    if not isinstance(cap_tree, tuple):
        cap_tree = (cap_tree, cap_tree)
    if small and num_events < parent_events:
        cap_e = min(cap_e, SHRINKING_EIGHTHS * num_events // 8 + 4096)
        cap_r = min(cap_r, SHRINKING_EIGHTHS * num_refs // 8 + 1024)
    cap_e = max(num_events, min(cap_e, max_events), LOOP_MIN_EVENTS)
    cap_r = max(num_refs, min(cap_r, max_events // 3 + 1))
    cap_n = max(num_nodes, cap_n)
    # new events of clipped references (measured with the NumPy pipeline: up to
    # 31% of a level's kept events on suzanne, 35% on the bunny)
    cap_new = cap_e // 2 + 1024 if cfg.clip else 0
    return max_events, small, (cap_e, cap_r, cap_n, cap_new, cap_tree)


def every_node_small(cp, nodes, small_refs: int) -> bool:
    """Whether every node of a level holds at most ``small_refs`` references
    (one read; False when ``small_refs`` is 0)."""
    if not small_refs or nodes.size == 0:
        return False
    offsets = nodes.node_ref_offset
    return int((offsets[1:] - offsets[:-1]).max()) <= small_refs


def restart_capacity(need: int, fresh: int, limit: int = 0) -> int:
    """Rows of a buffer of a loop launched again from a level that needs ``need``.

    What a loop started from that level would get (``fresh``, the first
    buffers' policy), at least the need and at most twice it (the policy
    before: twice the need, which made the second block the peak of a
    1.38M-triangle build on an H100, 680 of its 1,089 bytes per triangle).
    """
    cap = max(need, min(2 * need, fresh))
    return min(cap, limit) if limit else cap


# the loop buffers' slot the root events are decoded into (root_loop_buffers'
# free part is the other slot's event_ref rows onwards: the first slot)
ROOT_SLOT = 0


def root_loop_buffers(cp, cfg, settings, num_events: int, num_refs: int, resident: int):
    """The level loop's first buffers, made before the root events exist, so that
    they are decoded straight into its first slot (the first level writes
    its children to the second) rather than into arrays of their own beside
    it (measured on an H100: 78 bytes per triangle of the bunny's peak).

    Returns
    -------
    (LevelBuffers, EventSoA, (MemoryPointer, int)) or None
        The buffers, the views the root events go to and the part of the
        buffers from the second slot's event references on (that slot,
        references, nodes, scratch: unused until the loop runs), where the
        root's keys and its sort's temporaries fit (with the root in the
        second slot, the free part after it held the keys but not the sort's
        buffer: 49 bytes per triangle of the bunny's, happy Buddha's and
        conference's peaks stayed cached in the caller's pool, H100); None
        when the loop will not run from the root.
    """
    plan = loop_plan(cfg, settings, num_events, num_refs, 1, resident)
    if plan is None:
        return None
    buffers = LevelBuffers(cp, *plan[2][:4])
    events = buffers.level(ROOT_SLOT, 1, num_refs, num_events)[0]
    # Each event field holds both slots (pos, kind, ref, in that order): with
    # the root in the first, the second slot's event_ref rows are the first
    # free bytes with nothing in use after them.
    fields = EventSoA.shapes(1)
    ref_field = list(fields).index("event_ref")
    second_slot = buffers.cap_events * np.dtype(fields["event_ref"][1]).itemsize
    return buffers, events, buffers.block.tail(0, ref_field, second_slot)


def copied_level(cp, events, refs, nodes, segments: bool = False):
    """A copy of a level whose events live in the loop's buffers (no ``event_seg``),
    as the per-stage path reads it: with ``segments`` (perfect splits: the
    clipping kernels read them), each event's segment
    (:func:`..stages.event_segments`)."""
    from ..stages import event_segments

    refs = RefSoA(*(a.copy() for a in refs.args()))
    nodes = NodeSoA(*(a.copy() for a in nodes.args()))
    seg = None
    if segments:
        seg = event_segments(cp, events.event_ref, refs.ref_node, nodes.seg_event_offset,
                             nodes.size)
    return EventSoA(*(a.copy() for a in events.args()[:3]), seg), refs, nodes


def moved_aside(cp, workspace, events, refs, nodes):
    """A copy of a level in one block of the workspace's second pool
    (:meth:`.workspace.Workspace.aside`): the blocks the level was cut from
    can go back. The events keep their segments: the loop derives its own,
    but when it hands its start level back at once, the per-stage path reads
    them."""
    arrays = [*events.args(), *refs.args(), *nodes.args()]
    held = [a for a in arrays if a is not None]
    with workspace.aside():
        moved = iter(arrays_in_one_block(cp, [(a.shape, a.dtype) for a in held]))
    copies = [None if a is None else next(moved) for a in arrays]
    for a, copy in zip(held, (c for c in copies if c is not None)):
        copy[...] = a
    return EventSoA(*copies[:4]), RefSoA(*copies[4:6]), NodeSoA(*copies[6:])


def build_levels_grid(cp, cfg, tri_lo, tri_hi, state, out, max_depth, loop, settings, mesh):
    """Run levels from ``state`` in cooperative launches of the level-loop kernel.

    Small nodes the loop would split are deferred (``settings.small_refs``,
    in builds of at least ``settings.small_min_refs`` references):
    written as leaves here, with a record in ``state.deferred`` for
    :func:`.small.build_small_subtrees`.

    When a level's children (or its part of the tree) would not fit, the
    kernel stops before that level writes anything and says what it needs;
    the loop is launched again from that level with larger buffers
    (:func:`restart_capacity`),
    or, when the level's children would have more than
    ``settings.loop_stay_bound()`` events, returns that level to the caller
    (who runs it with one launch per stage).

    With perfect splits (``cfg.clip``, ``loop`` from
    ``level_loop_kernel(cp, clip=True)``) the kernel clips the straddling
    references and merges their new events (``cuda/build_loop.cu``); a level
    with a child segment of more than ``settings.clip_segment`` new events
    goes back to the caller too (the per-stage path sorts them).

    Parameters
    ----------
    tri_lo, tri_hi : (num_triangles, 3) float32 (device)
    mesh : (vertices, faces) on the device (read with ``cfg.clip``)
    state : LoopState
        The level to start from: the root, or a level the per-stage loop
        handed back.
    out : TreeOutput
        Grown when the tree outgrows it.
    max_depth : int
    loop : (cupy.RawKernel, int)
        From :func:`level_loop_kernel`.
    settings : GpuSettings

    Returns
    -------
    LoopState
        Done, or the first level whose children are too large for the loop.
    """
    kernel, resident = loop
    workspace = state.workspace
    # (level_sizes ends with the level before, where the stages ran it)
    parent_events = state.level_sizes[-1][2] if state.stage_levels else 0
    plan = loop_plan(cfg, settings, state.events.size, state.refs.size, state.nodes.size,
                     resident, parent_events)
    if plan is None:
        return state  # for the per-stage path
    if state.stage_levels and every_node_small(cp, state.nodes, state.small_refs):
        # The stages defer every node of this level (or make it a leaf), with no
        # buffers beyond the level's own; the loop would first make its block for
        # two such levels (1.38M triangles, H100: the build's peak, 296 bytes per
        # triangle for a level whose nodes it all deferred).
        return state
    if state.stage_levels:
        # Blocks cached from larger levels run by stages cannot hold the
        # loop's one block: give them back before it is made, then the ones
        # the level was cut from (once it is moved aside).
        workspace.trim()
        state.events, state.refs, state.nodes = moved_aside(
            cp, workspace, state.events, state.refs, state.nodes)
        workspace.trim()
    max_events, small, (cap_e, cap_r, cap_n, cap_new, (tree_nodes, tree_leaves)) = plan
    # the root's buffers, made before its events were decoded into them
    buffers, state.buffers = state.buffers, None
    # the slot of the buffers the start level lies in (-1: apart from them)
    start_slot = ROOT_SLOT if buffers is not None else -1
    state.loop_buffers += buffers is not None
    # The loop's share of the tree, as asked (growth by doubling made a
    # 1.38M-triangle build's tree buffers 10 nodes per triangle where the
    # tree has 3: 150 of its 864 bytes per triangle at the peak, H100).
    out.reserve(state.level_base + tree_nodes, state.leaf_ref_base + tree_leaves,
                state.level_base, state.leaf_ref_base, exact=True)
    if state.stage_levels:
        workspace.trim()  # the tree's buffers it outgrew
    # three scans' block sums, then the chunk bases of the event and reference scans
    block_sum = cp.empty(5 * resident, dtype=np.int64)
    loop_settings = LoopSettings.for_build(cfg, max_depth, small, max_events,
                                           settings.clip_segment)
    records = settings.small_records or (max(1024, state.refs.size // 4) if small else 1)
    with pooled():  # (a temporary of the build: not left cached in the caller's pool)
        state.room_for_deferred(cp, 0, records)
    while True:
        if buffers is None:
            buffers = LevelBuffers(cp, cap_e, cap_r, cap_n, cap_new)
            state.loop_buffers += 1
        start = LevelSizes(num_nodes=state.nodes.size, num_refs=state.refs.size,
                           num_events=state.events.size, level=state.level,
                           level_base=state.level_base, leaf_ref_base=state.leaf_ref_base,
                           slot=start_slot)
        capacity = LoopCapacity(events=cap_e, refs=cap_r, nodes=cap_n,
                                tree_nodes=out.node_capacity, leaf_refs=out.leaf_capacity,
                                deferred=state.deferred.shape[0], new_events=cap_new)
        # zeroed on the device (queued; an upload would wait for the copy)
        status = cp.zeros(enc.LOOP_SLOTS + 3 * (max_depth + 1), dtype=np.int64)
        if state.num_deferred:
            status[enc.LOOP_DEFER_NEXT] = state.num_deferred
            status[enc.LOOP_DEFER_REFS] = state.deferred_refs
        grid = loop_grid(state.events.size, resident, settings, max(cap_e, cap_r) + 1)
        launch("build_levels_grid", kernel, grid * enc.LOOP_BLOCK,
               (tri_lo, tri_hi, *mesh, state.events.struct(), state.refs.struct(),
                state.nodes.struct(), start.struct(), *buffers.structs(), block_sum,
                out.nodes.struct(),
                out.leaf, state.deferred, capacity.struct(), loop_settings, status),
               block=enc.LOOP_BLOCK)
        state.launches += 1
        state.loop_blocks.append(grid)
        workspace.sample()  # both levels, the scratch and the tree: the loop's high-water mark
        with stage(xp=cp, description="read_level_counts"):
            # One read for all the levels of the launch.
            record = status.get()
        level = int(record[enc.LOOP_LEVEL])
        sizes = record[enc.LOOP_SLOTS + 3 * state.level:enc.LOOP_SLOTS + 3 * level]
        state.level_sizes += [tuple(row) for row in sizes.reshape(-1, 3).tolist()]
        state.level = level
        state.level_base = int(record[enc.LOOP_LEVEL_BASE])
        state.leaf_ref_base = int(record[enc.LOOP_LEAF_BASE])
        state.num_deferred = int(record[enc.LOOP_DEFER_NEXT])
        state.deferred_refs = int(record[enc.LOOP_DEFER_REFS])
        if int(record[enc.LOOP_STATE]) == enc.LOOP_DONE:
            state.done = True
            return state
        # Stopped at a level: go on from it. Where the level's children fit the
        # buffers (the loop stopped for the tree's room or the deferral
        # records), the next launch starts from the level where it lies, in
        # the same buffers (happy Buddha subdivided twice, H200: a second
        # block as large made beside the first was the build's peak, 415 of
        # its 433 bytes per triangle). Else the level is copied out (also a
        # start level that lives in them), so that the old block goes back to
        # the device before the larger one is made.
        slot = int(record[enc.LOOP_BUFFER])
        stopped = tuple(int(record[k]) for k in (enc.LOOP_NODES, enc.LOOP_REFS, enc.LOOP_EVENTS))
        need_events = int(record[enc.LOOP_NEED_EVENTS])
        need_refs, need_nodes = int(record[enc.LOOP_NEED_REFS]), int(record[enc.LOOP_NEED_NODES])
        need_new = int(record[enc.LOOP_NEED_NEW_EVENTS]) if cfg.clip else 0
        to_stages = need_events > max_events or bool(record[enc.LOOP_NEED_STAGES])
        if not to_stages and need_events <= cap_e and need_refs <= cap_r \
                and need_nodes <= cap_n and need_new <= cap_new:
            if slot >= 0:
                state.events, state.refs, state.nodes = buffers.level(slot, *stopped)
                start_slot = slot
        else:
            views = None
            if slot >= 0:
                views = buffers.level(slot, *stopped)
            elif start_slot >= 0:
                # the start level, decoded into the loop's buffers
                views = (state.events, state.refs, state.nodes)
            if views is not None:
                state.events, state.refs, state.nodes = copied_level(cp, *views,
                                                                     segments=cfg.clip)
                del views
            buffers = None
            start_slot = -1  # (copied out with the level)
            if to_stages:
                return state
            policy = settings.loop_capacities(need_events, need_refs, small)
            cap_e = max(cap_e, restart_capacity(need_events, policy[0], max_events))
            # (a level has no more references than events: within max_events, as the
            # chunked scans need)
            cap_r = max(cap_r, restart_capacity(need_refs, policy[1], max_events))
            cap_n = max(cap_n, restart_capacity(need_nodes, policy[2]))
            if cfg.clip:
                cap_new = max(cap_new, 2 * need_new)
        out.reserve(2 * int(record[enc.LOOP_NEED_TREE_NODES]),
                    2 * int(record[enc.LOOP_NEED_LEAF_REFS]), state.level_base,
                    state.leaf_ref_base)
        need_deferred = int(record[enc.LOOP_NEED_DEFERRED])
        with pooled():
            state.room_for_deferred(cp, need_deferred, 2 * need_deferred)
        # (the old block stays cached until a device allocation would pass the
        # peak with it: Workspace.before_device_allocation)
