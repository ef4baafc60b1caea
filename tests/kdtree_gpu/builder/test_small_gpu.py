"""The small-node stage (``builder/gpu/small.py``, ``cuda/build_small.cu``).

Nodes the level loop would split with at most ``GpuSettings.small_refs``
references get their whole subtree from one warp (one block from
``SMALL_MAX_REFS + 1`` references on); the tree must still be the CPU
reference's, node for node, with packed leaf lists.
"""

import numpy as np
import pytest

import cpu_reference
import kdtree_gpu as kd
from kdtree_gpu import SAHConfig
from kdtree_gpu import encoding as enc
from kdtree_gpu.builder import GpuSettings
from kdtree_gpu.trace import intersect_brute
from kdtree_gpu.testing.rays import assert_same_hits, random_rays
from kdtree_gpu.testing.meshes import (CONFIGS, assert_same_tree, deferring_scene, grid_soup,
                                       needles_through_clouds, soup)

gpu = pytest.mark.gpu
# every build defers small nodes, however small the mesh
SMALL = GpuSettings(small_refs=enc.SMALL_MAX_REFS, small_min_refs=0)
# and defers medium nodes too (a block each)
MEDIUM = GpuSettings(small_refs=enc.MEDIUM_MAX_REFS, small_min_refs=0)


def test_small_node_stage_is_on_by_default():
    assert GpuSettings().small_refs == enc.SMALL_MAX_REFS


def test_default_loop_buffers_are_narrower_with_the_small_node_stage():
    # deferred small nodes take the widest levels away from the loop
    settings = GpuSettings()
    with_stage = settings.loop_capacities(60_000, 10_000, 64)
    fewer = settings.loop_capacities(60_000, 10_000, 16)
    without = settings.loop_capacities(60_000, 10_000, 0)
    assert with_stage == (90_000 + 4096, 15_000 + 1024, 2 * 16_024 // 65 + 1024, (10_256, 40_256))
    assert fewer[:3] == (120_000 + 4096, 20_000 + 1024, 2 * 21_024 // 17 + 1024)
    assert without == (7 * 60_000 // 2 + 4096, 7 * 10_000 // 2 + 1024, 12_500 + 1024,
                       (100_256, 100_256))

    def mine(num_events, num_refs):
        return num_events, num_refs, 1, 1

    assert GpuSettings(loop_capacity=mine).loop_capacities(5, 3, 64) == (5, 3, 1, 1)


def test_small_builds_defer_nothing():
    settings = GpuSettings()
    assert settings.small_refs_for(settings.small_min_refs) == enc.SMALL_MAX_REFS
    assert settings.small_refs_for(settings.small_min_refs - 1) == 0
    assert GpuSettings(small_min_refs=0, small_refs=7).small_refs_for(1) == 7


@pytest.mark.parametrize("bad", [-1, enc.MEDIUM_MAX_REFS + 1, True, 2.0])
def test_small_refs_setting_is_checked(bad):
    with pytest.raises(ValueError, match="small_refs"):
        GpuSettings(small_refs=bad)


def _scene(seed):
    return deferring_scene(seed, 4000)


@gpu
@pytest.mark.parametrize("small_refs", [1, 7, 32, 33, enc.SMALL_MAX_REFS, enc.SMALL_MAX_REFS + 1,
                                        200, enc.MEDIUM_MAX_REFS])
@pytest.mark.parametrize("seed", range(15))
def test_gpu_small_subtrees_equal_reference(seed, small_refs):
    V, F = _scene(seed)
    cfg = CONFIGS[seed % len(CONFIGS)]
    settings = GpuSettings(small_refs=small_refs, small_min_refs=0)
    tree = kd.build(V, F, cfg, device="cuda", settings=settings)
    assert_same_tree(cpu_reference.build(V, F, cfg), tree)
    info = tree.build_info
    assert info["level_loop"] == "grid"
    if small_refs <= enc.SMALL_MAX_REFS:
        assert info["medium_subtrees"] == 0
    without = kd.build(V, F, cfg, device="cuda", settings=GpuSettings(small_refs=0))
    assert without.build_info["small_subtrees"] == 0
    # the same tree, hence the same depth, however it was built
    assert info["depth"] == without.build_info["depth"]
    assert info["levels"] <= without.build_info["levels"]


@gpu
@pytest.mark.parametrize("seed", range(6))
def test_gpu_medium_subtrees_equal_reference(seed):
    # meshes whose deferred nodes are mostly medium ones (a block each), down
    # to the smallest medium node and up to the largest
    rng = np.random.default_rng(7000 + seed)
    if seed % 3 == 0:
        V, F = soup(rng, 6000, scale=0.03)
    elif seed % 3 == 1:
        V, F = grid_soup(rng, 5000)  # equal positions and planar triangles
    else:
        V, F = needles_through_clouds(rng, 3000)
    # (not CONFIGS[3]: its max_depth=4 stops these meshes above their medium nodes)
    cfg = CONFIGS[(seed + seed // 3) % 3]
    reference = cpu_reference.build(V, F, cfg)
    medium = []
    for small_refs in (enc.SMALL_MAX_REFS + 1, 129, enc.MEDIUM_MAX_REFS):
        settings = GpuSettings(small_refs=small_refs, small_min_refs=0)
        tree = kd.build(V, F, cfg, device="cuda", settings=settings)
        medium.append(tree.build_info["medium_subtrees"])
        assert_same_tree(reference, tree)
        tree.check()
    assert medium[-1] > 0


@gpu
def test_gpu_small_subtrees_run_again_when_the_output_is_full():
    # Output buffers as small as the level loop allows: the subtrees overflow
    # them (the kernel stops, the host grows them and runs it again), and the
    # deferral records outgrow their one-record buffer (the loop stops and is
    # launched again).
    def tight(num_events, num_refs):
        return num_events, num_refs, 1, 1

    rng = np.random.default_rng(11)
    V, F = soup(rng, 3000, scale=0.02)
    settings = GpuSettings(loop_capacity=tight, small_refs=enc.SMALL_MAX_REFS, small_records=1,
                           small_min_refs=0)
    tree = kd.build(V, F, device="cuda", settings=settings)
    assert tree.build_info["small_subtrees"] > 1
    assert tree.build_info["loop_launches"] > 1
    assert_same_tree(cpu_reference.build(V, F), tree)


@gpu
@pytest.mark.parametrize("short, clip", [("records", False), ("tree", False), ("tree", True)])
def test_gpu_a_loop_launched_again_with_room_for_the_children_keeps_its_buffers(short, clip):
    # The loop stops again and again for the deferral records (one record of
    # room) or the tree (one node and one leaf entry), never for its level
    # buffers (four times the start level's events and references): each
    # launch again starts from the level where the last one stopped, in the
    # same buffers, and the tree is still the reference's.
    def roomy(num_events, num_refs):
        tree = (1, 1) if short == "tree" else (num_refs + 256, 4 * num_refs + 256)
        return 4 * num_events, 4 * num_refs, 2 * num_refs, tree

    V, F = soup(np.random.default_rng(12), 3000, scale=0.02)
    cfg = SAHConfig(clip=clip)
    settings = GpuSettings(loop_capacity=roomy, small_refs=enc.SMALL_MAX_REFS,
                           small_records=1 if short == "records" else 0, small_min_refs=0)
    tree = kd.build(V, F, cfg, device="cuda", settings=settings)
    info = tree.build_info
    assert info["level_loop"] == "grid" and not info["stage_levels"]
    assert info["loop_launches"] > 1 and info["loop_buffers"] == 1
    assert_same_tree(cpu_reference.build(V, F, cfg), tree)
    tree.check()


def test_a_page_grows_by_what_the_shrinking_levels_after_the_full_one_write():
    from kdtree_gpu.builder.gpu.small import page_growth

    # levels halving: the rest is about as much again as the full level's
    # (1.25 times the geometric series' 2 * 1000)
    assert page_growth([4000, 2000, 1000], 100_000) == 2500
    # level 0, or levels still growing (or barely shrinking): half the first room
    assert page_growth([1000], 100_000) == 50_000
    assert page_growth([900, 1000], 100_000) == 50_000
    assert page_growth([1000, 800], 100_000) == 50_000
    # at most half the first room, at least twice the level's own
    assert page_growth([2000, 1500], 10_000) == 5000
    assert page_growth([2000, 1000], 1000) == 2000
    # the dragon subdivided twice, in D (its first room 4 D): its room ran out at
    # its twelfth subtree level with about 0.12 D nodes, after 0.25
    grown = page_growth([25, 12], 400)
    assert 2 * 12 <= grown < 100 // 2


def test_a_subtree_level_counts_its_records_at_both_ends_of_one_word():
    # records of more than SMALL_TINY_REFS references (a warp each) fill the
    # buffer from the front, the others (a thread each) from the back
    from kdtree_gpu.builder.gpu.small import level_records

    shift = enc.SMALL_RECORDS_BACK_SHIFT
    assert level_records(0) == 0
    assert level_records(5) == 5
    assert level_records(7 << shift) == 7
    assert level_records(np.uint64(5 | 7 << shift)) == 12
    assert level_records((2 ** shift - 1) | (3 << shift)) == 2 ** shift + 2
    assert 1 <= enc.SMALL_TINY_REFS < 32 <= enc.SMALL_MAX_REFS


def test_the_subtree_stage_room_is_sized_from_the_deferred_references():
    d = 10_000
    events = 6 * (5 * d // 4 + 1024)  # (six per reference of the medium nodes)
    assert GpuSettings().small_capacities(d) == (9 * d // 2 + 1024, 9 * d // 2 + 1024,
                                                 13 * d // 20 + 1024, 12 * d // 5 + 1024, events)
    tiny = GpuSettings(small_capacity=lambda refs: (0, 1, 2, refs))
    # at least one row each; the medium events' room the default's
    assert tiny.small_capacities(5) == (1, 1, 2, 5, 6 * (5 * 5 // 4 + 1024))
    assert GpuSettings(small_capacity=lambda refs: (3, 1, 2, refs, 0)).small_capacities(5) \
        == (3, 1, 2, 5, 1)


def _room(high_water, deferred_refs=10_000, footprint=3_000_000):
    from types import SimpleNamespace

    from kdtree_gpu.builder.gpu.small import room_under_peak

    workspace = SimpleNamespace(high_water=high_water, footprint=lambda: footprint)
    # the tree's block: room for 600 nodes and the levels' leaf entries
    out = SimpleNamespace(node_capacity=600, leaf_capacity=deferred_refs)
    state = SimpleNamespace(level_base=500, leaf_ref_base=deferred_refs,
                            deferred_refs=deferred_refs)
    caps = GpuSettings().small_capacities(deferred_refs)
    return room_under_peak(workspace, out, state, caps)


def test_the_subtree_stage_takes_the_node_room_the_peak_leaves():
    from kdtree_gpu.builder.gpu import small

    most = int(small.MORE_NODES_PER_REF * 10_000)
    assert _room(0) == 0  # no peak yet: nothing is free
    assert _room(10 ** 12) == most  # at most MORE_NODES_PER_REF per deferred reference
    # between the two, every node of room costs its bytes of the peak (less the
    # margin) in the tree's second page, and as much again once the finished
    # tree's copies outgrow the stage's buffers (here past 15,546 nodes: the
    # buffers and packed leaf list, 966,016 bytes, against the copies' 763,908)
    assert small.PEAK_MARGIN == 1 / 16 and small.NODE_BYTES == 13  # (the numbers below)
    free = [h for h in range(0, 40_000_000, 52_000) if 3000 < _room(h) < most - 3000]
    assert free  # (each a multiple of 16: 15/16 of it is exact)
    h = next(h for h in free if _room(h) < 12_000)
    assert _room(h + 20_800) - _room(h) == 1500  # 15/16 of 20,800 bytes: 1500 nodes
    # what lives beside the stage is not free
    assert _room(h, footprint=3_000_000 + 13_000) == _room(h) - 1000
    h = next(h for h in free if _room(h) > 17_000)
    assert _room(h + 20_800) - _room(h) == 750  # a page row and a copy's each


@gpu
def test_gpu_the_bunny_subtree_stage_runs_once_without_a_higher_peak(mesh_path):
    # its subtrees have more nodes per deferred reference than the default room
    # (a second run of the levels, about a tenth of its build); the room the
    # peak leaves holds them
    from kdtree_gpu.builder.settings import default_small_capacity

    V, F = kd.load_mesh(mesh_path("stanford_bunny"))
    as_given = kd.build(V, F, device="cuda",
                        settings=GpuSettings(small_capacity=default_small_capacity))
    tree = kd.build(V, F, device="cuda")
    assert as_given.build_info["small_runs_full"]  # the default room alone runs out
    assert tree.build_info["small_runs_full"] == []
    assert tree.build_info["peak_device_bytes"] <= as_given.build_info["peak_device_bytes"]
    assert_same_tree(cpu_reference.build(V, F), tree)


@gpu
@pytest.mark.parametrize("small_refs, grid", [(enc.SMALL_MAX_REFS, True),
                                              (enc.SMALL_MAX_REFS, False),
                                              (enc.MEDIUM_MAX_REFS, True)],
                         ids=["levels-in-one-launch", "launch-per-level", "medium"])
@pytest.mark.parametrize("room", [(1, 1, 1, 1), (1, 4096, 4096, 100_000), (64, 1, 1, 64),
                                  (1 << 20, 1 << 20, 4096, 100_000, 1), "bunny"])
def test_gpu_small_subtrees_go_on_from_the_level_that_found_room_full(room, small_refs, grid,
                                                                      mesh_path):
    # With the subtree stage's room far too small, levels find the tree's
    # pages or their children's buffers full again and again; each time the
    # levels go on from the first that did, and the tree is still the
    # reference's, its leaf lists packed (tree.check).
    if room == "bunny":  # a real mesh, with a fraction of what its subtrees need
        V, F = kd.load_mesh(mesh_path("stanford_bunny"))
        capacity = lambda refs: (refs, refs, refs // 16, refs // 2)  # noqa: E731
    else:
        V, F = soup(np.random.default_rng(sum(room)), 4000, scale=0.02)
        capacity = lambda refs: room  # noqa: E731
    settings = GpuSettings(small_refs=small_refs, small_min_refs=0, small_capacity=capacity,
                           small_grid=grid)
    tree = kd.build(V, F, device="cuda", settings=settings)
    info = tree.build_info
    assert info["small_subtrees"] > 0
    runs = info["small_runs_full"]
    if small_refs <= enc.SMALL_MAX_REFS:
        # a run is one launch in one grid, else a launch per level that can exist
        launches = info["small_launches"]
        assert launches == len(runs) + 1 if grid else launches > len(runs) + 1
    if room != "bunny" and len(room) == 5:  # room for everything but the medium nodes' events
        if small_refs <= enc.SMALL_MAX_REFS:
            assert runs == []  # (no medium nodes: no events)
        else:
            assert info["medium_subtrees"] > 0 and runs
            assert {bits for _, bits in runs} == {enc.SMALL_FULL_EVENTS}
        tree.check()
        assert_same_tree(cpu_reference.build(V, F), tree)
        return
    assert runs and all(0 <= level and bits for level, bits in runs)
    assert [level for level, _ in runs] == sorted(level for level, _ in runs)
    bits = 0
    for _, b in runs:
        bits |= b
    # the room asked for is at least what the tree's output holds already
    # (the level loop's share of leaf entries is more than one): the bunny's
    # tree outgrows it, the soup's not
    every = enc.SMALL_FULL_NODES | enc.SMALL_FULL_RECORDS | enc.SMALL_FULL_REFS
    if room == "bunny":
        assert bits == every | enc.SMALL_FULL_LEAVES
    elif room == (1, 1, 1, 1):
        assert bits & every == every
    tree.check()
    assert_same_tree(cpu_reference.build(V, F), tree)


@gpu
@pytest.mark.parametrize("seed", range(10))
def test_gpu_subtree_levels_in_one_launch_are_the_launches_per_level(seed):
    # The cooperative launch (a grid barrier between levels, stopping after
    # the last level with nodes) and one launch per level that can exist build
    # the same levels, node for node, and the reference's tree.
    V, F = _scene(seed)
    cfg = CONFIGS[seed % len(CONFIGS)]
    built = {}
    for grid in (True, False):
        settings = GpuSettings(small_refs=enc.SMALL_MAX_REFS, small_min_refs=0, small_grid=grid)
        built[grid] = kd.build(V, F, cfg, device="cuda", settings=settings)
    one, per_level = built[True].build_info, built[False].build_info
    assert one["small_subtrees"] == per_level["small_subtrees"]
    if one["small_subtrees"]:
        assert one["small_launches"] == 1 < per_level["small_launches"]
    assert one["small_level_sizes"] == per_level["small_level_sizes"]
    assert one["depth"] == per_level["depth"]
    reference = cpu_reference.build(V, F, cfg)
    for tree in built.values():
        assert_same_tree(reference, tree)
        tree.check()


def test_small_grid_setting_is_checked():
    with pytest.raises(ValueError, match="small_grid"):
        GpuSettings(small_grid=1)


@gpu
@pytest.mark.parametrize("settings", [SMALL, MEDIUM], ids=["small", "medium"])
@pytest.mark.parametrize("axes", ["all", "longest"])
def test_gpu_small_subtrees_on_a_real_mesh(axes, settings, mesh_path):
    V, F = kd.load_mesh(mesh_path("stanford_bunny"))
    cfg = SAHConfig(axes=axes)
    tree = kd.build(V, F, cfg, device="cuda", settings=settings)
    assert tree.build_info["small_subtrees"] > 0
    assert (tree.build_info["medium_subtrees"] > 0) == (settings is MEDIUM)
    assert_same_tree(cpu_reference.build(V, F, cfg), tree)


@gpu
def test_gpu_small_subtrees_keep_queries_exact(mesh_path):
    V, F = kd.load_mesh(mesh_path("suzanne"))
    tree = kd.build(V, F, device="cuda", settings=SMALL)
    assert tree.build_info["small_subtrees"] > 0
    O, D, tmin, tmax = random_rays(tree.bounds, 4000, 5)
    hits = tree.intersect(O, D, tmin, tmax, device="cuda")
    assert_same_hits(hits, intersect_brute(tree, O, D, tmin=tmin, tmax=tmax, device="cuda"))


@pytest.mark.parametrize("cap_recs, cap_refs, cap_events", [(1, 1, 1), (1024, 4096, 6),
                                                          (3000, 7, 5000)])
def test_the_subtree_buffers_are_disjoint_aligned_views_of_one_block(cap_recs, cap_refs,
                                                                     cap_events):
    # (NumPy stands in for CuPy: outside a build, pooled() changes nothing)
    from kdtree_gpu.builder.gpu.small import _stage_buffers
    from kdtree_gpu.builder.gpu.workspace import ALIGN

    both = _stage_buffers(np, (2, cap_recs), (2, cap_refs), (2, cap_events))  # both levels'
    records, refs, mediums, events = both
    assert records.shape == (2, cap_recs, enc.SMALL_RECORD) and records.dtype == np.int32
    assert refs.shape == (2, cap_refs) and refs.dtype == np.int32
    # a medium record per SMALL_MAX_REFS + 1 references of room: they never run out first
    rows = cap_refs // (enc.SMALL_MAX_REFS + 1) + 1
    assert mediums.shape == (2, rows, enc.MEDIUM_RECORD) and mediums.dtype == np.int32
    assert events.shape == (2, cap_events) and events.dtype == np.uint16
    one = _stage_buffers(np, cap_recs, cap_refs, cap_events)  # one level's
    assert [a.shape for a in one] == [a.shape[1:] for a in both]
    assert _stage_buffers(np, cap_recs, cap_refs)[3].shape == (1,)  # no medium nodes
    assert records.base is refs.base is mediums.base is events.base is not None  # one block
    for a, b in zip(both, both[1:]):
        gap = b.ctypes.data - a.ctypes.data
        assert gap % ALIGN == 0 and gap >= a.nbytes
    for k, a in enumerate(both):
        a[...] = k + 1
    assert all((a == k + 1).all() for k, a in enumerate(both))
