"""The tree as the CPU traversal reads it: packed nodes in cache-line clusters.

The layout (:class:`CpuLayout`) is made once per tree and kept in its cache
(:func:`cpu_layout`): 8-byte nodes (:func:`kdtree_gpu.encoding.pack_nodes`,
split positions times the trace scale ``s``) and the scaled vertices of every
triangle in one row of 9 floats.

Node order. A node's children are a pair of neighbouring nodes, as in the
tree; the pairs are placed in clusters of :data:`CLUSTER_PAIRS` (256 bytes,
four cache lines): a cluster takes a pair and its descendants' pairs
breadth first until it is full, and the pairs below it start the next
clusters, depth first. A ray going down the tree then finds the next three
or four levels in lines it has just read, whichever child it takes (in the
builder's depth-first order only the left path is near). The order decides
nothing: the traversal visits the same nodes in the same order.
"""

from __future__ import annotations

import numba
import numpy as np

from .. import encoding as enc
from .scale import trace_scale
from .watertight import pack_triangles

# sibling pairs per cluster of the node order (16 bytes each: 256 bytes); of
# 4, 8, 16 and 32, 8 and 16 did best on 1M diffuse rays (bunny, conference:
# 1.08-1.16x the depth-first order; camera rays within noise)
CLUSTER_PAIRS = 16


@numba.njit(cache=True, error_model="numpy")
def node_order(child, leaf, cluster_pairs):
    """The slot of every node in the clustered order (module docstring).

    Parameters
    ----------
    child : (num_nodes,) int64
        ``node_child`` (interior: the left child, whose sibling is next).
    leaf : (num_nodes,) bool
    cluster_pairs : int

    Returns
    -------
    slot : (num_nodes,) int64
        The root in slot 0, pairs from slot 2 on (slot 1 is left empty, so
        that every pair fills an aligned 16 bytes).
    num_slots : int
    """
    n = child.shape[0]
    slot = np.full(n, -1, np.int64)
    slot[0] = 0
    next_slot = 2
    roots = np.empty(n, np.int64)  # first nodes of the pairs that start clusters
    queue = np.empty(n, np.int64)
    top = 0
    if not leaf[0]:
        roots[0] = child[0]
        top = 1
    while top > 0:
        top -= 1
        queue[0] = roots[top]
        size = 1
        head = 0
        while head < size and head < cluster_pairs:
            first = queue[head]
            head += 1
            slot[first] = next_slot
            slot[first + 1] = next_slot + 1
            next_slot += 2
            for c in (first, first + 1):
                if not leaf[c]:
                    queue[size] = child[c]
                    size += 1
        # the pairs left over start clusters, the leftmost first
        for k in range(size - 1, head - 1, -1):
            roots[top] = queue[k]
            top += 1
    return slot, next_slot


def reorder_nodes(node_axis, node_split, node_child, node_count):
    """A tree's node arrays in the order of :func:`node_order` (an empty leaf in slot 1).

    Returns
    -------
    node_axis, node_split, node_child, node_count
        The same nodes in their slots, interior children renumbered; leaves
        keep their offsets into ``leaf_tris``.
    """
    node_axis = np.asarray(node_axis)
    leaf = node_axis == enc.AXIS_LEAF
    child = np.asarray(node_child, np.int64)
    slot, num_slots = node_order(child, leaf, CLUSTER_PAIRS)
    axis = np.full(num_slots, enc.AXIS_LEAF, node_axis.dtype)
    split = np.zeros(num_slots, np.float32)
    new_child = np.zeros(num_slots, np.int64)
    count = np.zeros(num_slots, np.int32)
    axis[slot] = node_axis
    split[slot] = node_split
    count[slot] = node_count
    new_child[slot] = np.where(leaf, child, slot[np.where(leaf, 0, child)])
    return axis, split, new_child, count


class CpuLayout:
    """A tree's traversal data on the CPU (made once, kept in the tree's cache).

    Attributes
    ----------
    scale : float32
        The trace scale of the root box.
    bounds : (2, 3) float32
        The root box (unscaled).
    box : (6,) float32
        The root box times ``scale``: ``lo_x, lo_y, lo_z, hi_x, hi_y, hi_z``.
    nodes : (2 * num_slots,) int32
        Packed nodes (:func:`kdtree_gpu.encoding.pack_nodes`) in the order of
        :func:`node_order`, node ``i`` in ``nodes[2 i : 2 i + 2]``, split
        positions times ``scale``; the root is node 0.
    splits : (2 * num_slots,) float32
        The same memory as ``nodes``, read as float32 (``splits[2 i]``).
    tris : (9 * num_triangles,) float32
        Scaled vertices of every triangle, ``v0 v1 v2`` (x, y, z each).
    tri_ids : (num_refs,) int32
        ``leaf_tris``.
    stack_size : int
        Entries of the traversal stack (the tree's depth + 1).
    """

    def __init__(self, node_axis, node_split, node_child, node_count, leaf_tris, bounds,
                 vertices, faces, depth: int):
        # a tree's arrays (KdTree's names) and its depth: no KdTree needed, so
        # that the ray kernels can be compiled without building one
        self.bounds = np.ascontiguousarray(bounds, dtype=np.float32)
        self.scale = trace_scale(self.bounds)
        self.box = (self.bounds * self.scale).reshape(-1)
        split = (np.asarray(node_split, dtype=np.float32) * self.scale).astype(np.float32)
        self.nodes = enc.pack_nodes(*reorder_nodes(node_axis, split, node_child,
                                                   node_count)).reshape(-1)
        self.splits = self.nodes.view(np.float32)
        self.tri_ids = np.ascontiguousarray(leaf_tris, dtype=np.int32)
        self.tris = pack_triangles(vertices, faces, np.arange(np.shape(faces)[0]),
                                   self.scale).reshape(-1)
        self.stack_size = int(depth) + 1


_LAYOUT_ARRAYS = ("node_axis", "node_split", "node_child", "node_count", "leaf_tris", "bounds",
                  "vertices", "faces")


def cpu_layout(tree) -> CpuLayout:
    """The tree's CPU traversal layout, made on first use and cached on the tree."""
    key = tuple(id(getattr(tree, name)) for name in _LAYOUT_ARRAYS)
    cached = tree._device_cache.get("cpu_layout")
    if cached is not None and cached[0] == key:
        return cached[1]
    from ..tree.check import walk_levels

    layout = CpuLayout(*(getattr(tree, name) for name in _LAYOUT_ARRAYS),
                       depth=int(walk_levels(tree)[0].max()))
    tree._device_cache["cpu_layout"] = (key, layout)
    return layout
