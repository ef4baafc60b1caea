"""The tree as the GPU builder writes it: node records and leaf lists on the device.

Levels are written at offsets into buffers that grow by doubling (no
per-level concatenation); :meth:`TreeOutput.download` brings the finished
tree to the host.
"""

from __future__ import annotations

import numpy as np

from ... import encoding as enc
from ..soa import TreeNodeSoA


class TreeOutput:
    """Device node arrays (a :class:`TreeNodeSoA`) and the leaf list, grown by doubling."""

    # Trees up to this many bytes are packed for one copy (below it, each
    # copy's synchronization costs more than the packing); larger ones copy
    # array by array (packing measured slower on an H200 for 260 MB).
    PACK_BYTES = 1 << 24

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

    def download(self, num_nodes: int, num_leaf_refs: int) -> list:
        """The tree's arrays on the host. A small tree is packed into one
        device buffer and copied once (one synchronization instead of five).

        Returns
        -------
        list of numpy.ndarray
            node_axis, node_split, node_child, node_count (num_nodes,) and
            leaf_tris (num_leaf_refs,).
        """
        cp = self.cp
        parts = [a[:num_nodes] for a in self.nodes.args()] + [self.leaf[:num_leaf_refs]]
        if sum(part.nbytes for part in parts) > self.PACK_BYTES:
            return [part.get() for part in parts]
        offsets, total = [], 0
        for part in parts:
            offsets.append(total)
            total += (part.nbytes + 7) // 8 * 8  # keep every part 8-byte aligned
        packed = cp.empty(total, dtype=np.uint8)
        for part, offset in zip(parts, offsets):
            packed[offset:offset + part.nbytes].view(part.dtype)[...] = part
        host = packed.get()
        return [host[offset:offset + part.nbytes].view(part.dtype)
                for part, offset in zip(parts, offsets)]
