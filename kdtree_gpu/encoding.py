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
AXIS_X = 0
AXIS_Y = 1
AXIS_Z = 2
AXIS_LEAF = 3

NODE_AXIS_DTYPE = np.int8
NODE_SPLIT_DTYPE = np.float32
NODE_CHILD_DTYPE = np.int32
NODE_COUNT_DTYPE = np.int32
LEAF_TRIS_DTYPE = np.int32

# --- events ----------------------------------------------------------------
EVENT_END = 0
EVENT_PLANAR = 1
EVENT_START = 2

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

# --- status record of the level loop kernel (builder.build_levels_grid) -----
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
LOOP_SLOTS = 13
LOOP_DONE = 0
LOOP_STOPPED = 1

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

    Returns
    -------
    str
        One ``#define KD_<NAME> <value>`` line per encoding constant.
    """
    names = {
        "AXIS_LEAF": AXIS_LEAF,
        "EVENT_END": EVENT_END,
        "EVENT_PLANAR": EVENT_PLANAR,
        "EVENT_START": EVENT_START,
        "SIDE_LEFT": SIDE_LEFT,
        "SIDE_RIGHT": SIDE_RIGHT,
        "CLASS_LEFT": CLASS_LEFT,
        "CLASS_RIGHT": CLASS_RIGHT,
        "CLASS_BOTH": CLASS_BOTH,
        "PACK_SHIFT": PACK_SHIFT,
        "PACK_AXIS_MASK": PACK_AXIS_MASK,
        "NO_HIT": NO_HIT,
        "NO_NODE": NO_NODE,
        "LOOP_STATE": LOOP_STATE,
        "LOOP_LEVEL": LOOP_LEVEL,
        "LOOP_NODES": LOOP_NODES,
        "LOOP_REFS": LOOP_REFS,
        "LOOP_EVENTS": LOOP_EVENTS,
        "LOOP_LEVEL_BASE": LOOP_LEVEL_BASE,
        "LOOP_LEAF_BASE": LOOP_LEAF_BASE,
        "LOOP_BUFFER": LOOP_BUFFER,
        "LOOP_NEED_NODES": LOOP_NEED_NODES,
        "LOOP_NEED_REFS": LOOP_NEED_REFS,
        "LOOP_NEED_EVENTS": LOOP_NEED_EVENTS,
        "LOOP_NEED_TREE_NODES": LOOP_NEED_TREE_NODES,
        "LOOP_NEED_LEAF_REFS": LOOP_NEED_LEAF_REFS,
        "LOOP_SLOTS": LOOP_SLOTS,
        "LOOP_DONE": LOOP_DONE,
        "LOOP_STOPPED": LOOP_STOPPED,
    }
    lines = ["// generated by kdtree_gpu.encoding.cuda_defines(); do not edit"]
    lines += [f"#define KD_{k} ({v})" for k, v in names.items()]
    return "\n".join(lines) + "\n"
