"""The Wald & Havran builder on hand-made cases: ties, planar triangles, leaves, input, output."""

from __future__ import annotations

import numpy as np
import pytest

import cpu_reference
from cpu_reference import naive, wald_havran
from kdtree_gpu import KdTree, MeshError, SAHConfig
from kdtree_gpu import encoding as enc
from kdtree_gpu.config import split_cost
from kdtree_gpu.mesh import prepare_mesh
from kdtree_gpu.testing.meshes import quad_x, triangles, wedge

END, PLANAR, START = enc.EVENT_END, enc.EVENT_PLANAR, enc.EVENT_START


def subtree_tris(tree, node):
    if tree.node_axis[node] == enc.AXIS_LEAF:
        start = tree.node_child[node]
        return set(tree.leaf_tris[start:start + tree.node_count[node]].tolist())
    child = tree.node_child[node]
    return subtree_tris(tree, child) | subtree_tris(tree, child + 1)


# --- planar triangles on a candidate plane (R7 p_side, R9) -------------------
def planar_scene(left_x0, right_x1):
    """Ten wedges left of x=1, ten right of it, a quad (triangles 20, 21) in x=1."""
    left = [wedge(left_x0, 0.9)] * 10
    right = [wedge(1.1, right_x1)] * 10
    return triangles(*left, *right, *quad_x(1.0))


@pytest.mark.parametrize("clip", [False, True])
def test_planar_quad_on_a_tie_goes_left(clip):
    # symmetric scene: C_left == C_right at x=1, and the tie goes LEFT
    V, F = planar_scene(0.0, 2.0)
    tree = wald_havran.build(V, F, SAHConfig(clip=clip))
    assert tree.node_axis[0] == 0 and tree.node_split[0] == np.float32(1.0)
    left = tree.node_child[0]
    assert {20, 21} <= subtree_tris(tree, left)
    assert not {20, 21} & subtree_tris(tree, left + 1)
    assert tree.compare(naive.build(V, F, SAHConfig(clip=clip))) is None


@pytest.mark.parametrize("clip", [False, True])
def test_planar_quad_goes_to_the_cheaper_side(clip):
    # the left child is larger (x in [-1, 1]) so the quad is cheaper on the right
    V, F = planar_scene(-1.0, 2.0)
    area = lambda dx: 2.0 * dx + 1.0  # half area of a [0,dx] x [0,1] x [0,1] box
    total = area(3.0)
    c_left = split_cost(15.0, 20.0, 0.8, area(2.0), area(1.0), total, 12, 10)
    c_right = split_cost(15.0, 20.0, 0.8, area(2.0), area(1.0), total, 10, 12)
    assert c_right < c_left
    tree = wald_havran.build(V, F, SAHConfig(clip=clip))
    assert tree.node_axis[0] == 0 and tree.node_split[0] == np.float32(1.0)
    left = tree.node_child[0]
    assert {20, 21} <= subtree_tris(tree, left + 1)
    assert not {20, 21} & subtree_tris(tree, left)
    assert tree.compare(naive.build(V, F, SAHConfig(clip=clip))) is None


def test_single_planar_quad_is_one_leaf():
    # flat on x, no candidate inside the box on y or z beyond the quad's own edges
    V, F = triangles(*quad_x(0.5))
    tree = wald_havran.build(V, F)
    assert tree.num_nodes == 1
    assert tree.leaf_tris.tolist() == [0, 1]


def test_split_ties_choose_lowest_axis_then_lowest_position():
    # a cube's worth of identical clusters: the same best cost on x, y and z
    tris = []
    for corner in ((0, 0, 0), (3, 3, 3)):
        for _ in range(6):
            c = np.array(corner, np.float32)
            tris.append([c, c + [1, 1, 0], c + [0, 1, 1]])
    V, F = triangles(*np.array(tris).tolist())
    tree = wald_havran.build(V, F)
    assert tree.node_axis[0] == 0  # x, not y or z
    # the cut at x=1 and the cut at x=3 cost the same by symmetry; x=1 wins
    assert tree.node_split[0] == np.float32(1.0)


# --- leaf rules (R4, R8) ---------------------------------------------------------
def test_leaf_size_and_max_depth_stop_the_build():
    rng = np.random.default_rng(3)
    V = rng.random((300, 3)).astype(np.float32) * 0.05 + np.repeat(rng.random((100, 3)), 3, axis=0)
    F = np.arange(300, dtype=np.int32).reshape(100, 3)
    assert wald_havran.build(V, F, SAHConfig(leaf_size=100)).num_nodes == 1
    assert wald_havran.build(V, F, SAHConfig(max_depth=0)).num_nodes == 1
    assert wald_havran.build(V, F, SAHConfig(max_depth=2)).stats()["max_depth"] <= 2
    deep = wald_havran.build(V, F)
    assert deep.stats()["max_depth"] > 2
    assert deep.build_info["max_depth"] == SAHConfig().resolved_max_depth(100)


def test_expensive_traversal_keeps_one_leaf():
    V, F = triangles(wedge(0, 1), wedge(2, 3))
    # K_T alone already costs more than intersecting both triangles
    assert wald_havran.build(V, F, SAHConfig(k_traversal=100.0)).num_nodes == 1
    assert wald_havran.build(V, F).num_nodes > 1


# --- input and output (R1, R10) ---------------------------------------------------
def test_degenerate_triangles_are_counted_and_left_out():
    V, F = triangles(wedge(0, 1), [[0, 0, 0], [1, 1, 1], [2, 2, 2]], wedge(2, 3),
                     [[5, 5, 5], [5, 5, 5], [6, 6, 6]])
    for clip in (False, True):
        tree = wald_havran.build(V, F, SAHConfig(clip=clip))
        assert tree.num_degenerate == 2
        assert set(tree.leaf_tris.tolist()) == {0, 2}
        # the root box ignores the degenerate triangles
        np.testing.assert_array_equal(tree.bounds, [[0, 0, 0], [3, 1, 1]])


@pytest.mark.parametrize("vertices, faces, message", [
    (np.zeros((3, 2)), [[0, 1, 2]], "shape"),
    ([[0, 0, 0], [1, 0, 0], [np.nan, 1, 0]], [[0, 1, 2]], "NaN"),
    ([[0, 0, 0], [1, 0, 0], [0, 1, 0]], [[0, 1, 3]], "out of range"),
    ([[0, 0, 0], [1, 0, 0], [0, 1, 0]], [[0, 1, -1]], "negative"),
    ([[0, 0, 0], [1, 0, 0], [0, 1, 0]], np.zeros((0, 3), np.int32), "empty"),
    ([[0, 0, 0], [1, 0, 0], [2, 0, 0]], [[0, 1, 2]], "degenerate"),
    ([[0, 0, 0], [1, 0, 0], [0, 1, 0]], [[0.0, 1.0, 2.0]], "integer"),
])
@pytest.mark.parametrize("builder", [wald_havran.build, naive.build], ids=["fast", "naive"])
def test_bad_input_raises_mesh_error(builder, vertices, faces, message):
    with pytest.raises(MeshError, match=message):
        builder(vertices, faces)


def test_config_must_be_an_sahconfig():
    V, F = triangles(wedge(0, 1))
    with pytest.raises(TypeError, match="SAHConfig"):
        wald_havran.build(V, F, {"clip": True})


def test_output_format():
    rng = np.random.default_rng(11)
    V = rng.random((90, 3)).astype(np.float32)
    F = rng.permutation(90).astype(np.int32).reshape(30, 3)
    config = SAHConfig(clip=True)
    tree = cpu_reference.build(V, F, config)
    assert isinstance(tree, KdTree)
    assert tree.config is config
    assert tree.build_info["builder"] == "cpu_reference"
    tree.check()
    # leaves ascending, every triangle referenced
    for node in np.flatnonzero(tree.leaf_mask()):
        start = tree.node_child[node]
        leaf = tree.leaf_tris[start:start + tree.node_count[node]]
        assert np.all(np.diff(leaf) > 0)
    assert set(tree.leaf_tris.tolist()) == set(range(30))
    # interior nodes: children adjacent, inside the array, split inside the node
    interior = np.flatnonzero(~tree.leaf_mask())
    assert np.all(tree.node_child[interior] + 1 < tree.num_nodes)
    # deterministic
    again = cpu_reference.build(V, F, config)
    for name in ("node_axis", "node_split", "node_child", "node_count", "leaf_tris"):
        np.testing.assert_array_equal(getattr(tree, name), getattr(again, name))


def test_real_mesh_tree_is_valid(mesh_dir):
    from kdtree_gpu.mesh import load_mesh

    V, F = load_mesh(mesh_dir / "happy_buddha_100k.ply")
    tree = wald_havran.build(V, F)
    tree.check()
    stats = tree.stats()
    assert tree.num_degenerate == 6
    assert stats["degenerate"] == 6
    assert 1.0 < stats["refs_per_tri"] < 10.0
    assert stats["max_depth"] <= SAHConfig().resolved_max_depth(F.shape[0] - 6)


@pytest.mark.parametrize("clip", [False, True])
def test_small_event_pools_grow_to_the_same_tree(clip):
    # pools start at the root's size and must grow during the build
    rng = np.random.default_rng(5)
    V, F = make_soup_mesh(rng, 400)
    config = SAHConfig(clip=clip)
    V32, F32, tri_lo, tri_hi, valid, bounds = prepare_mesh(V, F)
    max_depth = config.resolved_max_depth(int(valid.sum()))
    args = (V32, F32, tri_lo, tri_hi, valid, bounds, config.k_traversal, config.k_intersect,
            config.empty_bonus, config.leaf_size, max_depth, False, clip)
    small = wald_havran.build_arrays(*args, pool_capacity=1)
    large = wald_havran.build_arrays(*args)
    for a, b in zip(small, large):
        np.testing.assert_array_equal(a, b)
    assert small[4].shape[0] > 400  # references were duplicated: the pools had to grow


def make_soup_mesh(rng, n):
    centre = rng.uniform(-1, 1, size=(n, 1, 3))
    V = (centre + 0.2 * rng.normal(size=(n, 3, 3))).reshape(-1, 3).astype(np.float32)
    return V, np.arange(3 * n, dtype=np.int32).reshape(n, 3)
