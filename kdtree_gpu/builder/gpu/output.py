"""The tree as the GPU builder writes it: node records and leaf lists on the device.

Levels are written at offsets into buffers that grow by doubling (no
per-level concatenation); :meth:`TreeOutput.finish` cuts the finished tree
to its size on the device (the tree stays there;
:class:`kdtree_gpu.KdTree` makes host copies when host code asks for them).
"""

from __future__ import annotations

from ... import encoding as enc
from ..soa import TreeNodeSoA
from .workspace import arrays_in_one_block, pooled as workspace_pooled


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
        self.leaf_final = False  # the leaf list is the tree's, at its size (pack_leaves)
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
        ``pooled``: all five in one block of the build's workspace pool,
        whatever its size (the subtree stage's growth, made after the level
        loop's block went back: one device allocation)."""
        if pooled:
            self._regrow_in_one_block(num_nodes, num_leaf_refs, used_nodes, used_leaf_refs,
                                      exact)
            return
        self.nodes = TreeNodeSoA(*(self._grow(a, num_nodes, used_nodes, exact)
                                   for a in self.nodes.args()))
        self.leaf = self._grow(self.leaf, num_leaf_refs, used_leaf_refs, exact)

    def _regrow_in_one_block(self, num_nodes, num_leaf_refs, used_nodes, used_leaf_refs, exact):
        """``reserve(pooled=True)``: when a buffer must grow, all five are made again
        in one block of the workspace pool (one device allocation)."""
        arrays = [*self.nodes.args(), self.leaf]
        needs = [num_nodes] * 4 + [num_leaf_refs]
        if all(n <= a.shape[0] for a, n in zip(arrays, needs)):
            return
        rows = [a.shape[0] if n <= a.shape[0] else (n if exact else max(n, 2 * a.shape[0]))
                for a, n in zip(arrays, needs)]
        with workspace_pooled():
            made = arrays_in_one_block(self.cp, [((r,), a.dtype) for a, r in zip(arrays, rows)])
        used = [used_nodes] * 4 + [used_leaf_refs]
        for a, view, keep in zip(arrays, made, used):
            keep = min(a.shape[0] if keep is None else int(keep), a.shape[0], view.shape[0])
            if keep:
                view[:keep] = a[:keep]
        self.nodes, self.leaf = TreeNodeSoA(*made[:4]), made[4]
        self.pooled = True

    def set_final_leaf(self, leaf) -> None:
        """Replace the leaf list by the tree's own, at its size and made with the
        caller's allocator (:func:`.workspace.lasting`), which :meth:`finish`
        hands over as it is (made in the workspace, it would hold the block
        it was cut from until then, and be copied once more)."""
        self.leaf = leaf
        self.leaf_final = True

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
        if self.leaf_final and self.leaf.shape[0] == num_leaf_refs:
            arrays["leaf_tris"] = self.leaf
        else:
            arrays["leaf_tris"] = cut(self.leaf, num_leaf_refs)
        self.nodes = self.leaf = None
        return arrays
