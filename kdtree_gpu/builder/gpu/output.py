"""The tree as the GPU builder writes it: node records and leaf lists on the device.

Levels are written at offsets into buffers that grow by doubling (no
per-level concatenation); :meth:`TreeOutput.finish` cuts the finished tree
to its size on the device (the tree stays there;
:class:`kdtree_gpu.KdTree` makes host copies when host code asks for them).
"""

from __future__ import annotations

from ... import encoding as enc
from ..soa import TreeNodeSoA


class TreeOutput:
    """Device node arrays (a :class:`TreeNodeSoA`) and the leaf list, grown by doubling."""

    def __init__(self, cp, node_capacity: int, leaf_capacity: int):
        self.cp = cp
        self.nodes = TreeNodeSoA.allocate(cp, node_capacity)
        self.leaf = cp.empty(leaf_capacity, dtype=enc.LEAF_TRIS_DTYPE)

    @property
    def node_capacity(self) -> int:
        return self.nodes.size

    @property
    def leaf_capacity(self) -> int:
        return int(self.leaf.shape[0])

    def _grow(self, arr, need):
        if need <= arr.shape[0]:
            return arr
        bigger = self.cp.empty(max(need, 2 * arr.shape[0]), dtype=arr.dtype)
        bigger[:arr.shape[0]] = arr
        return bigger

    def reserve(self, num_nodes: int, num_leaf_refs: int) -> None:
        """Make room for ``num_nodes`` tree nodes and ``num_leaf_refs`` leaf entries."""
        self.nodes = TreeNodeSoA(*(self._grow(a, num_nodes) for a in self.nodes.args()))
        self.leaf = self._grow(self.leaf, num_leaf_refs)

    def finish(self, num_nodes: int, num_leaf_refs: int) -> dict:
        """The tree's device arrays at their exact sizes: copies, made with the
        current allocator (the caller's), so that the buffers go back with
        the build's workspace.

        Returns
        -------
        dict
            node_axis, node_split, node_child, node_count (num_nodes,) and
            leaf_tris (num_leaf_refs,), CuPy arrays.
        """
        arrays = {name: a[:num_nodes].copy() for name, a in self.nodes.arrays().items()}
        arrays["leaf_tris"] = self.leaf[:num_leaf_refs].copy()
        self.nodes = self.leaf = None
        return arrays
