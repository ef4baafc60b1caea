"""The tree as the GPU builder writes it: node records and leaf lists on the device.

Levels are written at offsets into buffers that grow by doubling (no
per-level concatenation); :meth:`TreeOutput.finish` cuts the finished tree
to its size on the device (the tree stays there;
:class:`kdtree_gpu.KdTree` makes host copies when host code asks for them).
"""

from __future__ import annotations

from ... import encoding as enc
from ..soa import TreeNodeSoA
from .workspace import pooled as workspace_pooled


# bytes a finished tree array may hold beyond its size instead of being copied
VIEW_SLACK = 1 << 15


def grown(xp, arr, rows: int, keep: int):
    """A new array of ``rows`` rows (``arr``'s other dimensions and dtype) holding
    ``arr``'s first ``keep`` rows: a buffer that outgrew its capacity."""
    bigger = xp.empty((rows, *arr.shape[1:]), dtype=arr.dtype)
    keep = min(int(keep), arr.shape[0], rows)
    if keep:
        bigger[:keep] = arr[:keep]
    return bigger


class TreeOutput:
    """Device node arrays (a :class:`TreeNodeSoA`) and the leaf list, grown by doubling.

    Small buffers are the caller's (a finished small tree may be a view of
    them), large ones the build's workspace; a growth made with
    ``reserve(..., pooled=True)`` comes from the workspace pool whatever its
    size (:func:`.workspace.pooled`), and :attr:`pooled` then says that
    :meth:`finish` must copy every array out.
    """

    def __init__(self, cp, node_capacity: int = 0, leaf_capacity: int = 0):
        self.cp = cp
        self.pooled = False  # True once a buffer may be the workspace's whatever its size
        self.nodes = TreeNodeSoA.allocate(cp, node_capacity)
        self.leaf = cp.empty(leaf_capacity, dtype=enc.LEAF_TRIS_DTYPE)

    @property
    def node_capacity(self) -> int:
        return self.nodes.size

    @property
    def leaf_capacity(self) -> int:
        return int(self.leaf.shape[0])

    def _grow(self, arr, need, used, exact):
        if need <= arr.shape[0]:
            return arr
        return grown(self.cp, arr, need if exact else max(need, 2 * arr.shape[0]),
                     arr.shape[0] if used is None else used)

    def reserve(self, num_nodes: int, num_leaf_refs: int, used_nodes=None,
                used_leaf_refs=None, exact: bool = False, pooled: bool = False) -> None:
        """Make room for ``num_nodes`` tree nodes and ``num_leaf_refs`` leaf entries,
        keeping the first ``used_nodes`` and ``used_leaf_refs`` written so far
        (default: all of them). A buffer that must grow is made at least twice
        as large (growth by doubling), or, ``exact``, just as large as asked;
        ``pooled``: from the build's workspace pool, whatever its size (after
        a larger block was freed: it is cut from that block instead of
        adding memory beside it; measured on an H100, 160 bytes per
        triangle of the bunny's peak)."""
        with workspace_pooled(pooled):
            self.nodes = TreeNodeSoA(*(self._grow(a, num_nodes, used_nodes, exact)
                                       for a in self.nodes.args()))
            self.leaf = self._grow(self.leaf, num_leaf_refs, used_leaf_refs, exact)
        self.pooled |= pooled

    def finish(self, num_nodes: int, num_leaf_refs: int, keep_below: int = 0) -> dict:
        """The tree's device arrays at their exact sizes.

        Each is a copy made with the current allocator (the caller's), so
        that the buffers can go back with the build's workspace; except
        that, when the output is not pooled, a buffer of fewer than
        ``keep_below`` bytes (the caller's allocator made it, not the
        workspace) that is at most :data:`VIEW_SLACK` bytes longer than the
        tree is returned as a view: a small build saves five copies and
        holds a few kilobytes more.

        Returns
        -------
        dict
            node_axis, node_split, node_child, node_count (num_nodes,) and
            leaf_tris (num_leaf_refs,), CuPy arrays.
        """
        if self.pooled:
            keep_below = 0  # every buffer is the workspace's

        def cut(a, n):
            if a.nbytes < keep_below and a.nbytes - n * a.itemsize <= VIEW_SLACK:
                return a[:n]
            return a[:n].copy()

        arrays = {name: cut(a, num_nodes) for name, a in self.nodes.arrays().items()}
        arrays["leaf_tris"] = cut(self.leaf, num_leaf_refs)
        self.nodes = self.leaf = None
        return arrays
