"""Small-node subtrees: one warp per node, one launch per level (``cuda/build_small.cu``).

Past the first levels a tree is mostly tiny nodes, and every level costs the
level loop a dozen grid barriers and passes over all its events however
little it holds. The loop therefore defers each node it would split that
holds at most ``settings.small_refs`` references
(:func:`.level_loop.build_levels_grid`): it writes the node as a leaf of its
references and a record of it. This stage builds those nodes' subtrees by the
same rules (the kernel's header says why its brute-force counts equal the
level stages' event scans), level by level with one warp per node and no
events, appending node pairs and leaves to the tree; then it packs the leaf
lists so that the deferred nodes' old leaf ranges leave no gaps.
"""

from __future__ import annotations

import numpy as np

from ... import encoding as enc
from ...kernels import get_function
from ...launch import launch, stage
from ..soa import LoopSettings
from .workspace import arrays_in_one_block, lasting, pooled

_SOURCE = "build_small.cu"
# warps launched per multiprocessor (about 20 fit at once), each strided over the level's nodes
WARPS_PER_SM = 32


def build_small_subtrees(cp, cfg, tri_lo, tri_hi, state, out, max_depth, settings) -> int:
    """Build the subtrees of the nodes the level loop deferred.

    One launch per level that can exist (``max_depth`` levels below the
    shallowest possible root), queued without reading anything back: each
    launch reads its level's size on the device, and a level without nodes
    returns at once. One read at the end gives the tree's sizes.

    Parameters
    ----------
    tri_lo, tri_hi : (num_triangles, 3) float32 (device)
    state : LoopState
        After the last level: ``deferred``/``num_deferred`` hold the records,
        ``level_base``/``leaf_ref_base`` what the levels wrote. Updated to
        the tree's final sizes.
    out : TreeOutput
        Grown when the subtrees outgrow it; its leaf list is packed.
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
    kernel = get_function(_SOURCE, "kd_build_small_level")
    loop_settings = LoopSettings.for_build(cfg, max_depth, settings.small_refs)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    per_block = enc.SMALL_BLOCK // 32
    blocks = (min(num, WARPS_PER_SM * sms) + per_block - 1) // per_block
    start = np.zeros(enc.SMALL_COUNTERS, dtype=np.int64)
    start[enc.SMALL_NODES], start[enc.SMALL_LEAVES] = state.level_base, state.leaf_ref_base
    levels = max_depth + 1  # every depth a deferred node's descendant can have
    # Buffers from the deferred nodes' references D (a run that finds one full
    # runs again with it doubled). Measured on an H100 (bunny, happy Buddha,
    # conference, armadillo and armadillo subdivided once), the widest level
    # of the subtrees holds 1.06-2.31 D references and 0.12-0.63 D nodes (a
    # node without references is written as a leaf at once, so most nodes
    # hold several): room for 3 D and 0.75 D.
    deferred = state.deferred_refs
    cap_refs = 3 * deferred + 1024
    cap_recs = 3 * deferred // 4 + 1024
    # The level loop's block goes back first: the tree's growth and this stage's
    # buffers (each one device allocation) would otherwise sit beside it, and
    # the growth would keep it until the tree is copied out (measured on an
    # H100: the end of the build was then the peak of the bunny, happy Buddha
    # and conference; the loop ended with a read, so nothing waits).
    state.workspace.release_unused()
    # Room for the subtrees, as much as they need: measured on the meshes of
    # the mesh directory (H100), they add 0.9-5.2 nodes and 1.6-4.0 leaf
    # entries per deferred reference (the bunny the most)
    out.reserve(state.level_base + 6 * deferred + 1024, state.leaf_ref_base + 5 * deferred + 1024,
                state.level_base, state.leaf_ref_base, exact=True, pooled=True)
    state.workspace.release_unused()  # the tree's first buffers, where they were the workspace's
    while True:
        records, refs = _stage_buffers(cp, cap_recs, cap_refs)
        counts = np.zeros(2 * (levels + 1), dtype=np.int64)
        counts[0], counts[1] = num, deferred
        # the counters and each level's (records, references), one array: one read
        sizes = cp.asarray(np.concatenate([start, counts]))
        counters, level_count = sizes[:enc.SMALL_COUNTERS], sizes[enc.SMALL_COUNTERS:]
        tree_nodes = out.nodes.struct()
        with stage(xp=cp, description="small subtrees"):
            for level in range(levels):
                roots = level == 0
                src = 1 - level % 2  # level L reads buffer 1 - L % 2 (the roots: the records)
                # a fixed grid of warps, strided over the level's nodes
                launch("small subtrees: level", kernel, blocks * enc.SMALL_BLOCK,
                       (tri_lo, tri_hi, state.deferred if roots else records[src],
                        out.leaf if roots else refs[src], np.int32(roots),
                        level_count[2 * level:], records[level % 2], refs[level % 2],
                        np.int64(cap_recs), np.int64(cap_refs), tree_nodes, out.leaf,
                        np.int64(out.node_capacity), np.int64(out.leaf_capacity),
                        loop_settings, counters), block=enc.SMALL_BLOCK)
            # one read: the tree's sizes (and whether every buffer had room)
            result = sizes.get()
        full = int(result[enc.SMALL_OVERFLOW])
        if not full:
            break
        # run again with twice the room in the buffers that were full
        out.reserve(out.node_capacity * (2 if full & enc.SMALL_FULL_NODES else 1),
                    out.leaf_capacity * (2 if full & enc.SMALL_FULL_LEAVES else 1),
                    state.level_base, state.leaf_ref_base, pooled=True)
        cap_recs *= 2 if full & enc.SMALL_FULL_RECORDS else 1
        cap_refs *= 2 if full & enc.SMALL_FULL_REFS else 1
        state.small_runs_full.append(full)
    del records, refs
    level_sizes = result[enc.SMALL_COUNTERS:].reshape(-1, 2)
    state.small_level_sizes = [tuple(row) for row in level_sizes[:int(np.count_nonzero(
        level_sizes[:, 0]))].tolist()]
    num_nodes, num_leaf_refs = int(result[enc.SMALL_NODES]), int(result[enc.SMALL_LEAVES])
    packed = num_leaf_refs - int(result[enc.SMALL_HOLES])
    with stage(xp=cp, description="small subtrees: pack leaves"):
        out.set_final_leaf(pack_leaves(cp, out, num_nodes, packed))
    state.level_base, state.leaf_ref_base = num_nodes, packed
    return int(result[enc.SMALL_DEPTH])


def _stage_buffers(cp, cap_recs: int, cap_refs: int):
    """The records and reference lists of the subtree levels, two each, in one
    block of the workspace pool (one device allocation; the leaf packing's
    int64 per tree node is cut from it once it is freed, where it fits).

    Returns
    -------
    records : (2, cap_recs, SMALL_RECORD) int32
    refs : (2, cap_refs) int32
    """
    with pooled():
        return tuple(arrays_in_one_block(cp, [((2, cap_recs, enc.SMALL_RECORD), np.int32),
                                              ((2, cap_refs), np.int32)]))


def pack_leaves(cp, out, num_nodes: int, num_leaf_refs: int):
    """The leaf list without unused entries, leaves pointed at their new ranges
    (made with the caller's allocator: it is the tree's).

    Returns
    -------
    (num_leaf_refs,) cupy int32
    """
    from ...primitives import inclusive_scan_in_place

    # The counts become the offsets in place: a second int64 per node did not
    # fit in the freed subtree buffers and was the bunny's peak (H100: 65 of
    # its 549 bytes per triangle).
    with pooled():  # a temporary: cut from the freed subtree buffers where it fits
        offsets = cp.empty(num_nodes + 1, dtype=np.int64)
        nodes = out.nodes.struct()
        launch("pack leaves: counts", get_function(_SOURCE, "kd_leaf_counts"), num_nodes + 1,
               (nodes, np.int64(num_nodes), offsets))
        inclusive_scan_in_place(offsets, description="pack leaves: offsets")
    with lasting():  # the tree's own leaf list, at its size
        packed = cp.empty(num_leaf_refs, dtype=enc.LEAF_TRIS_DTYPE)
    launch("pack leaves: copy", get_function(_SOURCE, "kd_pack_leaves"), num_nodes,
           (nodes, np.int64(num_nodes), offsets, out.leaf, packed))
    return packed
