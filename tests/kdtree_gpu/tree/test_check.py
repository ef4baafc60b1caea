"""Tests of kdtree_gpu.tree.check: statistics and invariants."""

import copy

import numpy as np
import pytest

from kdtree_gpu import encoding as enc
from kdtree_gpu.config import SAHConfig
from kdtree_gpu.tree import KdTree
from kdtree_gpu.tree.check import check_tree, tree_stats

L = enc.AXIS_LEAF


def make_small_tree():
    """Two flat triangles and a degenerate one, in a 5-node tree with an empty leaf.

    node 0: split x = 1.5 -> nodes 1, 2
    node 1: split x = 1.2 -> nodes 3, 4
    node 2: leaf [1] (box x in [1.5, 3])
    node 3: leaf [0] (box x in [0, 1.2])
    node 4: leaf []  (box x in [1.2, 1.5])
    """
    vertices = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0],
                         [2, 0, 0], [3, 0, 0], [3, 1, 0],
                         [1, 1, 0], [2, 2, 0]], dtype=np.float32)
    faces = np.array([[0, 1, 2], [3, 4, 5], [0, 6, 7]], dtype=np.int32)
    return KdTree(
        node_axis=np.array([0, 0, L, L, L], np.int8),
        node_split=np.array([1.5, 1.2, 0, 0, 0], np.float32),
        node_child=np.array([1, 3, 0, 1, 2], np.int32),
        node_count=np.array([0, 0, 1, 1, 0], np.int32),
        leaf_tris=np.array([1, 0], np.int32),
        bounds=np.array([[0, 0, 0], [3, 1, 0]], np.float32),
        vertices=vertices, faces=faces, config=SAHConfig(), num_degenerate=1,
    )


def test_stats_of_hand_made_tree():
    stats = tree_stats(make_small_tree())
    assert stats["nodes"] == 5
    assert stats["interior"] == 2
    assert stats["leaves"] == 3
    assert stats["empty_leaves"] == 1
    assert stats["max_depth"] == 2
    assert stats["mean_leaf_depth"] == pytest.approx(5 / 3)
    assert stats["refs"] == 2
    assert stats["triangles"] == 3
    assert stats["degenerate"] == 1
    assert stats["refs_per_tri"] == pytest.approx(1.0)
    assert stats["max_leaf_size"] == 1
    assert stats["mean_leaf_size"] == pytest.approx(1.0)
    # half areas (flat boxes, z extent 0): root 3, node1 1.5, node2 1.5, node3 1.2, node4 0.3
    # (15 * (3 + 1.5) + 20 * (1.5 + 1.2)) / 3 = 40.5
    assert stats["sah_cost"] == pytest.approx(40.5, rel=1e-6)
    assert stats["bytes"] == 5 * (1 + 4 + 4 + 4) + 2 * 4 + 6 * 4
    assert stats["mesh_bytes"] == 8 * 12 + 3 * 12


def make_root_leaf(tree, leaf_tris):
    """Turn ``tree`` into a single leaf (the root) listing ``leaf_tris``."""
    tree.node_axis = np.array([L], np.int8)
    tree.node_split = np.zeros(1, np.float32)
    tree.node_child = np.zeros(1, np.int32)
    tree.node_count = np.array([len(leaf_tris)], np.int32)
    tree.leaf_tris = np.array(leaf_tris, np.int32)


def test_stats_of_single_leaf_tree():
    tree = make_small_tree()
    make_root_leaf(tree, [0, 1])
    check_tree(tree)
    stats = tree_stats(tree)
    assert stats["nodes"] == 1 and stats["leaves"] == 1 and stats["max_depth"] == 0
    assert stats["sah_cost"] == 40.0  # K_I * 2 triangles * SA(root) / SA(root), exact


def test_valid_trees_pass(rng, make_median_tree):
    check_tree(make_small_tree())
    V = rng.random((300, 3)).astype(np.float32)
    F = rng.integers(0, 300, (500, 3)).astype(np.int32)
    tree = make_median_tree(V, F)
    check_tree(tree)
    stats = tree_stats(tree)
    assert stats["nodes"] == tree.num_nodes > 1
    assert stats["leaves"] == stats["interior"] + 1
    assert stats["refs"] >= 500 - stats["degenerate"]


def broken(change):
    tree = copy.deepcopy(make_small_tree())
    change(tree)
    return tree


def set_item(name, index, value):
    def change(tree):
        getattr(tree, name)[index] = value
    return change


def set_attr(name, value):
    def change(tree):
        setattr(tree, name, value)
    return change


def extend_with_cycle(tree):
    # nodes 5 and 6: node 5 is its own left child, so every node has exactly
    # one parent but 5 and 6 are not reached from the root
    tree.node_axis = np.append(tree.node_axis, np.int8([0, L]))
    tree.node_split = np.append(tree.node_split, np.float32([0.5, 0]))
    tree.node_child = np.append(tree.node_child, np.int32([5, 0]))
    tree.node_count = np.append(tree.node_count, np.int32([0, 0]))


def extend_with_orphan(tree):
    tree.node_axis = np.append(tree.node_axis, np.int8([L]))
    tree.node_split = np.append(tree.node_split, np.float32([0]))
    tree.node_child = np.append(tree.node_child, np.int32([0]))
    tree.node_count = np.append(tree.node_count, np.int32([0]))


def reference_degenerate(tree):
    tree.leaf_tris = np.array([1, 0, 2], np.int32)
    tree.node_child[4], tree.node_count[4] = 2, 1


def reference_far_triangle(tree):
    tree.leaf_tris = np.array([1, 0, 1], np.int32)
    tree.node_count[3] = 2


def unsorted_root_leaf(tree):
    make_root_leaf(tree, [1, 0])


@pytest.mark.parametrize("change, message", [
    (set_attr("node_axis", np.array([0, 0, L, L, L], np.int32)), "array shapes and dtypes"),
    (set_attr("node_count", np.zeros(4, np.int32)), "array shapes and dtypes"),
    (set_attr("bounds", np.zeros((3, 2), np.float32)), "array shapes and dtypes"),
    (set_item("node_axis", 2, 5), "array shapes and dtypes"),
    (set_item("node_child", 0, 4), "children in range"),
    (set_item("node_child", 1, 0), "children in range"),
    (set_item("node_count", 1, 3), "children in range"),
    (set_item("node_child", 1, 1), "each node reached exactly once"),
    (extend_with_orphan, "orphan"),
    (extend_with_cycle, "not reached from the root"),
    (set_item("node_split", 1, 1.5), "split inside node box"),
    (set_item("node_split", 1, 0.0), "split inside node box"),
    (set_item("node_split", 0, np.nan), "split inside node box"),
    (set_item("node_axis", 1, 2), "split inside node box"),  # the box is flat in z
    (set_item("node_child", 2, 5), "leaf ranges inside leaf_tris"),
    (set_item("node_count", 2, -1), "leaf ranges inside leaf_tris"),
    (set_item("leaf_tris", 0, 7), "triangle ids in range"),
    (set_item("node_count", 3, 0), "every non-degenerate triangle is referenced"),
    (reference_degenerate, "no degenerate triangle is referenced"),
    (set_attr("num_degenerate", 0), "num_degenerate matches the mesh"),
    (set_attr("bounds", np.array([[0, 0, 0], [4, 1, 0]], np.float32)),
     "root box is the union of the triangle boxes"),
    (reference_far_triangle, "every reference meets its leaf box"),
    (unsorted_root_leaf, "leaf lists ascending"),
])
def test_check_tree_names_broken_invariant(change, message):
    tree = broken(change)
    with pytest.raises(ValueError, match=message):
        check_tree(tree)


def test_check_tree_on_large_tree(rng, make_median_tree):
    # a tree with about 2**13 leaves over random small triangles, checked whole
    n = 1 << 13
    centre = rng.random((n, 3)).astype(np.float32)
    V = np.repeat(centre, 3, axis=0) + rng.random((3 * n, 3)).astype(np.float32) * 1e-3
    F = np.arange(3 * n, dtype=np.int32).reshape(n, 3)
    tree = make_median_tree(V, F, leaf_size=1, max_depth=30)
    check_tree(tree)
    assert tree_stats(tree)["leaves"] == (tree.num_nodes + 1) // 2


def shuffle_sibling_pairs(tree, rng):
    """The same tree with its sibling pairs stored in a random order.

    Node 0 stays the root; the pair of children at ``(c, c + 1)`` moves to a
    random pair slot, and every parent's ``node_child`` follows it.
    """
    num_pairs = (tree.num_nodes - 1) // 2
    pair_slot = rng.permutation(num_pairs)
    new_index = np.zeros(tree.num_nodes, dtype=np.int64)
    old_children = np.arange(1, tree.num_nodes)
    new_index[1:] = 1 + 2 * pair_slot[(old_children - 1) // 2] + (old_children - 1) % 2
    shuffled = copy.deepcopy(tree)
    for name in ("node_axis", "node_split", "node_child", "node_count"):
        getattr(shuffled, name)[new_index] = getattr(tree, name)
    interior = ~shuffled.leaf_mask()
    shuffled.node_child[interior] = new_index[shuffled.node_child[interior]]
    return shuffled


def tree_of_many_sizes(rng, make_median_tree, n):
    """A tree over ``n`` triangles whose sizes span four orders of magnitude: node
    costs of many magnitudes, whose plain NumPy sum depends on the node order."""
    centre = rng.random((n, 3))
    size = np.exp(rng.uniform(-9.0, -1.0, (n, 1)))
    V = (np.repeat(centre, 3, axis=0)
         + rng.random((3 * n, 3)) * np.repeat(size, 3, axis=0)).astype(np.float32)
    return make_median_tree(V, np.arange(3 * n, dtype=np.int32).reshape(n, 3), leaf_size=3)


def test_sah_cost_does_not_depend_on_node_order(rng, make_median_tree):
    # with this seed a plain NumPy sum of the node costs differs in the last
    # bits for most of the shuffles below
    tree = tree_of_many_sizes(rng, make_median_tree, 1000)
    cost = tree_stats(tree)["sah_cost"]
    for _ in range(8):
        shuffled = shuffle_sibling_pairs(tree, rng)
        check_tree(shuffled)
        assert shuffled.compare(tree) is None
        assert not np.array_equal(shuffled.node_child, tree.node_child)
        # exactly equal, not approximately: the sum is exact before rounding
        assert tree_stats(shuffled)["sah_cost"] == cost


def numpy_walk(tree):
    """Oracle of walk_levels: the level-by-level walk in vectorised NumPy."""
    n = tree.num_nodes
    depth = np.full(n, -1, np.int32)
    lo, hi = np.zeros((n, 3), np.float32), np.zeros((n, 3), np.float32)
    lo[0], hi[0] = tree.bounds
    level, d = np.zeros(1, np.int64), 0
    while level.size:
        depth[level] = d
        parents = level[tree.node_axis[level] != L]
        axis = tree.node_axis[parents].astype(np.int64)
        left = tree.node_child[parents].astype(np.int64)
        rows = np.arange(parents.size)
        lo[left], hi[left] = lo[parents], hi[parents]
        lo[left + 1], hi[left + 1] = lo[parents], hi[parents]
        hi[left, axis] = lo[left + 1, axis] = tree.node_split[parents][rows]
        level, d = np.concatenate([left, left + 1]), d + 1
    return depth, lo, hi


@pytest.mark.parametrize("shuffle", [False, True])
def test_walk_levels_matches_the_numpy_walk(rng, make_median_tree, shuffle):
    from kdtree_gpu.tree.check import walk_levels

    n = 3000
    centre = rng.random((n, 3))
    V = (np.repeat(centre, 3, axis=0) + rng.random((3 * n, 3)) * 0.01).astype(np.float32)
    F = np.arange(3 * n, dtype=np.int32).reshape(n, 3)
    tree = make_median_tree(V, F, leaf_size=2)
    if shuffle:
        tree = shuffle_sibling_pairs(tree, rng)
    depth, lo, hi = walk_levels(tree, check=True)
    want_depth, want_lo, want_hi = numpy_walk(tree)
    assert depth.dtype == np.int32 and (depth >= 0).all() and depth.max() > 8
    np.testing.assert_array_equal(depth, want_depth)
    np.testing.assert_array_equal(lo, want_lo)
    np.testing.assert_array_equal(hi, want_hi)


@pytest.mark.parametrize("change, message", [
    (set_item("node_child", 0, 4), "children in range: interior node 0"),
    (set_item("node_child", 1, -7), "children in range: interior node 1"),
    (set_item("node_axis", 1, -2), "node 1 has axis -2"),
    (set_item("node_axis", 1, 5), "node 1 has axis 5"),
    (set_item("node_child", 1, 1), "form a cycle"),
])
def test_walk_levels_refuses_links_it_cannot_follow(change, message):
    # tree_stats walks without check_tree's earlier checks: it must raise,
    # never read or write outside the node arrays
    from kdtree_gpu.tree.check import walk_levels

    with pytest.raises(ValueError, match=message):
        walk_levels(broken(change))
    with pytest.raises(ValueError, match=message):
        tree_stats(broken(change))


STATS_SCRIPT = """
import sys
sys.path.insert(0, "tests/kdtree_gpu/tree")
from test_check import make_small_tree
tree = make_small_tree()
print(tree.stats()["nodes"], tree.stats()["max_depth"])
"""


def test_the_walk_announces_its_first_compile_once(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from kdtree_gpu.tree.check import WALK_COMPILE_MESSAGE

    repo = Path(__file__).resolve().parents[3]
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    runs = [subprocess.run([sys.executable, "-c", STATS_SCRIPT], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=300) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr + runs[1].stderr
    assert [r.stdout.split() for r in runs] == [["5", "2"]] * 2
    assert runs[0].stderr.splitlines() == [WALK_COMPILE_MESSAGE]  # compiled, said once
    assert runs[1].stderr == ""  # loaded from numba's cache


@pytest.mark.parametrize("seed", range(4))
def test_exact_sum_is_the_correctly_rounded_sum(seed):
    import math

    from kdtree_gpu.tree.check import exact_sum

    rng = np.random.default_rng(seed)
    n = 20_000
    # magnitudes over the whole double range, subnormals, zeros, and repeats
    # of one value whose sum lands on rounding ties
    values = np.ldexp(rng.random(n), rng.integers(-1074, 1000, n))
    values[rng.random(n) < 0.05] = 0.0
    values[:50] = 5e-324 * rng.integers(1, 1 << 20, 50)
    tie = np.full(3, 1.0 + 2.0 ** -52)
    for v in (values, values[rng.permutation(n)], values[values < 1e-300], tie,
              np.full(1000, 0.1), np.zeros(3), np.array([1e308, 1e308 / 3])):
        assert exact_sum(v) == math.fsum(v.tolist())
    with pytest.raises(ValueError, match="finite and >= 0"):
        exact_sum(np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="finite and >= 0"):
        exact_sum(np.array([1.0, np.nan]))


def test_sah_cost_is_the_fsum_of_the_node_terms(rng, make_median_tree):
    import math

    from kdtree_gpu.config import box_half_area

    tree = tree_of_many_sizes(rng, make_median_tree, 2000)
    _, lo, hi = numpy_walk(tree)
    ext = hi.astype(np.float64) - lo.astype(np.float64)
    area = box_half_area(ext[:, 0], ext[:, 1], ext[:, 2])
    cfg = tree.config
    terms = np.where(tree.leaf_mask(), cfg.k_intersect * tree.node_count * area,
                     cfg.k_traversal * area)
    assert tree_stats(tree)["sah_cost"] == math.fsum(terms.tolist()) / area[0]
