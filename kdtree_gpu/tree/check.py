"""Statistics and invariants of a :class:`~kdtree_gpu.tree.KdTree`.

Both functions walk the tree from the root down (:func:`walk_levels`,
compiled with numba) and check or summarise it with vectorised NumPy.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from .. import encoding as enc
from ..config import box_half_area
from ..mesh import degenerate_mask, triangle_bounds

_AXIS_NAMES = "xyz"


# what _walk_levels found wrong (0: nothing)
_WALK_OK, _WALK_CYCLE, _WALK_SPLIT_OUTSIDE, _WALK_CHILD_RANGE, _WALK_AXIS = range(5)


@numba.njit(cache=True, error_model="numpy")
def _walk_levels(node_axis, node_split, node_child, root_lo, root_hi, check, leaf_axis,
                 node_depth, node_lo, node_hi):
    """The walk of :func:`walk_levels`, depth first; returns (what went wrong, at which node).

    Depth first (left subtree first) rather than level by level: with the
    children near their parent (depth-first files) or a level after it (the
    GPU builder's level order) a stack walk reads the nodes 2-3x faster than
    a level walk. Every axis and child index is checked before it is used.
    """
    n = node_axis.shape[0]
    stack = np.empty(n + 2, np.int64)  # one pop pushes two: at most visits + 1 entries
    stack[0] = 0
    top, visits = 1, 0
    node_depth[0] = 0
    node_lo[0, :] = root_lo
    node_hi[0, :] = root_hi
    while top:
        top -= 1
        node = stack[top]
        visits += 1
        if visits > n:  # a node reached twice: the child links loop back
            return _WALK_CYCLE, -1
        axis = node_axis[node]
        if axis == leaf_axis:
            continue
        if axis < 0 or axis > 2:
            return _WALK_AXIS, node
        split = node_split[node]
        if check and not (node_lo[node, axis] < split < node_hi[node, axis]):
            return _WALK_SPLIT_OUTSIDE, node
        left = np.int64(node_child[node])
        if left < 1 or left + 1 >= n:
            return _WALK_CHILD_RANGE, node
        for k in range(3):
            node_lo[left, k] = node_lo[left + 1, k] = node_lo[node, k]
            node_hi[left, k] = node_hi[left + 1, k] = node_hi[node, k]
        node_hi[left, axis] = split
        node_lo[left + 1, axis] = split
        node_depth[left] = node_depth[left + 1] = node_depth[node] + 1
        stack[top] = left + 1
        stack[top + 1] = left
        top += 2
    return _WALK_OK, -1


WALK_COMPILE_MESSAGE = "kdtree-gpu: compiling the tree walk, once per machine (a few seconds)..."


def _walk(tree, check):
    num_nodes = tree.num_nodes
    node_depth = np.full(num_nodes, -1, dtype=np.int32)
    node_lo = np.empty((num_nodes, 3), dtype=np.float32)
    node_hi = np.empty((num_nodes, 3), dtype=np.float32)
    bounds = np.ascontiguousarray(tree.bounds, dtype=np.float32)
    what, node = _walk_levels(np.asarray(tree.node_axis), np.asarray(tree.node_split),
                              np.asarray(tree.node_child), bounds[0], bounds[1], bool(check),
                              enc.AXIS_LEAF, node_depth, node_lo, node_hi)
    return what, node, node_depth, node_lo, node_hi


def _walk_small():
    # a three-node tree with a real tree's argument types, checked and not, and its cost
    from types import SimpleNamespace

    tree = SimpleNamespace(
        num_nodes=3, node_axis=np.array([0, enc.AXIS_LEAF, enc.AXIS_LEAF], enc.NODE_AXIS_DTYPE),
        node_split=np.array([0.5, 0, 0], enc.NODE_SPLIT_DTYPE),
        node_child=np.array([1, 0, 0], enc.NODE_CHILD_DTYPE),
        bounds=np.array([[0, 0, 0], [1, 1, 1]], np.float32))
    for check in (False, True):
        _, _, _, node_lo, node_hi = _walk(tree, check)
    _sah_terms_kernel(tree.node_axis, np.zeros(3, enc.NODE_COUNT_DTYPE), node_lo, node_hi, 1.0,
                      1.0, enc.AXIS_LEAF, np.zeros(_EXACT_LIMBS, np.int64))


def warm_up_walk():
    """Compile (or load) the tree walk once per process, saying so if numba compiles.

    Called by :func:`walk_levels`, and inside the CPU ray queries' warm-up
    (whose message then covers it).
    """
    from ..warmup import compile_once

    return compile_once(_walk_small, name="tree walk", package=__name__.split(".")[0],
                        message=WALK_COMPILE_MESSAGE)


def walk_levels(tree, check=False):
    """Visit the tree from the root down: every node's depth and box.

    Parameters
    ----------
    tree : KdTree
    check : bool
        Raise ``ValueError`` on a split outside its node box.

    Returns
    -------
    node_depth : (num_nodes,) int32
        Depth of every node reached from the root (root = 0), -1 for the
        others.
    node_lo, node_hi : (num_nodes, 3) float32
        Box of every reached node (the root box split by the ancestors'
        planes); undefined for nodes that were not reached.

    Raises
    ------
    ValueError
        A walk that does not end (a cycle reachable from the root), an
        interior node whose children lie outside the node arrays or whose
        axis is not 0, 1 or 2; with ``check``, a split outside its node box.

    Notes
    -----
    Compiled with numba: one pass over the nodes, about 12x faster than the
    level-by-level NumPy walk it replaces on a 4.2M-node tree (which took 60% of
    :meth:`KdTree.stats`, and stats most of ``kdtree-gpu build``'s time on a
    GPU). With ``check``, the bad split reported is the first in depth-first
    order.
    """
    warm_up_walk()
    what, node, node_depth, node_lo, node_hi = _walk(tree, check)
    num_nodes = tree.num_nodes
    if what == _WALK_AXIS:
        raise ValueError(f"check_tree: array shapes and dtypes: node {node} has axis "
                         f"{int(tree.node_axis[node])}, not 0..3")
    if what == _WALK_CYCLE:
        raise ValueError("check_tree: tree structure: the child links form a cycle")
    if what == _WALK_CHILD_RANGE:
        raise ValueError(f"check_tree: children in range: interior node {node} has children "
                         f"{int(tree.node_child[node])}, {int(tree.node_child[node]) + 1} "
                         f"outside [1, {num_nodes}) (node 0 is the root)")
    if what == _WALK_SPLIT_OUTSIDE:
        axis, split = int(tree.node_axis[node]), float(tree.node_split[node])
        raise ValueError(
            f"check_tree: split inside node box: node {node} splits "
            f"{_AXIS_NAMES[axis]} at {split!r}, not strictly inside its box "
            f"[{float(node_lo[node, axis])!r}, {float(node_hi[node, axis])!r}] on that axis"
        )
    return node_depth, node_lo, node_hi


# --- the SAH cost summed exactly ---------------------------------------------------------
# A double is m * 2**e with an integer m < 2**53 and e >= -1074; the sum of
# non-negative doubles is kept exactly as 32-bit limbs of weight 2**(32 i - 1074)
# in int64 slots (each addition puts less than 2**32 in a slot; carries move up
# every _CARRY_EVERY terms), then rounded once in Python. The result is the
# correctly rounded sum, as math.fsum's, so it does not depend on the order.
_EXACT_LIMBS = 72  # 2**(32 * 72 - 1074) is above any finite double's sum of 2**31 terms
_CARRY_EVERY = 1 << 28
_half_area = numba.njit(inline="always")(box_half_area)


@numba.njit(inline="always")
def _add_exact(limbs, value):
    # value: a finite double >= 0
    if value == 0.0:
        return
    e = max(math.frexp(value)[1] - 53, -1074)
    m = np.int64(math.ldexp(value, -e))  # exact: value is a multiple of 2**e
    position = e + 1074
    k, r = position >> 5, position & 31
    low = (m & 0xFFFFFFFF) << r  # < 2**63
    high = (m >> 32) << r  # < 2**52
    limbs[k] += low & 0xFFFFFFFF
    limbs[k + 1] += (low >> 32) + (high & 0xFFFFFFFF)
    limbs[k + 2] += high >> 32


@numba.njit(inline="always")
def _carry(limbs):
    for i in range(limbs.shape[0] - 1):
        limbs[i + 1] += limbs[i] >> 32
        limbs[i] &= 0xFFFFFFFF


@numba.njit(cache=True, error_model="numpy")
def _exact_sum_kernel(values, limbs):
    for i in range(values.shape[0]):
        v = values[i]
        if not (v >= 0.0 and v < np.inf):
            return False
        _add_exact(limbs, v)
        if (i + 1) % _CARRY_EVERY == 0:
            _carry(limbs)
    _carry(limbs)
    return True


@numba.njit(cache=True, error_model="numpy")
def _sah_terms_kernel(node_axis, node_count, node_lo, node_hi, k_traversal, k_intersect,
                      leaf_axis, limbs):
    # every node's SAH term, as tree_stats defines it (float64 half areas of the
    # float32 boxes, config.box_half_area), summed exactly; returns the root's
    # half area, or -1.0 when a term is negative or not finite
    root_area = 0.0
    for i in range(node_axis.shape[0]):
        area = _half_area(np.float64(node_hi[i, 0]) - np.float64(node_lo[i, 0]),
                          np.float64(node_hi[i, 1]) - np.float64(node_lo[i, 1]),
                          np.float64(node_hi[i, 2]) - np.float64(node_lo[i, 2]))
        if i == 0:
            root_area = area
        if node_axis[i] == leaf_axis:
            term = k_intersect * np.float64(node_count[i]) * area
        else:
            term = k_traversal * area
        if not (term >= 0.0 and term < np.inf):
            return -1.0
        _add_exact(limbs, term)
        if (i + 1) % _CARRY_EVERY == 0:
            _carry(limbs)
    _carry(limbs)
    return root_area


def _limbs_value(limbs) -> float:
    """The correctly rounded double of the exact sum held in ``limbs`` (Python's int
    true division rounds correctly)."""
    total = 0
    for i in range(len(limbs) - 1, -1, -1):
        total = (total << 32) + int(limbs[i])
    return total / (1 << 1074)


def exact_sum(values) -> float:
    """The correctly rounded sum of finite float64 values >= 0 (what ``math.fsum`` gives),
    in compiled code: the accumulator of :func:`tree_stats`'s SAH cost.

    Raises
    ------
    ValueError
        A value is negative or not finite.
    """
    values = np.ascontiguousarray(values, dtype=np.float64)
    limbs = np.zeros(_EXACT_LIMBS, np.int64)
    if not _exact_sum_kernel(values, limbs):
        raise ValueError("exact_sum: the values must be finite and >= 0")
    return _limbs_value(limbs)


def tree_stats(tree) -> dict:
    """Size, shape and SAH cost of a tree.

    Parameters
    ----------
    tree : KdTree
        A valid tree (see :func:`check_tree`).

    Returns
    -------
    dict
        ``nodes``, ``interior``, ``leaves``, ``empty_leaves``: node counts.
        ``max_depth``: deepest node (root = 0). ``mean_leaf_depth``: over all
        leaves. ``refs``: entries of ``leaf_tris``. ``triangles``: mesh
        triangles; ``degenerate``: those left out of the tree.
        ``refs_per_tri``: refs / non-degenerate triangles.
        ``max_leaf_size``; ``mean_leaf_size``: over non-empty leaves.
        ``sah_cost``: ``sum_interior K_T SA(n)/SA(root) + sum_leaves K_I N SA(n)/SA(root)``
        (float64, half areas from :func:`kdtree_gpu.config.box_half_area`, no
        empty bonus; summed exactly, so the same for any node order).
        ``bytes``: memory of the tree arrays (nodes, ``leaf_tris``, bounds);
        ``mesh_bytes``: vertices and faces.
    """
    node_depth, node_lo, node_hi = walk_levels(tree)
    is_leaf = tree.leaf_mask()
    leaf_count = tree.node_count[is_leaf].astype(np.int64)
    num_leaves = int(is_leaf.sum())
    nonempty = leaf_count > 0

    cfg = tree.config
    # the exact sum rounded once, so the cost does not depend on the node
    # order (a NumPy sum would differ in the last bits between two orders of
    # the same tree)
    limbs = np.zeros(_EXACT_LIMBS, np.int64)
    root_area = _sah_terms_kernel(np.asarray(tree.node_axis), np.asarray(tree.node_count),
                                  node_lo, node_hi, float(cfg.k_traversal),
                                  float(cfg.k_intersect), enc.AXIS_LEAF, limbs)
    # NaN for a tree no builder makes (a box turned inside out, a negative count)
    sah_cost = _limbs_value(limbs) / root_area if root_area > 0 else float("nan")

    num_valid = tree.num_triangles - tree.num_degenerate
    tree_arrays = (tree.node_axis, tree.node_split, tree.node_child, tree.node_count,
                   tree.leaf_tris, tree.bounds)
    return {
        "nodes": tree.num_nodes,
        "interior": tree.num_nodes - num_leaves,
        "leaves": num_leaves,
        "empty_leaves": int((leaf_count == 0).sum()),
        "max_depth": int(node_depth.max()),
        "mean_leaf_depth": float(node_depth[is_leaf].mean()),
        "refs": tree.num_refs,
        "refs_per_tri": tree.num_refs / num_valid if num_valid > 0 else float("nan"),
        "max_leaf_size": int(leaf_count.max()) if num_leaves else 0,
        "mean_leaf_size": float(leaf_count[nonempty].mean()) if nonempty.any() else 0.0,
        "degenerate": tree.num_degenerate,
        "triangles": tree.num_triangles,
        "sah_cost": sah_cost,
        "bytes": int(sum(a.nbytes for a in tree_arrays)),
        "mesh_bytes": int(tree.vertices.nbytes + tree.faces.nbytes),
    }


def _fail(invariant, detail):
    raise ValueError(f"check_tree: {invariant}: {detail}")


def _check_arrays(tree):
    expected = {
        "node_axis": enc.NODE_AXIS_DTYPE, "node_split": enc.NODE_SPLIT_DTYPE,
        "node_child": enc.NODE_CHILD_DTYPE, "node_count": enc.NODE_COUNT_DTYPE,
        "leaf_tris": enc.LEAF_TRIS_DTYPE,
    }
    num_nodes = tree.node_axis.shape[0] if tree.node_axis.ndim == 1 else -1
    for name, dtype in expected.items():
        a = getattr(tree, name)
        if not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim != 1:
            _fail("array shapes and dtypes",
                  f"{name} must be a 1-D {np.dtype(dtype)} NumPy array, got "
                  f"{type(a).__name__} {getattr(a, 'dtype', '?')} {getattr(a, 'shape', '?')}")
        if name.startswith("node_") and a.shape[0] != num_nodes:
            _fail("array shapes and dtypes",
                  f"{name} has {a.shape[0]} entries, node_axis has {num_nodes}")
    if num_nodes < 1:
        _fail("array shapes and dtypes", "the tree has no nodes")
    for name, shape, dtype in (("bounds", (2, 3), np.float32), ("vertices", None, np.float32),
                               ("faces", None, np.int32)):
        a = getattr(tree, name)
        ok = isinstance(a, np.ndarray) and a.dtype == dtype
        ok = ok and (a.shape == shape if shape else a.ndim == 2 and a.shape[1] == 3)
        if not ok:
            want = shape if shape else "(n, 3)"
            _fail("array shapes and dtypes",
                  f"{name} must be a {np.dtype(dtype)} array of shape {want}, got "
                  f"{getattr(a, 'dtype', '?')} {getattr(a, 'shape', '?')}")
    if not np.all(np.isfinite(tree.bounds)) or np.any(tree.bounds[0] > tree.bounds[1]):
        _fail("array shapes and dtypes", f"bounds are not a finite box: {tree.bounds.tolist()}")
    bad_axis = (tree.node_axis < 0) | (tree.node_axis > enc.AXIS_LEAF)
    if bad_axis.any():
        i = int(np.flatnonzero(bad_axis)[0])
        _fail("array shapes and dtypes", f"node {i} has axis {int(tree.node_axis[i])}, not 0..3")


def _check_structure(tree):
    num_nodes = tree.num_nodes
    interior = np.flatnonzero(~tree.leaf_mask())
    left = tree.node_child[interior].astype(np.int64)
    bad = (left < 1) | (left + 1 >= num_nodes)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        _fail("children in range",
              f"interior node {int(interior[i])} has children {int(left[i])}, {int(left[i]) + 1} "
              f"outside [1, {num_nodes}) (node 0 is the root)")
    nonzero = tree.node_count[interior] != 0
    if nonzero.any():
        i = int(interior[np.flatnonzero(nonzero)[0]])
        _fail("children in range",
              f"interior node {i} has node_count {int(tree.node_count[i])}, not 0")
    num_parents = np.bincount(np.concatenate([left, left + 1]), minlength=num_nodes)
    if num_parents[0] != 0:
        _fail("node 0 is the root", "node 0 is the child of another node")
    if (num_parents[1:] > 1).any():
        i = int(np.flatnonzero(num_parents[1:] > 1)[0]) + 1
        _fail("each node reached exactly once",
              f"node {i} is the child of {int(num_parents[i])} nodes")
    if (num_parents[1:] == 0).any():
        i = int(np.flatnonzero(num_parents[1:] == 0)[0]) + 1
        _fail("each node reached exactly once", f"node {i} is no node's child (orphan)")
    node_depth, node_lo, node_hi = walk_levels(tree, check=True)
    if (node_depth < 0).any():
        i = int(np.flatnonzero(node_depth < 0)[0])
        _fail("each node reached exactly once",
              f"node {i} is not reached from the root (the child links form a cycle)")
    return node_lo, node_hi


def _check_leaves(tree, node_lo, node_hi):
    leaves = np.flatnonzero(tree.leaf_mask())
    offset = tree.node_child[leaves].astype(np.int64)
    count = tree.node_count[leaves].astype(np.int64)
    bad = (offset < 0) | (count < 0) | (offset + count > tree.num_refs)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        _fail("leaf ranges inside leaf_tris",
              f"leaf node {int(leaves[i])} has range [{int(offset[i])}, "
              f"{int(offset[i] + count[i])}) outside leaf_tris of length {tree.num_refs}")
    bad = (tree.leaf_tris < 0) | (tree.leaf_tris >= tree.num_triangles)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        _fail("triangle ids in range",
              f"leaf_tris[{i}] = {int(tree.leaf_tris[i])} is not a triangle of a "
              f"{tree.num_triangles}-triangle mesh")
    if (tree.faces < 0).any() or (tree.faces >= tree.vertices.shape[0]).any():
        _fail("triangle ids in range", "faces hold vertex indices out of range")

    # one row per (leaf, reference): which leaf, which entry of leaf_tris
    total = int(count.sum())
    ref_leaf = np.repeat(leaves, count)
    first = np.repeat(np.cumsum(count) - count, count)
    ref_pos = np.repeat(offset, count) + (np.arange(total, dtype=np.int64) - first)
    ref_tri = tree.leaf_tris[ref_pos]

    degenerate = degenerate_mask(tree.vertices, tree.faces)
    referenced = np.zeros(tree.num_triangles, dtype=bool)
    referenced[ref_tri] = True
    missing = ~degenerate & ~referenced
    if missing.any():
        _fail("every non-degenerate triangle is referenced",
              f"triangle {int(np.flatnonzero(missing)[0])} is in no leaf "
              f"({int(missing.sum())} such triangles)")
    wrong = degenerate & referenced
    if wrong.any():
        _fail("no degenerate triangle is referenced",
              f"degenerate (zero-area) triangle {int(np.flatnonzero(wrong)[0])} is in a leaf")
    if int(degenerate.sum()) != tree.num_degenerate:
        _fail("num_degenerate matches the mesh",
              f"the tree says {tree.num_degenerate}, the mesh has {int(degenerate.sum())}")

    tri_lo, tri_hi = triangle_bounds(tree.vertices, tree.faces)
    if (~degenerate).any():
        root = np.stack([tri_lo[~degenerate].min(axis=0), tri_hi[~degenerate].max(axis=0)])
        if not np.array_equal(root, tree.bounds):
            _fail("root box is the union of the triangle boxes",
                  f"bounds {tree.bounds.tolist()}, triangle boxes give {root.tolist()}")

    meets = np.all((tri_lo[ref_tri] <= node_hi[ref_leaf]) & (tri_hi[ref_tri] >= node_lo[ref_leaf]),
                   axis=1)
    if not meets.all():
        j = int(np.flatnonzero(~meets)[0])
        leaf, tri = int(ref_leaf[j]), int(ref_tri[j])
        _fail("every reference meets its leaf box",
              f"triangle {tri} (box {tri_lo[tri].tolist()} - {tri_hi[tri].tolist()}) is in leaf "
              f"{leaf} whose box {node_lo[leaf].tolist()} - {node_hi[leaf].tolist()} "
              "it does not meet")

    same_leaf = ref_leaf[1:] == ref_leaf[:-1]
    descending = same_leaf & (ref_tri[1:] <= ref_tri[:-1])
    if descending.any():
        j = int(np.flatnonzero(descending)[0])
        _fail("leaf lists ascending",
              f"leaf node {int(ref_leaf[j])} lists triangle {int(ref_tri[j])} before "
              f"{int(ref_tri[j + 1])}")


def check_tree(tree) -> None:
    """Raise ``ValueError`` naming the first violated invariant of a tree.

    Checked in this order: array shapes and dtypes (and node axes 0..3);
    interior children in range with ``node_count == 0``; node 0 is the root;
    every other node is the child of exactly one node and is reached from the
    root (no cycles, no orphans); every split lies strictly inside its node's
    box on its axis, so the children partition the box (left ``[lo, split]``,
    right ``[split, hi]``); leaf ranges lie inside ``leaf_tris`` and triangle
    ids are in range; every non-degenerate triangle is in some leaf, no
    degenerate one is, and ``num_degenerate`` matches; the root box is the
    union of the non-degenerate triangles' boxes; every reference's float32
    triangle box meets (closed intervals) its leaf's box; leaf lists are
    strictly ascending.

    Parameters
    ----------
    tree : KdTree

    Raises
    ------
    ValueError
        ``"check_tree: <invariant>: <detail>"`` for the first violation.
    """
    _check_arrays(tree)
    node_lo, node_hi = _check_structure(tree)
    _check_leaves(tree, node_lo, node_hi)
