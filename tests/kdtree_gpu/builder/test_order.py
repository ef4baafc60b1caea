"""The build's own triangle order (``builder/gpu/order.py``): Morton order in, the
given indices out.

A build of at least ``GpuSettings.morton_min_triangles`` triangles numbers them
by the Morton code of their boxes' centres; its tree must still be the CPU
reference's node for node, with each leaf listing the given indices ascending.
"""

import numpy as np
import pytest

import cpu_reference
import kdtree_gpu as kd
from kdtree_gpu import SAHConfig
from kdtree_gpu import encoding as enc
from kdtree_gpu.builder import GpuSettings
from kdtree_gpu.builder.gpu.order import morton_keys
from kdtree_gpu.mesh import MeshError, triangle_bounds
from kdtree_gpu.testing.meshes import CONFIGS, assert_same_tree, deferring_scene, soup
from kdtree_gpu.testing.rays import assert_same_hits, random_rays
from kdtree_gpu.trace import intersect_brute

gpu = pytest.mark.gpu
MORTON = GpuSettings(morton_min_triangles=0)  # every build in Morton order
# ... with the subtree stage too, however small the mesh
MORTON_SMALL = GpuSettings(morton_min_triangles=0, small_min_refs=0)
MORTON_MEDIUM = GpuSettings(morton_min_triangles=0, small_min_refs=0,
                            small_refs=enc.MEDIUM_MAX_REFS)


def _interleave(x, y, z):
    """The Morton code of three ``MORTON_BITS``-bit cells, bit by bit (x lowest)."""
    code = 0
    for bit in range(enc.MORTON_BITS):
        for axis, v in enumerate((x, y, z)):
            code |= ((v >> bit) & 1) << (3 * bit + axis)
    return code


def test_morton_keys_interleave_the_cells_of_the_box_centres():
    bounds = np.array([[0, 0, 0], [1023, 1023, 1023]], np.float32)
    centres = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [5, 700, 1023],
                        [1023, 1023, 1023]], np.float32)
    keys = morton_keys(centres, centres, np.ones(len(centres)), bounds)
    codes = [_interleave(*map(int, c)) for c in centres]
    assert (keys >> np.uint64(32)).tolist() == codes
    assert (keys & np.uint64(0xFFFFFFFF)).tolist() == list(range(len(centres)))


def test_morton_keys_put_invalid_triangles_last_and_clamp_outside_the_box():
    bounds = np.array([[0, 0, 0], [1, 1, 1]], np.float32)
    lo = np.array([[0.5, 0.5, 0.5], [-5, -5, -5], [7, 7, 7], [0.5, 0.5, 0.5]], np.float32)
    keys = morton_keys(lo, lo, np.array([1, 1, 1, 0]), bounds)
    assert (keys >> np.uint64(63)).tolist() == [0, 0, 0, 1]
    code = (keys >> np.uint64(32)) & np.uint64(0x7FFFFFFF)
    assert code[1] == 0 and code[2] == _interleave(1023, 1023, 1023)
    assert np.argsort(keys, kind="stable")[-1] == 3
    # a flat root box: its flat axis adds nothing to the code
    flat = np.array([[0, 0, 2], [1, 1, 2]], np.float32)
    keys = morton_keys(lo[:1], lo[:1], [1], flat)
    assert int(keys[0] >> np.uint64(32)) == _interleave(511, 511, 0)


def test_morton_setting_is_checked_and_large_builds_use_it():
    assert GpuSettings().morton_min_triangles == 1 << 21
    for bad in (-1, 1.5, None):
        with pytest.raises(ValueError, match="morton_min_triangles"):
            GpuSettings(morton_min_triangles=bad)


def test_leaves_too_large_for_a_thread_are_sorted_by_one_radix_sort():
    # (_sort_leaves on NumPy: the path a listed leaf takes after kd_rename_leaves)
    from kdtree_gpu.builder.gpu.order import _sort_leaves
    from kdtree_gpu.builder.soa import TreeNodeSoA

    leaf_tris = np.array([9, 4, 7, 1, 8, 3, 2, 6, 5, 0], np.int32)
    # leaves 1 (entries 0-3), 3 (entries 6-9) listed; leaf 2 (4-5) is left as it is
    nodes = TreeNodeSoA(node_axis=np.full(4, enc.AXIS_LEAF, np.int8),
                        node_split=np.zeros(4, np.float32),
                        node_child=np.array([0, 0, 4, 6], np.int32),
                        node_count=np.array([0, 4, 2, 4], np.int32))
    _sort_leaves(np, nodes, leaf_tris, np.array([3, 1], np.uint64))
    assert leaf_tris.tolist() == [1, 4, 7, 9, 8, 3, 0, 2, 5, 6]


def _scene(seed):
    return deferring_scene(seed, 9000, soup_size=600)


@gpu
def test_gpu_morton_keys_are_the_numpy_keys():
    import cupy

    from kdtree_gpu.builder.gpu.root import prepare_mesh_cuda

    rng = np.random.default_rng(5)
    V, F = soup(rng, 3000, scale=0.2)
    F = np.concatenate([F, F[:5, [0, 0, 1]]])  # degenerate triangles (invalid)
    *_, tri_lo, tri_hi, refs, _, bounds, _, num_degenerate, _, order = prepare_mesh_cuda(
        cupy, cupy.asarray(V), cupy.asarray(F), 0, morton=True)
    lo, hi = triangle_bounds(V, F)
    valid = np.ones(len(F), bool)
    valid[-5:] = False
    expected = np.argsort(morton_keys(lo, hi, valid, bounds), kind="stable")
    np.testing.assert_array_equal(order.get(), expected)
    np.testing.assert_array_equal(tri_lo.get(), lo[expected])
    np.testing.assert_array_equal(tri_hi.get(), hi[expected])
    # the valid triangles come first: the references are the build's first triangles
    assert num_degenerate == 5
    np.testing.assert_array_equal(refs.ref_tri.get(), np.arange(len(F) - 5))


@gpu
@pytest.mark.parametrize("settings", [MORTON, MORTON_SMALL, MORTON_MEDIUM],
                         ids=["loop", "small", "medium"])
@pytest.mark.parametrize("seed", range(10))
def test_gpu_morton_builds_equal_reference(seed, settings):
    V, F = _scene(seed)
    cfg = CONFIGS[seed % len(CONFIGS)]
    tree = kd.build(V, F, cfg, device="cuda", settings=settings)
    assert tree.build_info["morton_order"]
    assert_same_tree(cpu_reference.build(V, F, cfg), tree)  # (check: leaves ascending)


@gpu
@pytest.mark.parametrize("settings", [MORTON, GpuSettings(morton_min_triangles=0,
                                                          level_loop=False)],
                         ids=["loop", "stages"])
@pytest.mark.parametrize("axes", ["all", "longest"])
def test_gpu_morton_builds_of_a_real_mesh_equal_reference(axes, settings, mesh_path):
    V, F = kd.load_mesh(mesh_path("stanford_bunny"))
    cfg = SAHConfig(axes=axes)
    tree = kd.build(V, F, cfg, device="cuda", settings=settings)
    assert tree.build_info["morton_order"]
    assert_same_tree(cpu_reference.build(V, F, cfg), tree)


@gpu
def test_gpu_leaves_too_large_for_a_thread_are_sorted_too():
    # two levels only: leaves of hundreds of triangles, in Morton order inside
    rng = np.random.default_rng(11)
    V, F = soup(rng, 3000, scale=0.05)
    cfg = SAHConfig(max_depth=2)
    tree = kd.build(V, F, cfg, device="cuda", settings=MORTON)
    counts = tree.node_count[tree.node_axis == enc.AXIS_LEAF]
    assert counts.max() > enc.LEAF_SORT_MAX
    assert_same_tree(cpu_reference.build(V, F, cfg), tree)


@gpu
def test_gpu_clipping_builds_keep_the_given_order():
    V, F = _scene(0)
    cfg = SAHConfig(clip=True)
    tree = kd.build(V, F, cfg, device="cuda", settings=MORTON)
    assert not tree.build_info["morton_order"]
    assert_same_tree(cpu_reference.build(V, F, cfg), tree)


@gpu
def test_gpu_morton_trees_answer_queries_as_brute_force(mesh_path):
    V, F = kd.load_mesh(mesh_path("suzanne"))
    tree = kd.build(V, F, device="cuda", settings=MORTON_SMALL)
    O, D, tmin, tmax = random_rays(tree.bounds, 4000, 5)
    hits = tree.intersect(O, D, tmin, tmax, device="cuda")
    assert_same_hits(hits, intersect_brute(tree, O, D, tmin=tmin, tmax=tmax, device="cuda"))


@gpu
def test_gpu_a_refused_triangle_is_named_by_its_given_index():
    # the tiny triangle first in Morton order, last in the given one
    V = np.array([[0, 0, 0], [1e-13, 0, 0], [0, 1e-13, 0],
                  [0.5, 0.5, 0.5], [1, 0.5, 0.5], [0.5, 1, 0.5],
                  [0.5, 0.5, 1], [1, 0.5, 1], [0.5, 1, 1]], np.float32)
    F = np.array([[3, 4, 5], [6, 7, 8], [0, 1, 2]], np.int32)
    with pytest.raises(MeshError, match="triangle 2 is too small"):
        kd.build(V, F, device="cuda", settings=MORTON)
