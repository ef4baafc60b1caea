"""The tree as the GPU builder writes it: node records and leaf lists on the device.

Levels are written at offsets into buffers that grow by doubling (no
per-level concatenation); :meth:`TreeOutput.finish` cuts the finished tree
to its size on the device (the tree stays there;
:class:`kdtree_gpu.KdTree` makes host copies when host code asks for them).
"""

from __future__ import annotations

import numpy as np

from ... import encoding as enc
from ...launch import launch
from ..soa import TreeNodeSoA
from .level_costs import stage_kernel
from .workspace import (arrays_in_one_block, pooled as workspace_pooled,
                        release_tree_blocks, tree_blocks)


# bytes a finished small tree's block may hold beyond the tree instead of being copied
VIEW_SLACK = 1 << 17
NO_PAGE = 1 << 62  # the page split of a TreeOutput without a second page: past every index
# bytes of a tree node (every TreeNodeSoA field) and of a leaf entry
NODE_BYTES = sum(dtype.itemsize for _, dtype in TreeNodeSoA.shapes(1).values())
LEAF_BYTES = np.dtype(enc.LEAF_TRIS_DTYPE).itemsize


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

    The five buffers are cut from one block (one allocation, and one block
    given back when they outgrow it). A block below the workspace's
    ``min_block`` is the caller's (a finished small tree may be a view of
    it), a larger one the build's tree pool (:func:`.workspace.tree_blocks`),
    which gives the block back as soon as the output outgrows it: 55 bytes
    per triangle of conference's tree, made as five arrays each below
    ``min_block``, stayed cached in the caller's pool once the subtree stage
    had moved the tree (measured on an H100: 530 instead of 494 bytes per
    triangle at the peak).
    A growth made with ``reserve(..., pooled=True)`` comes from the workspace
    pool whatever its size (:func:`.workspace.pooled`), and :attr:`pooled`
    then says that :meth:`finish` must copy every array out.
    """

    def __init__(self, cp, node_capacity: int = 0, leaf_capacity: int = 0,
                 first_nodes: int = 0):
        self.cp = cp
        # The fewest node rows a growth makes: a tree's top levels double its
        # nodes level by level, and growth by doubling from nothing then made
        # the buffers again at nearly every one of them (about 0.2 ms of host
        # time each, about 20 levels of armadillo subdivided twice).
        self.first_nodes = int(first_nodes)
        self.pooled = False  # True once the block may be the workspace's whatever its size
        self.leaf_final = False  # the leaf list is the tree's, at its size (pack_leaves)
        self.block_bytes = 0
        # The subtree stage's second pages (add_page): node i >= node_split is
        # row i - node_split of more_nodes; the same for the leaf list.
        self.more_nodes = self.more_leaf = None
        self.node_split = self.leaf_split = NO_PAGE
        # without room asked for, the buffers are made by the first reserve (an
        # empty block's five views cost a build about 0.08 ms of host time)
        self.nodes = self.leaf = None
        if node_capacity or leaf_capacity:
            self._make([node_capacity] * 4 + [leaf_capacity], [0] * 5, None)

    def _made(self) -> None:
        """Make the empty buffers if no reserve has made them yet."""
        if self.nodes is None:
            self._make([0] * 5, [0] * 5, None)

    @property
    def node_capacity(self) -> int:
        """The nodes there is room for (both pages)."""
        if self.more_nodes is not None:
            return self.node_split + self.more_nodes.size
        return 0 if self.nodes is None else self.nodes.size

    @property
    def leaf_capacity(self) -> int:
        """The leaf entries there is room for (both pages)."""
        if self.more_leaf is not None:
            return self.leaf_split + int(self.more_leaf.shape[0])
        return 0 if self.leaf is None else int(self.leaf.shape[0])

    def add_page(self, nodes: bool, used: int, rows: int) -> None:
        """More room for nodes (``nodes``) or leaf entries, without copying what the
        first block holds: a second page of ``rows`` rows for the indices from
        ``used`` on (the first block's rows after them stay unused), or, when
        there is one, that page made again with ``rows`` rows more than its
        rows below ``used``, which it keeps (not doubled: the old page is held
        while they are copied). For the subtree stage, whose levels
        (``cuda/build_small.cu``, KdSmallTree) and leaf packing write both
        pages; :meth:`finish` joins the node pages (the packed leaf list is
        one array)."""
        self._made()
        page = self.more_nodes if nodes else self.more_leaf
        split = used if page is None else (self.node_split if nodes else self.leaf_split)
        # (0 for a first page, or where the level began in the first block: nothing to keep)
        keep = max(0, used - split)
        if page is not None:
            rows = int(rows) + keep
        like = page if page is not None else (self.nodes if nodes else self.leaf)
        with workspace_pooled(), tree_blocks():  # (the build's, whatever its size)
            if nodes:
                made = TreeNodeSoA(*(grown(self.cp, a, rows, keep) for a in like.args()))
            else:
                made = grown(self.cp, like, rows, keep)
        if nodes:
            self.more_nodes, self.node_split = made, split
        else:
            self.more_leaf, self.leaf_split = made, split
        self.pooled = True
        del page, like, made
        release_tree_blocks()  # the page this one replaced

    def extend(self, num_nodes: int, num_leaf_refs: int) -> None:
        """Room for ``num_nodes`` tree nodes and ``num_leaf_refs`` leaf entries
        without copying what is written: where the first block is short, a
        second page of nodes and one of leaf entries, cut from one block of
        the workspace pool, for the indices from the first block's capacity
        on (nothing of the first block is given up). For the subtree stage's
        first room: a larger first block (:meth:`reserve`) copied the tree so
        far and held both blocks during the copy."""
        self._made()
        assert self.more_nodes is None and self.more_leaf is None, "extend before add_page"
        node_split, leaf_split = self.nodes.size, int(self.leaf.shape[0])
        more = (max(0, int(num_nodes) - node_split), max(0, int(num_leaf_refs) - leaf_split))
        if not any(more):
            return
        with workspace_pooled():  # (the build's, whatever its size)
            made = self._block([more[0]] * 4 + [more[1]])
        self.more_nodes, self.node_split = TreeNodeSoA(*made[:4]), node_split
        self.more_leaf, self.leaf_split = made[4], leaf_split
        self.pooled = True

    def page_args(self) -> tuple:
        """The kernel arguments of both pages: (nodes, leaf list, second page's nodes,
        its leaf list, node split, leaf split, node capacity, leaf capacity);
        without a second page, the first block stands in for it."""
        self._made()
        more_nodes = self.more_nodes if self.more_nodes is not None else self.nodes
        more_leaf = self.more_leaf if self.more_leaf is not None else self.leaf
        return (self.nodes.struct(), self.leaf, more_nodes.struct(), more_leaf,
                np.int64(self.node_split), np.int64(self.leaf_split),
                np.int64(self.node_capacity), np.int64(self.leaf_capacity))

    def _block(self, rows) -> list:
        """The four node arrays and the leaf list at ``rows`` rows (five numbers),
        cut from one block of the tree pool (:func:`.workspace.tree_blocks`)."""
        fields = [((r,), dtype) for r, (_, dtype) in zip(rows, TreeNodeSoA.shapes(1).values())]
        fields.append(((rows[4],), enc.LEAF_TRIS_DTYPE))
        with tree_blocks():
            return arrays_in_one_block(self.cp, fields)

    def _make(self, rows, keep, old):
        """The five buffers at ``rows`` rows in one new block, holding the first
        ``keep`` rows of the ``old`` ones."""
        made = self._block(rows)
        self.block_bytes = sum(a.nbytes for a in made)
        for a, view, k in zip(old or (), made, keep):
            k = min(int(k), a.shape[0], view.shape[0])
            if k:
                view[:k] = a[:k]
        self.nodes, self.leaf = TreeNodeSoA(*made[:4]), made[4]

    def reserve(self, num_nodes: int, num_leaf_refs: int, used_nodes=None,
                used_leaf_refs=None, exact: bool = False, pooled: bool = False) -> None:
        """Make room for ``num_nodes`` tree nodes and ``num_leaf_refs`` leaf entries,
        keeping the first ``used_nodes`` and ``used_leaf_refs`` written so far
        (default: all of them). When a buffer must grow, all five are made
        again in one block, the ones that grow at least twice as large
        (growth by doubling, nodes to at least ``first_nodes`` rows), or,
        ``exact``, just as large as asked;
        ``pooled``: the block comes from the build's workspace pool,
        whatever its size (the subtree stage's growth, made after the level
        loop's block went back: one device allocation)."""
        assert self.more_nodes is None and self.more_leaf is None, "reserve before add_page"
        arrays = None if self.nodes is None else [*self.nodes.args(), self.leaf]
        have = [0] * 5 if arrays is None else [a.shape[0] for a in arrays]
        needs = [num_nodes] * 4 + [num_leaf_refs]
        if all(n <= h for h, n in zip(have, needs)):
            return
        least = [self.first_nodes] * 4 + [0]
        rows = [h if n <= h else (n if exact else max(n, 2 * h, m))
                for h, n, m in zip(have, needs, least)]
        used = [h if u is None else u for h, u in zip(have, [used_nodes] * 4 + [used_leaf_refs])]
        if pooled:
            with workspace_pooled():
                self._make(rows, used, arrays)
            self.pooled = True
        else:
            self._make(rows, used, arrays)
        del arrays
        release_tree_blocks()  # the block this one replaced

    def set_final_leaf(self, leaf) -> None:
        """Replace the leaf list by the tree's own, at its size and made with the
        caller's allocator (:func:`.workspace.lasting`), which :meth:`finish`
        hands over as it is (made in the workspace, it would hold the block
        it was cut from until then, and be copied once more)."""
        self.leaf = leaf
        self.leaf_final = True
        self.more_leaf, self.leaf_split = None, NO_PAGE

    def copy_bytes(self, num_nodes: int, num_leaf_refs: int) -> int:
        """The most bytes :meth:`finish` makes for a tree of these sizes (the node
        arrays, and the leaf list unless the tree's own is set)."""
        return num_nodes * NODE_BYTES + (0 if self.leaf_final else num_leaf_refs * LEAF_BYTES)

    def _copy_nodes(self, made, num_nodes: int) -> None:
        """Write the first ``num_nodes`` node records of both pages into ``made``
        (a :class:`TreeNodeSoA` of that size): one launch of ``kd_finish_nodes``."""
        more = self.more_nodes if self.more_nodes is not None else self.nodes
        if self.cp is np:  # (NumPy standing in for CuPy: the tests without a GPU)
            split = min(self.node_split, num_nodes)
            for a, first, second in zip(made.args(), self.nodes.args(), more.args()):
                a[:split] = first[:split]
                a[split:] = second[:num_nodes - split]
            return
        launch("finish tree: nodes", stage_kernel("kd_finish_nodes"), num_nodes,
               (self.nodes.struct(), more.struct(), np.int64(self.node_split),
                np.int64(num_nodes), made.struct()))

    def finish(self, num_nodes: int, num_leaf_refs: int, keep_below: int = 0) -> dict:
        """The tree's device arrays at their exact sizes.

        Copies made with the current allocator (the caller's), so that the
        buffers can go back with the build's workspace: the four node arrays
        cut from one new block, the leaf list one array; except that, when
        the output is not pooled, a block of fewer than
        ``keep_below`` bytes (the caller's allocator made it, not the
        workspace) that holds at most :data:`VIEW_SLACK` bytes beyond the
        tree is returned as views: a small build saves five copies and holds
        some kilobytes more.

        Returns
        -------
        dict
            node_axis, node_split, node_child, node_count (num_nodes,) and
            leaf_tris (num_leaf_refs,), CuPy arrays.
        """
        self._made()
        final_leaf = self.leaf_final and self.leaf.shape[0] == num_leaf_refs
        nodes = self.nodes.arrays()
        used = sum(num_nodes * a.itemsize for a in nodes.values())
        used += 0 if final_leaf else num_leaf_refs * self.leaf.itemsize
        # the pooled block is the workspace's: it goes back with the build
        views = (not self.pooled and self.block_bytes < keep_below
                 and self.block_bytes - used <= VIEW_SLACK)
        if views:
            arrays = {name: a[:num_nodes] for name, a in nodes.items()}
        else:
            # the four node arrays in one block, written from both pages by one
            # launch (a copy or a join of the pages each: 0.23 ms of the bunny's
            # host time against 0.09-0.10 for this, H200)
            made = TreeNodeSoA(*arrays_in_one_block(
                self.cp, [((num_nodes,), a.dtype) for a in nodes.values()]))
            self._copy_nodes(made, num_nodes)
            arrays = made.arrays()
        if final_leaf:
            arrays["leaf_tris"] = self.leaf
        elif self.more_leaf is not None and num_leaf_refs > self.leaf_split:
            # the first page's entries below the split, then the second page's
            arrays["leaf_tris"] = self.cp.concatenate(
                [self.leaf[:self.leaf_split], self.more_leaf[:num_leaf_refs - self.leaf_split]])
        else:
            leaf = self.leaf[:num_leaf_refs]
            arrays["leaf_tris"] = leaf if views else leaf.copy()
        self.nodes = self.leaf = self.more_nodes = self.more_leaf = None
        return arrays
