"""Compare two kd-trees from the root down, ignoring node order."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..encoding import AXIS_LEAF

_AXIS_NAMES = "xyz"


def compare_trees(a, b, atol_split: float = 0.0) -> Optional[str]:
    """Describe the first structural difference between two trees.

    Both trees are walked from their roots in the same order; node indices may
    differ. Interior nodes must have the same axis and split position (within
    ``atol_split``), leaves the same triangle lists.

    Parameters
    ----------
    a, b : KdTree
    atol_split : float
        Allowed absolute difference of split positions.

    Returns
    -------
    str or None
        ``None`` if the trees are identical; otherwise a message with the path
        from the root (``L``/``R`` steps) to the first differing node.
    """
    if a.faces.shape != b.faces.shape:
        return f"different meshes: {a.faces.shape[0]} vs {b.faces.shape[0]} triangles"
    if not np.array_equal(a.bounds, b.bounds):
        return f"root bounds differ: {a.bounds.tolist()} vs {b.bounds.tolist()}"
    stack = [(0, 0, "")]
    while stack:
        ia, ib, path = stack.pop()
        where = f"at node path '{path or 'root'}' (nodes {ia} / {ib})"
        axa, axb = int(a.node_axis[ia]), int(b.node_axis[ib])
        if (axa == AXIS_LEAF) != (axb == AXIS_LEAF):
            kinds = ["leaf" if x == AXIS_LEAF else f"split on {_AXIS_NAMES[x]}" for x in (axa, axb)]
            return f"{where}: {kinds[0]} vs {kinds[1]}"
        if axa == AXIS_LEAF:
            ta = a.leaf_tris[a.node_child[ia]:a.node_child[ia] + a.node_count[ia]]
            tb = b.leaf_tris[b.node_child[ib]:b.node_child[ib] + b.node_count[ib]]
            if not np.array_equal(np.sort(ta), np.sort(tb)):
                extra = np.setdiff1d(ta, tb)[:5].tolist()
                missing = np.setdiff1d(tb, ta)[:5].tolist()
                return (f"{where}: leaf triangles differ ({ta.size} vs {tb.size}; "
                        f"only in first {extra}, only in second {missing})")
            continue
        if axa != axb:
            return f"{where}: split axis {_AXIS_NAMES[axa]} vs {_AXIS_NAMES[axb]}"
        sa, sb = float(a.node_split[ia]), float(b.node_split[ib])
        if abs(sa - sb) > atol_split:
            return f"{where}: split position {sa!r} vs {sb!r} on {_AXIS_NAMES[axa]}"
        ca, cb = int(a.node_child[ia]), int(b.node_child[ib])
        stack.append((ca + 1, cb + 1, path + "R"))
        stack.append((ca, cb, path + "L"))
    return None
