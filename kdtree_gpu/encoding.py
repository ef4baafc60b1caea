"""Node, event and sentinel encodings shared by every builder and kernel.

This module is the single place where these numbers are defined. Python code
imports the constants; CUDA sources receive them through :func:`cuda_defines`,
a ``#define`` block that the module factory prepends to every ``.cu`` file
(and that CI passes to ``nvcc`` when it compiles the sources without a GPU).

Tree nodes (the flat ``KdTree`` arrays)
---------------------------------------
``node_axis``  int8   0, 1, 2 = split axis of an interior node; ``AXIS_LEAF`` = leaf
``node_split`` float32 split position (interior nodes; 0 for leaves)
``node_child`` int32  interior: index of the left child (right = left + 1);
                      leaf: offset of the leaf's first entry in ``leaf_tris``
``node_count`` int32  leaf: number of triangles; interior: 0

Events (Wald & Havran 2006, section 4.2)
----------------------------------------
Every triangle contributes, per axis, either one planar event (its box is flat
on that axis) or an end and a start event. Events are ordered by position,
then by kind with ``EVENT_END < EVENT_PLANAR < EVENT_START``, then by triangle
index. That order is what makes one sweep count the triangles on each side of
every candidate plane.

Traversal nodes (8 bytes, pbrt style)
-------------------------------------
word 0: interior: split position (float32 bits); leaf: triangle count (int32)
word 1: ``(index << PACK_SHIFT) | axis`` with axis 0..2 for an interior node
        (index = left child) and ``AXIS_LEAF`` for a leaf (index = offset into
        ``leaf_tris``). Indices must stay below ``PACK_MAX_INDEX``.
"""

from __future__ import annotations

import numpy as np

# --- tree nodes ------------------------------------------------------------
AXIS_X, AXIS_Y, AXIS_Z, AXIS_LEAF = 0, 1, 2, 3

NODE_AXIS_DTYPE = np.int8
NODE_SPLIT_DTYPE = np.float32
NODE_CHILD_DTYPE = np.int32
NODE_COUNT_DTYPE = np.int32
LEAF_TRIS_DTYPE = np.int32

# --- events ----------------------------------------------------------------
EVENT_END, EVENT_PLANAR, EVENT_START = 0, 1, 2  # their order in a sort

EVENT_POS_DTYPE = np.float32
EVENT_KIND_DTYPE = np.int8
EVENT_TRI_DTYPE = np.int32

# --- planar-triangle side (p_side) and triangle classes ---------------------
SIDE_LEFT = 0
SIDE_RIGHT = 1

CLASS_LEFT = 1  # bit 0: the triangle goes to the left child
CLASS_RIGHT = 2  # bit 1: the triangle goes to the right child
CLASS_BOTH = CLASS_LEFT | CLASS_RIGHT

# --- traversal node packing --------------------------------------------------
PACK_SHIFT = 2
PACK_AXIS_MASK = (1 << PACK_SHIFT) - 1
PACK_MAX_INDEX = (1 << (31 - PACK_SHIFT)) - 1

# --- status record of the level loop kernel (build.gpu.level_loop) --------
# Slots of the int64 record the kernel leaves behind; the per-level sizes
# (nodes, refs, events of each finished level) follow from slot LOOP_SLOTS on,
# three per level, indexed by level number.
LOOP_STATE = 0  # LOOP_DONE, or LOOP_STOPPED: level LOOP_LEVEL did not fit
LOOP_LEVEL = 1  # levels finished
LOOP_NODES = 2  # size of the level the loop stopped at
LOOP_REFS = 3
LOOP_EVENTS = 4
LOOP_LEVEL_BASE = 5  # tree nodes written so far
LOOP_LEAF_BASE = 6  # leaf_tris entries written so far
LOOP_BUFFER = 7  # which level buffer holds the stopped level (-1: the start arrays)
LOOP_NEED_NODES = 8  # what the stopped level needs: its children's nodes,
LOOP_NEED_REFS = 9  # references
LOOP_NEED_EVENTS = 10  # and events,
LOOP_NEED_TREE_NODES = 11  # tree nodes including the level's own,
LOOP_NEED_LEAF_REFS = 12  # leaf_tris entries including the level's own
LOOP_DEFER_NEXT = 13  # small nodes deferred so far, all launches (the next record's index)
LOOP_DEFER_LEVEL = 14  # small nodes deferred by the current level
LOOP_NEED_DEFERRED = 15  # deferral records the stopped level needs, its own included
# perfect splits (clip) in the loop: the most new events of one child segment
# of the current level where that is over LoopSettings.clip_segment (0: none
# is), the new events the stopped level needs, and whether it must run with
# one launch per stage (a segment over the limit)
LOOP_CLIP_SEGMENT = 16
LOOP_NEED_NEW_EVENTS = 17
LOOP_NEED_STAGES = 18
LOOP_DEFER_REFS = 19  # references of the small nodes deferred so far, all launches
# blocks that have published their chunk's sum, for each of the two chunked
# scans a phase may run (cuda/build_loop.cuh, kd_grid_chunk_bases: the last
# writes every chunk's base, then sets its counter to 0 again)
LOOP_SCAN_ARRIVALS = 20  # and 21
LOOP_SLOTS = 22
LOOP_DONE = 0
LOOP_STOPPED = 1

# --- small-node subtrees (builder.gpu.small) ------------------------------------
# A node the level loop would split that holds at most GpuSettings.small_refs
# (<= MEDIUM_MAX_REFS) references is deferred: the loop writes it as a leaf and a
# record of SMALL_RECORD int32 (tree node, depth | count << SMALL_COUNT_SHIFT,
# start of its references, box lo and hi as float bits: cuda/small_record.cuh);
# its subtree is then built one launch per level, a block per node of more
# than SMALL_MAX_REFS references (a medium node), a warp per node of at most
# SMALL_MAX_REFS and a thread per node of at most SMALL_TINY_REFS, from
# records of the same layout.
SMALL_MAX_REFS = 64  # two references per lane of a warp
MEDIUM_MAX_REFS = 256  # a multiple of MEDIUM_BLOCK: a medium node, in shared memory
MEDIUM_BLOCK = 64  # threads of the medium-node kernel: two warps, many blocks a multiprocessor
SMALL_RECORD = 9
MEDIUM_RECORD = 10  # a medium node's: SMALL_RECORD words, then the start of its events
SMALL_COUNT_SHIFT = 16  # depths below 2**16, counts up to MEDIUM_MAX_REFS above them
SMALL_BLOCK = 128  # threads of the subtree kernel: four warps
# a subtree node of at most this many references takes a thread, a larger one a warp
SMALL_TINY_REFS = 8
SMALL_DEFERRED_AXIS = -1  # best_axis of a deferred node in the level loop's scratch
# int64 counters of the subtree kernel: the tree nodes and leaf_tris entries
# written before its first level, an overflow flag, the deepest leaf, the
# leaf_tris entries the deferred nodes' level-loop leaves leave unused, and
# the first level that found a buffer full. Then SMALL_LEVEL_ROW per level L:
# the records and references of level L (written by level L - 1; the records
# word counts those of SMALL_TINY_REFS + 1 .. SMALL_MAX_REFS references, at
# the front of their buffer, in its low 32 bits and those of fewer, at the
# back, in its high ones: builder.gpu.small.level_records), its medium records
# (in a buffer of their own; level 0's are the deferred records of more than
# SMALL_MAX_REFS references, copied there) and their events (16-bit, six per
# reference: cuda/medium_node.cuh), and the tree nodes and leaf entries
# level L takes (so that a run can go on from a level: the counts before it
# are the sums of the rows above it; a level's inputs come before them).
SMALL_NODES = 0
SMALL_LEAVES = 1
SMALL_OVERFLOW = 2
SMALL_DEPTH = 3
SMALL_HOLES = 4
SMALL_FULL_LEVEL = 5
SMALL_COUNTERS = 6
SMALL_LEVEL_RECORDS = 0
SMALL_LEVEL_REFS = 1
SMALL_LEVEL_MEDIUM = 2
SMALL_LEVEL_EVENTS = 3
SMALL_LEVEL_NODES = 4
SMALL_LEVEL_LEAVES = 5
SMALL_LEVEL_ROW = 6
SMALL_RECORDS_BACK_SHIFT = 32
SMALL_RECORDS_FRONT = (1 << SMALL_RECORDS_BACK_SHIFT) - 1  # the records word's low part
# bits of counters[SMALL_OVERFLOW]: the buffers a run of the levels found full
SMALL_FULL_NODES = 1
SMALL_FULL_LEAVES = 2
SMALL_FULL_RECORDS = 4
SMALL_FULL_REFS = 8
SMALL_FULL_EVENTS = 16

# --- the build's own triangle order (builder.gpu.order) -------------------------
# A large build numbers the triangles by the Morton code of their boxes'
# centres, MORTON_BITS bits an axis over the root box (valid triangles first),
# and names them by their given indices again in the finished leaves, each
# leaf sorted: kd_rename_leaves sorts a leaf of up to LEAF_SORT_MAX entries in
# one thread and lists the larger ones, which a radix sort then orders.
MORTON_BITS = 10
LEAF_SORT_MAX = 64

# --- summary record of mesh preparation (kd_prepare_triangles) ----------------
# uint64 slots: error flags, valid triangles, valid triangles flat on x/y/z,
# then minima (the root box minimum, the smallest valid triangle's size) and
# maxima (the root box maximum), as order-preserving float bits. Slots
# [SUMMARY_VALID, SUMMARY_LO) are sums, [SUMMARY_LO, SUMMARY_HI) minima,
# [SUMMARY_HI, SUMMARY_SLOTS) maxima.
SUMMARY_FLAGS = 0
SUMMARY_VALID = 1
SUMMARY_PLANAR = 2  # slots 2, 3, 4
SUMMARY_LO = 5  # slots 5, 6, 7
SUMMARY_MIN_SIZE = 8  # the largest side of the smallest valid triangle's box
SUMMARY_HI = 9  # slots 9, 10, 11
SUMMARY_SLOTS = 12
SUMMARY_BAD_INDEX = 1  # flag bit: a face index out of range
SUMMARY_BAD_COORD = 2  # flag bit: a non-finite coordinate

# --- root event sort keys (kd_root_event_keys) ---------------------------------
# axis (2 bits) | ordered position bits (32) | kind (2) | reference (KEY_REF_BITS):
# one 64-bit sort orders the three axes' events at once (rule R3 per axis).
KEY_REF_BITS = 28
MAX_TRIANGLES = (1 << KEY_REF_BITS) - 1

# --- perfect splits (clip=True) -------------------------------------------------
# A triangle clipped to a box by six half-spaces keeps at most 3 + 6 vertices.
CLIP_MAX_POLY = 9
# The clipped copies' new events are sorted by one 64-bit key: segment
# (above CLIP_SEG_SHIFT) | ordered position bits (32) << CLIP_NEW_POS_SHIFT |
# kind; within a segment the merge orders events by position bits (32) <<
# CLIP_POS_SHIFT | kind << CLIP_KIND_SHIFT | the reference's index within its
# node (below 2**CLIP_KIND_SHIFT, since KEY_REF_BITS < CLIP_KIND_SHIFT).
CLIP_SEG_SHIFT = 34
CLIP_NEW_POS_SHIFT = 2
CLIP_POS_SHIFT = 32
CLIP_KIND_SHIFT = 30

# --- float64 bit patterns of split costs --------------------------------------
# Costs are >= 0 or +inf, so their IEEE bits order like the values: a
# segment's (cost bits, event index) pair compared as one 128-bit number is
# rule R8's order (KdSegArgmin in cuda/split_costs.cuh).
INF_BITS = 0x7FF0000000000000
NO_INDEX = 0xFFFFFFFFFFFFFFFF

# --- launch shapes shared by a driver and its kernels ---------------------------
SCAN_BLOCK = 256  # threads of the block scans and of the three-launch scan
LAUNCH_BLOCK = 256  # threads per block of launch.launch's default (one item a thread)
SCAN_ITEMS = 8  # items per thread of a scan tile
SCAN_TILE = SCAN_BLOCK * SCAN_ITEMS
SCAN_SMALL = 8 * SCAN_TILE  # up to this size one block scans a whole array
# The level loop stores its flag scans as 16-bit counts within each block's
# chunk (KdPackedScan, cuda/scan.cuh): a chunk holds at most this many items.
SCAN_CHUNK_MAX = 65535
PREPARE_BLOCK = 256  # kd_prepare_triangles
LOOP_BLOCK = 512  # the level-loop kernel's blocks (two per multiprocessor)
TRAVERSE_BLOCK = 128  # traversal kernels (__launch_bounds__)
BRUTE_BLOCK = 128  # brute-force kernels: threads per block = triangles per shared tile
COMPACT_BLOCK = 256  # stream compaction of the path tracer's queues
COMPACT_MAX_TILES = 1024
COMPACT_MAX_FIELDS = 16
COMPACT_MAX_WARPS = 32
COMPACT_FLAG_U8 = 0  # live = flag != 0
COMPACT_FLAG_F32 = 1  # live = flag > 0

# --- traversal -------------------------------------------------------------------
# Deepest level of any tree (root = 0; SAHConfig.max_depth is capped at it):
# the traversal stack holds one entry per level below the root.
MAX_DEPTH_CAP = 64
# A child is kept when the split plane is within TRAVERSE_EPS times the scene
# extent (seen from the origin) of the node's interval: rounding of the slab
# distances and of the watertight test never loses a hit on a split plane.
TRAVERSE_EPS = np.float32(2.0 ** -18)

# Problems of a ray, found by the traversal kernel while it loads the ray
# (a ray with a problem is a miss); the first one is recorded as
# (index << RAY_KIND_BITS) | kind.
RAY_BAD_ORIGIN = 1  # a NaN or infinite origin coordinate
RAY_BAD_DIRECTION = 2  # a NaN or infinite direction coordinate
RAY_ZERO_DIRECTION = 3
RAY_NAN_TMIN = 4
RAY_NAN_TMAX = 5
RAY_EMPTY_INTERVAL = 6  # tmin > tmax
RAY_KIND_BITS = 3

# --- path tracer ---------------------------------------------------------------
# Shadow rays stop this fraction short of the light point.
SHADOW_TMAX_SCALE = np.float32(1.0 - 1e-4)
# 1 / pi in float32: the Lambertian BSDF and its cosine-weighted pdf
INV_PI = np.float32(0.3183098861837907)

# --- sentinels -----------------------------------------------------------------
NO_HIT = -1  # triangle id of a ray that hit nothing (its t is +inf)
NO_NODE = -1


def pack_nodes(node_axis, node_split, node_child, node_count):
    """Pack a tree's node arrays into the 8-byte traversal layout.

    Parameters
    ----------
    node_axis : (num_nodes,) int8
    node_split : (num_nodes,) float32
    node_child : (num_nodes,) int32
    node_count : (num_nodes,) int32

    Returns
    -------
    packed : (num_nodes, 2) int32
        Column 0 holds the split bits (interior) or the triangle count (leaf),
        column 1 ``(child_or_offset << PACK_SHIFT) | axis``.
    """
    node_axis = np.asarray(node_axis)
    node_child = np.asarray(node_child, dtype=np.int64)
    if node_child.size and int(node_child.max()) > PACK_MAX_INDEX:
        raise ValueError(
            f"tree too large for the packed traversal layout: index {int(node_child.max())} "
            f"exceeds {PACK_MAX_INDEX}"
        )
    packed = np.empty((node_axis.shape[0], 2), dtype=np.int32)
    is_leaf = node_axis == AXIS_LEAF
    split_bits = np.asarray(node_split, dtype=np.float32).view(np.int32)
    packed[:, 0] = np.where(is_leaf, np.asarray(node_count, dtype=np.int32), split_bits)
    packed[:, 1] = ((node_child << PACK_SHIFT) | node_axis.astype(np.int64)).astype(np.int32)
    return packed


def cuda_defines() -> str:
    """Return the ``#define`` block prepended to every CUDA source.

    Every public upper-case integer or float32 constant of this module
    becomes ``#define KD_<NAME> (<value>)``; float32 values are written as
    exact hexadecimal literals (``0x1p-18f``). Dtype constants are left out.

    Returns
    -------
    str
    """
    lines = ["// generated by kdtree_gpu.encoding.cuda_defines(); do not edit"]
    for name, value in globals().items():
        if not name.isupper() or name.startswith("_"):
            continue
        if isinstance(value, np.float32):
            lines.append(f"#define KD_{name} ({float(value).hex()}f)")
        elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            value = int(value)
            literal = f"{value}ull" if value > 0x7FFFFFFF else (
                f"{value}ll" if value < -0x80000000 else str(value))
            lines.append(f"#define KD_{name} ({literal})")
    return "\n".join(lines) + "\n"
