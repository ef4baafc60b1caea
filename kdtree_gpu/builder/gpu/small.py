"""Small-node subtrees: level by level, a warp or a thread per node (``cuda/build_small.cu``).

Past the first levels a tree is mostly tiny nodes, and every level costs the
level loop a dozen grid barriers and passes over all its events however
little it holds. The loop therefore defers each node it would split that
holds at most ``settings.small_refs`` references
(:func:`.level_loop.build_levels_grid`): it writes the node as a leaf of its
references and a record of it. The levels run by stages do the same
(:func:`.level_stages.defer_records_gpu`), and keep a level whose nodes are
all that small rather than hand it to the loop. This stage builds those
nodes' subtrees by the same rules (the kernel's header says why its
brute-force counts equal the level stages' event scans), level by level with
one warp per node (one thread per node of at most ``SMALL_TINY_REFS``
references, most of them) and no events, appending node pairs and leaves to
the tree; then it packs the leaf lists so that the deferred nodes' old leaf
ranges leave no gaps. With ``settings.small_refs`` above ``SMALL_MAX_REFS``
(at most ``MEDIUM_MAX_REFS``; off by default: measured no faster,
``benchmarks/results/medium_nodes_h100.md``) each level first gives the
nodes of more than ``SMALL_MAX_REFS`` references a block each
(``cuda/medium_node.cuh``: their events, sorted once per subtree).
"""

from __future__ import annotations

import numpy as np

from ... import encoding as enc
from ...device import multiprocessors
from ...compile_ahead import ModuleSpec
from ...kernels import cooperative_function, get_function
from ...launch import launch, stage
from ..soa import LoopSettings
from .output import LEAF_BYTES, NODE_BYTES
from .workspace import arrays_in_one_block, lasting, make_room, pooled, size_class, uploaded

_SOURCE = "build_small.cu"
_GRID_SOURCE = "build_small_grid.cu"  # the same levels in one cooperative launch
_LEAVES_SOURCE = "build_small_leaves.cu"  # the leaf packing (pack_leaves)
# warps launched per multiprocessor (about 20 fit at once), each strided over the level's nodes
WARPS_PER_SM = 32
# blocks of the medium-node kernel launched per multiprocessor (as many as
# its registers let run at once), each strided over the level's medium nodes
MEDIUM_BLOCKS_PER_SM = 16
# Tree nodes the default first room may gain per deferred reference where the
# build's peak so far leaves them free (room_under_peak), and the share of
# that peak kept free as a margin for the estimate
MORE_NODES_PER_REF = 2.5
PEAK_MARGIN = 1 / 16


def subtree_modules(settings, cooperative: bool) -> tuple:
    """The modules :func:`build_small_subtrees` runs on a device that can
    (``cooperative``) or cannot launch cooperatively
    (:func:`kdtree_gpu.compile_ahead.compile_modules`)."""
    grid = cooperative and settings.small_grid and settings.small_refs <= enc.SMALL_MAX_REFS
    return ((ModuleSpec(_GRID_SOURCE, cooperative=True) if grid else ModuleSpec(_SOURCE)),
            ModuleSpec(_LEAVES_SOURCE))


def build_small_subtrees(cp, cfg, tri_lo, tri_hi, state, out, max_depth, settings) -> int:
    """Build the subtrees of the nodes the level loop and the stages deferred.

    Every level that can exist (``max_depth`` levels below the shallowest
    possible root) in one cooperative launch, a grid barrier between levels,
    which stops after the last level with nodes
    (``cuda/build_small_grid.cu``; ``settings.small_grid``); else, and with
    medium nodes, one launch per level, queued without reading anything
    back: each launch reads its level's size on the device, and a level
    without nodes returns at once. One read at the end gives the tree's sizes, or the
    first level that found its room full: the levels go on from that one
    (those before it are done, and its input is only read) once the tree
    has a second page (:meth:`.output.TreeOutput.add_page`: nothing is
    copied) or the level's output buffer is larger. The first room is
    ``settings.small_capacities`` of the deferred references, with the tree
    nodes the build's peak leaves free added (:func:`room_under_peak`)
    unless the settings give the room.

    Parameters
    ----------
    tri_lo, tri_hi : (num_triangles, 3) float32 (device)
    state : LoopState
        After the last level: ``deferred``/``num_deferred`` hold the records,
        ``level_base``/``leaf_ref_base`` what the levels wrote. Updated to
        the tree's final sizes.
    out : TreeOutput
        Given room for the subtrees (a second page when they outgrow it);
        its leaf list is packed.
    max_depth : int
    settings : GpuSettings

    Returns
    -------
    int
        The depth of the deepest leaf of the subtrees (-1 without any).
    """
    num = state.num_deferred
    if num == 0:
        return -1
    loop_settings = LoopSettings.for_build(cfg, max_depth, settings.small_refs)
    sms = multiprocessors(cp.cuda.Device().id)
    per_block = enc.SMALL_BLOCK // 32
    # (a level has at most as many nodes as the deferred nodes have references:
    # sized from the records alone, medium roots left later levels a few warps)
    blocks = (min(state.deferred_refs, WARPS_PER_SM * sms) + per_block - 1) // per_block
    # nodes of more than SMALL_MAX_REFS references, a block each (none unless
    # the levels deferred such nodes)
    medium = None
    if settings.small_refs > enc.SMALL_MAX_REFS:
        medium = get_function(_SOURCE, "kd_build_medium_level")
        most_medium = medium_rows(state.deferred_refs)
        medium_blocks = min(most_medium, MEDIUM_BLOCKS_PER_SM * sms)
    # every level in one cooperative launch, where the device runs one (not with
    # medium nodes: their block kernel keeps a launch per level)
    grid = None
    if medium is None and settings.small_grid:
        grid = cooperative_function(_GRID_SOURCE, "kd_build_small_levels", enc.SMALL_BLOCK)
    # (the launches per level: asked for only where they run, so that a first
    # build compiles one of the two modules)
    kernel = get_function(_SOURCE, "kd_build_small_level") if grid is None else None
    levels = max_depth + 1  # every depth a deferred node's descendant can have
    row = enc.SMALL_LEVEL_ROW
    sizes = np.zeros(enc.SMALL_COUNTERS + row * (levels + 1), dtype=np.int64)
    sizes[enc.SMALL_NODES], sizes[enc.SMALL_LEAVES] = state.level_base, state.leaf_ref_base
    sizes[enc.SMALL_FULL_LEVEL] = levels
    rows = sizes[enc.SMALL_COUNTERS:].reshape(-1, row)  # (a view: rows of `sizes`)
    rows[0, enc.SMALL_LEVEL_RECORDS], rows[0, enc.SMALL_LEVEL_REFS] = num, state.deferred_refs
    caps = settings.small_capacities(state.deferred_refs)
    cap_events = caps[4] if medium is not None else 1  # (16-bit: six per medium reference)
    # The level loop's block goes back first: the tree's growth and this stage's
    # buffers (each one device allocation) would otherwise sit beside it, and
    # the growth would keep it until the tree is copied out (measured on an
    # H100: the end of the build was then the peak of the bunny, happy Buddha
    # and conference; the loop ended with a read, so nothing waits).
    state.workspace.release_unused()
    if settings.small_capacity is None:  # (a room the settings give is taken as it is)
        caps = (caps[0] + room_under_peak(state.workspace, out, state, caps,
                                          2 * 2 * cap_events),) + caps[1:]
    cap_tree, cap_leaves, cap_recs, cap_refs = caps[:4]
    # (a second page where the tree's block is short: the levels' part is not copied)
    out.extend(state.level_base + cap_tree, state.leaf_ref_base + cap_leaves)
    # level L reads buffer 1 - L % 2 (level 0: the records) and writes L % 2
    # (both in one block at first: a level that finds its own full gets its own)
    both = _stage_buffers(cp, (2, cap_recs), (2, cap_refs), (2, cap_events))
    buffers = [tuple(a[0] for a in both), tuple(a[1] for a in both)]
    del both
    first = 0
    # (queued: a pageable upload would wait for the tree's copy queued above;
    # the pinned copy is kept until the read below has passed it)
    counters, staged = uploaded(cp, sizes)
    deferred_medium = None
    if medium is not None:
        # level 0's medium records, copied out of the deferred ones once (a
        # run again from level 0 reads them again)
        with pooled():
            deferred_medium = cp.empty((most_medium, enc.MEDIUM_RECORD), dtype=np.int32)
        launch("small subtrees: medium records", get_function(_SOURCE, "kd_medium_records"),
               num, (state.deferred, np.int64(num), counters, deferred_medium))
    while True:
        # the tree's pages change only between runs: their kernel arguments are
        # made once per run, not once per level (two structs: tens of
        # microseconds of host time per launch)
        tree_args = out.page_args()
        with stage(xp=cp, description="small subtrees"):
            if grid is not None:
                # (as many blocks as are resident at once, strided over each level's nodes)
                kernel_grid, resident = grid
                launch("small subtrees: levels", kernel_grid,
                       min(blocks, resident) * enc.SMALL_BLOCK,
                       (tri_lo, tri_hi, state.deferred, np.int64(state.deferred.shape[0]),
                        out.leaf, *buffers[0][:2], *(np.int64(a.shape[0]) for a in buffers[0][:2]),
                        *buffers[1][:2], *(np.int64(a.shape[0]) for a in buffers[1][:2]),
                        np.int32(first), np.int32(levels), counters, *tree_args, loop_settings),
                       block=enc.SMALL_BLOCK)
                state.small_launches += 1
            # (else a launch per level, from the first to run)
            for level in range(first, levels) if grid is None else ():
                src, dst = buffers[1 - level % 2], buffers[level % 2]
                in_refs = out.leaf if level == 0 else src[1]
                if medium is not None:
                    # a fixed grid of blocks, strided over the level's medium nodes
                    in_medium = deferred_medium if level == 0 else src[2]
                    launch("small subtrees: medium level", medium,
                           medium_blocks * enc.MEDIUM_BLOCK,
                           (tri_lo, tri_hi, in_medium, in_refs, src[3], np.int32(level),
                            counters, dst[0], dst[1], dst[2], dst[3],
                            *(np.int64(a.shape[0]) for a in dst), *tree_args, loop_settings),
                           block=enc.MEDIUM_BLOCK)
                # a fixed grid of warps, strided over the level's nodes
                records = state.deferred if level == 0 else src[0]
                launch("small subtrees: level", kernel, blocks * enc.SMALL_BLOCK,
                       (tri_lo, tri_hi, records, in_refs,
                        np.int64(records.shape[0]), np.int32(level), counters,
                        dst[0], dst[1], np.int64(dst[0].shape[0]), np.int64(dst[1].shape[0]),
                        *tree_args, loop_settings), block=enc.SMALL_BLOCK)
                state.small_launches += 1 + (medium is not None)
            # (else they would keep the last level's buffers alive)
            src = dst = records = in_refs = in_medium = None
            # one read: the tree's sizes (and whether every buffer had room)
            sizes = counters.get()
        full = int(sizes[enc.SMALL_OVERFLOW])
        if not full:
            break
        # Go on from the first level that found a buffer full, with room for
        # what it asked: the levels before it are done, and its input is only read.
        first = int(sizes[enc.SMALL_FULL_LEVEL])
        rows = sizes[enc.SMALL_COUNTERS:].reshape(-1, row)
        done = rows[:first].sum(axis=0)
        nodes_before = state.level_base + int(done[enc.SMALL_LEVEL_NODES])
        leaves_before = state.leaf_ref_base + int(done[enc.SMALL_LEVEL_LEAVES])
        # The tree's room: a second page from the level's first index on, or
        # that page made again, with room for what the levels from it on write
        # (page_growth)
        for bit, used, key, room, nodes in (
                (enc.SMALL_FULL_NODES, nodes_before, enc.SMALL_LEVEL_NODES, cap_tree, True),
                (enc.SMALL_FULL_LEAVES, leaves_before, enc.SMALL_LEVEL_LEAVES, cap_leaves,
                 False)):
            if full & bit:
                out.add_page(nodes, used, page_growth(rows[:first + 1, key], room))
        if full & (enc.SMALL_FULL_RECORDS | enc.SMALL_FULL_REFS | enc.SMALL_FULL_EVENTS):
            # The level's output buffer made again (what it wrote is written
            # again) with room for 5/4 of what it asked. Its input stays: grown
            # with its rows kept, both buffers and the copy were the bunny's
            # peak (H100: 573 bytes per triangle against 445); the next level
            # that finds it full makes it again the same way.
            # (only its shapes: a view of it kept here, the medium records' once,
            # held the first block, which both buffers share, through the leaf
            # packing: the bunny subdivided twice peaked at 399 bytes per
            # triangle instead of 380, H200)
            has = [buffers[first % 2][i].shape[0] for i in (0, 1, 3)]
            child = rows[first + 1]
            asked = (level_records(child[enc.SMALL_LEVEL_RECORDS]),
                     int(child[enc.SMALL_LEVEL_REFS]), int(child[enc.SMALL_LEVEL_EVENTS]))
            caps = [max(h, a * 5 // 4 + 1024) for h, a in zip(has, asked)]
            # (a block of its own goes back to the pool first; the first block
            # stays while the other buffer's views hold it)
            buffers[first % 2] = None
            buffers[first % 2] = _stage_buffers(cp, *caps)
        state.small_runs_full.append((first, full))
        # the level's counts and everything after it start again
        rows[first, enc.SMALL_LEVEL_NODES:] = 0
        rows[first + 1:] = 0
        sizes[enc.SMALL_OVERFLOW] = 0
        sizes[enc.SMALL_FULL_LEVEL] = levels
        if first == 0:
            sizes[enc.SMALL_HOLES] = 0
        counters.set(sizes)
        # the blocks made again go back (the read left nothing running)
        state.workspace.release_unused()
    # the largest block the stage's buffers held: free once they go (the leaf
    # packing's offsets are cut from it where they fit)
    freed = max(a[0].data.mem.size for a in buffers)
    del buffers, staged, deferred_medium  # (the first read passed the pinned copy)
    rows = sizes[enc.SMALL_COUNTERS:].reshape(-1, row)
    live = int(np.count_nonzero(rows[:, enc.SMALL_LEVEL_REFS]))
    state.medium_level_sizes = [int(r[enc.SMALL_LEVEL_MEDIUM]) for r in rows[:live]]
    state.small_level_sizes = [(level_records(r[enc.SMALL_LEVEL_RECORDS])
                                + int(r[enc.SMALL_LEVEL_MEDIUM]) * (i > 0),
                                int(r[enc.SMALL_LEVEL_REFS])) for i, r in enumerate(rows[:live])]
    num_nodes = state.level_base + int(rows[:, enc.SMALL_LEVEL_NODES].sum())
    num_leaf_refs = state.leaf_ref_base + int(rows[:, enc.SMALL_LEVEL_LEAVES].sum())
    packed = num_leaf_refs - int(sizes[enc.SMALL_HOLES])
    with stage(xp=cp, description="small subtrees: pack leaves"):
        out.set_final_leaf(pack_leaves(cp, out, num_nodes, packed, freed))
    state.level_base, state.leaf_ref_base = num_nodes, packed
    return int(sizes[enc.SMALL_DEPTH])


# the most a level's tree nodes (or leaf entries) may be of the level's before
# for page_growth to take the levels after it as shrinking
SHRINKING_RATIO = 0.75


def page_growth(taken, room: int) -> int:
    """Rows of tree nodes (or leaf entries) to add for the subtree levels from the
    first that found the tree's room full: ``taken``, the rows each level
    took up to that one (what it asked for, last); ``room``, the stage's
    first room.

    Where the levels shrink (the last took at most ``SHRINKING_RATIO`` of the
    one before), what the levels from it on take, as the sum of a geometric
    series of the ratio of the two, plus a quarter, at most half the first
    room; else half the first room (the levels still grow). At least twice
    what the level asked for. A page made again holds the old one while its rows
    are copied: doubling it, as before, was the peak of the dragon
    subdivided twice (H200: 495 bytes per triangle, its room full at its
    twelfth subtree level of 21, 6% of the stage's work).
    """
    want = int(taken[-1])
    before = int(taken[-2]) if len(taken) > 1 else 0
    tail = room // 2
    if before > 0 and want <= SHRINKING_RATIO * before:
        tail = min(tail, int(5 * want * before / (4 * (before - want))))
    return max(2 * want, tail)


def level_records(word) -> int:
    """A subtree level's records from its row's records word (``encoding.SMALL_LEVEL_ROW``):
    those of more than ``SMALL_TINY_REFS`` references in the low bits, the others above."""
    word = int(word)
    return (word & enc.SMALL_RECORDS_FRONT) + (word >> enc.SMALL_RECORDS_BACK_SHIFT)


def room_under_peak(workspace, out, state, caps, events_bytes=0) -> int:
    """Tree nodes to add to the subtree stage's first room ``caps`` where the
    build's peak so far leaves them free (at most ``MORE_NODES_PER_REF`` per
    deferred reference; 0 where it leaves none).

    A stage whose room runs out runs its levels again from the first that
    found it full (:func:`build_small_subtrees`): on the bunny, whose
    subtrees have 5.2 nodes per deferred reference against at most 3.9 on
    the other meshes measured, that second run was about a tenth of the
    build (H100). More room for every mesh raised conference's peak from 377
    to 442 bytes per triangle, since the stage is its peak; on the bunny, a
    room of 6.5 nodes per reference left the peak where it was (the level
    loop's block). So the stage takes what the peak leaves: the build has
    already held ``workspace.high_water``, less a margin of ``PEAK_MARGIN``
    of it for the estimate below.

    The estimate (call after the level loop's block went back, when the
    footprint is what lives): the stage holds, beside the rest, the tree's
    second page (the room the first block lacks: :meth:`.output.TreeOutput.extend`),
    then the larger of the stage's buffers with the packed leaf list
    (:func:`pack_leaves` cuts its offsets from the buffers' block) and the
    copies the finished tree makes (:meth:`.output.TreeOutput.finish`), the
    last two taken at a first room's worth of leaf entries and nodes. Each
    added node costs the page ``NODE_BYTES``, and the copies as much again
    where they are (or become) the larger. (On happy Buddha, 100k triangles, an estimate
    without the packed leaf list let the peak rise by 22 bytes per triangle
    at 2.5 more nodes per reference.) ``events_bytes``: both buffers of the
    medium nodes' events, beside the stage's other buffers.
    """
    cap_tree, cap_leaves, cap_recs, cap_refs = (int(c) for c in caps[:4])
    leaves = LEAF_BYTES * (state.leaf_ref_base + cap_leaves)
    tree_room = NODE_BYTES * (state.level_base + cap_tree) + leaves  # (the copies at most)
    page = (NODE_BYTES * max(0, state.level_base + cap_tree - out.node_capacity)
            + LEAF_BYTES * max(0, state.leaf_ref_base + cap_leaves - out.leaf_capacity))
    # two of each, int32 (and the medium nodes' events: events_bytes)
    buffers = 2 * 4 * (cap_recs * enc.SMALL_RECORD + cap_refs) + events_bytes
    need = workspace.footprint() + page + max(buffers + leaves, tree_room)
    spare = int(workspace.high_water * (1 - PEAK_MARGIN)) - need
    most = int(MORE_NODES_PER_REF * state.deferred_refs)
    # a node costs the page its bytes, and the copies as much while they are the larger
    gap = max(0, buffers + leaves - tree_room)
    nodes = spare // NODE_BYTES if spare <= gap else (spare + gap) // (2 * NODE_BYTES)
    return max(0, min(most, nodes))


def medium_rows(refs: int) -> int:
    """Medium records that ``refs`` references can make at most (each holds
    more than ``SMALL_MAX_REFS``), plus one."""
    return int(refs) // (enc.SMALL_MAX_REFS + 1) + 1


def _stage_buffers(cp, cap_recs, cap_refs, cap_events=1):
    """Records, reference lists and medium nodes' events of subtree levels, in one
    block of the workspace pool (one device allocation; the leaf packing's
    int64 per tree node is cut from the freed ones, where it fits).
    ``cap_recs``, ``cap_refs``, ``cap_events``: a level's rows, or
    ``(2, rows)`` for both buffers. The medium records get a row per
    ``SMALL_MAX_REFS + 1`` references of room: each holds more, so they run
    out only where the references do.

    Returns
    -------
    records : (..., cap_recs, SMALL_RECORD) int32
    refs : (..., cap_refs) int32
    mediums : (..., medium_rows(cap_refs), MEDIUM_RECORD) int32
    events : (..., cap_events) uint16
    """
    recs, refs, events = (tuple(c) if isinstance(c, tuple) else (c,)
                          for c in (cap_recs, cap_refs, cap_events))
    mediums = refs[:-1] + (medium_rows(refs[-1]),)
    with pooled():
        return tuple(arrays_in_one_block(cp, [((*recs, enc.SMALL_RECORD), np.int32),
                                              (refs, np.int32),
                                              ((*mediums, enc.MEDIUM_RECORD), np.int32),
                                              (events, np.uint16)]))


def pack_leaves(cp, out, num_nodes: int, num_leaf_refs: int, freed: int = 0):
    """The leaf list without unused entries, leaves pointed at their new ranges
    (made with the caller's allocator: it is the tree's). ``freed``: the bytes
    of the largest free block of the workspace pool (the subtree stage's
    buffers), from which the offsets are cut where they fit.

    Returns
    -------
    (num_leaf_refs,) cupy int32
    """
    from ...primitives import inclusive_scan_in_place

    # The counts become the offsets in place: a second int64 per node did not
    # fit in the freed subtree buffers and was the bunny's peak (H100: 65 of
    # its 549 bytes per triangle). The freed buffers go back first where they
    # would hold the peak beside the packed list, and beside the offsets
    # where these are not cut from them (giving them back and making the
    # offsets anew cost the bunny's build 0.16 ms of host time, H200).
    offsets_bytes = 8 * (num_nodes + 1)
    make_room(num_leaf_refs * LEAF_BYTES + (0 if size_class(offsets_bytes) <= freed
                                              else offsets_bytes))
    with pooled():  # a temporary: cut from the freed subtree buffers where it fits
        offsets = cp.empty(num_nodes + 1, dtype=np.int64)
        lo, leaf_lo, hi, leaf_hi, node_split, leaf_split = out.page_args()[:6]
        launch("pack leaves: counts", get_function(_LEAVES_SOURCE, "kd_leaf_counts"), num_nodes + 1,
               (lo, hi, node_split, np.int64(num_nodes), offsets))
        inclusive_scan_in_place(offsets, description="pack leaves: offsets")
    with lasting():  # the tree's own leaf list, at its size
        packed = cp.empty(num_leaf_refs, dtype=enc.LEAF_TRIS_DTYPE)
    launch("pack leaves: copy", get_function(_LEAVES_SOURCE, "kd_pack_leaves"), num_nodes,
           (lo, hi, node_split, np.int64(num_nodes), offsets, leaf_lo, leaf_hi, leaf_split,
            packed))
    return packed
