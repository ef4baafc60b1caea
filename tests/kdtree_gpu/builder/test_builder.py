"""The level-by-level builder against the CPU reference builders.

NumPy pipeline (CI) and CuPy pipeline (``-m gpu``) must make the same tree as
``cpu_reference`` under the same settings (build rules R1-R10).
"""

import numpy as np
import pytest

import cpu_reference
from cpu_reference import naive
import kdtree_gpu as kd
from kdtree_gpu.primitives import inclusive_scan, inclusive_scan_in_place
from kdtree_gpu import SAHConfig
from kdtree_gpu.builder import GpuSettings
from kdtree_gpu.builder.gpu import level_loop
from kdtree_gpu.device import multiprocessors
from kdtree_gpu.testing.meshes import (CONFIGS, REAL_MESHES, assert_same_tree, grid_soup,
                                       quads, random_scene, soup, tight_loop_capacity)



# --- NumPy pipeline (runs in CI) ----------------------------------------------------------
@pytest.mark.parametrize("seed", range(120))
def test_numpy_pipeline_equals_naive_builder(seed):
    V, F = random_scene(seed)
    cfg = CONFIGS[seed % len(CONFIGS)]
    assert_same_tree(naive.build(V, F, cfg), kd.build(V, F, cfg, device="cpu", kernels="xp"))


@pytest.mark.parametrize("seed", range(40))
def test_numpy_pipeline_equals_reference_on_larger_scenes(seed):
    rng = np.random.default_rng(1000 + seed)
    V, F = soup(rng, 400, scale=0.05) if seed % 2 else grid_soup(rng, 300)
    cfg = CONFIGS[seed % len(CONFIGS)]
    assert_same_tree(cpu_reference.build(V, F, cfg), kd.build(V, F, cfg, device="cpu", kernels="xp"))


def test_numpy_pipeline_on_a_real_mesh(mesh_path):
    V, F = kd.load_mesh(mesh_path("suzanne"))
    assert_same_tree(cpu_reference.build(V, F), kd.build(V, F, device="cpu", kernels="xp"))


def test_build_accepts_a_trimesh_mesh():
    trimesh = pytest.importorskip("trimesh")
    mesh = trimesh.creation.icosphere(subdivisions=2)
    tree = kd.build(mesh, device="cpu", kernels="xp")
    assert tree.num_triangles == len(mesh.faces)
    assert_same_tree(cpu_reference.build(mesh.vertices, mesh.faces), tree)


def test_clip_on_cpu_runs_the_reference():
    V, F = quads(np.random.default_rng(3), 10)
    cfg = SAHConfig(clip=True)
    tree = kd.build(V, F, cfg, device="cpu")
    assert tree.build_info["builder"] == "reference"
    assert_same_tree(cpu_reference.build(V, F, cfg), tree)


def test_cpu_default_is_the_reference_builder_and_build_info_has_one_layout():
    V, F = soup(np.random.default_rng(7), 50)
    for kernels, builder in ((None, "reference"), ("reference", "reference"), ("xp", "levels")):
        tree = kd.build(V, F, device="cpu", kernels=kernels)
        info = tree.build_info
        assert info["builder"] == builder
        assert info["device"] == "cpu"
        assert info["kernels"] == (kernels or "reference")
        assert info["seconds"] > 0
    assert kd.build(V, F, device="cpu").compare(kd.build(V, F, device="cpu", kernels="xp")) is None


def test_build_profile_table():
    V, F = soup(np.random.default_rng(4), 200)
    tree = kd.build(V, F, device="cpu", kernels="xp", profile=True)
    table = tree.build_info["profile_table"]
    for name in ("compute_split_costs", "select_best_splits", "classify_triangles",
                 "split_events", "emit_level"):
        assert name in table


@pytest.mark.parametrize("bad, message", [
    ((np.zeros((0, 3), np.float32), np.zeros((0, 3), np.int32)), "empty"),
    ((np.array([[0, 0, 0], [1, 0, 0], [np.nan, 1, 0]], np.float32), np.array([[0, 1, 2]])), "NaN"),
    ((np.eye(3, dtype=np.float32), np.array([[0, 1, 3]])), "out of range"),
    ((np.eye(3, dtype=np.float32), np.array([[0, -1, 2]])), "negative"),
    ((np.eye(3, dtype=np.float32)[:, :2], np.array([[0, 1, 2]])), "shape"),
    ((np.eye(3, dtype=np.float32), np.array([[0, 1, 2]], dtype=np.float32)), "integer"),
    ((np.zeros((3, 3), np.float32), np.array([[0, 1, 2]])), "degenerate"),
])
def test_bad_input_is_named(bad, message):
    with pytest.raises(kd.MeshError, match=message):
        kd.build(*bad, device="cpu")


def test_bad_arguments():
    V, F = soup(np.random.default_rng(0), 5)
    with pytest.raises(ValueError, match="device"):
        kd.build(V, F, device="tpu")
    with pytest.raises(TypeError, match="SAHConfig"):
        kd.build(V, F, config={"k_traversal": 1})
    with pytest.raises(ValueError, match="kernels"):
        kd.build(V, F, device="cpu", kernels="magic")
    for kernels in ("fused", "stages"):
        with pytest.raises(ValueError, match=f"kernels='{kernels}' does not run on device 'cpu'"):
            kd.build(V, F, device="cpu", kernels=kernels)


# --- CuPy pipeline (GPU) ------------------------------------------------------------------
gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("kernels", ["fused", "stages", "xp"])
@pytest.mark.parametrize("seed", range(0, 200, 2))
def test_gpu_pipeline_equals_naive_builder(seed, kernels):
    V, F = random_scene(seed)
    cfg = CONFIGS[seed % len(CONFIGS)]
    assert_same_tree(naive.build(V, F, cfg), kd.build(V, F, cfg, device="cuda", kernels=kernels))


def dirty_device_pool(num_bytes=64 << 20):
    """Fill free pool memory with 0xFF bytes, so that an output the build
    leaves unwritten holds garbage instead of lucky zeros: CuPy's pool (small
    arrays, the result) and the build's workspace pool (large temporaries,
    until the build first gives blocks back)."""
    import cupy

    from kdtree_gpu.builder.gpu.workspace import device_pool

    junk = cupy.full(num_bytes, 0xFF, dtype=np.uint8)
    del junk
    block = device_pool(cupy).malloc(num_bytes)
    cupy.cuda.runtime.memset(block.ptr, 0xFF, num_bytes)
    del block


TIGHT = GpuSettings(loop_capacity=tight_loop_capacity)
# Per-level sizes are compared between drivers with every level in them (the
# small-node stage, which only the level-loop kernel uses, takes levels away)
ALL_LEVELS = GpuSettings(small_refs=0)
TIGHT_ALL_LEVELS = GpuSettings(loop_capacity=tight_loop_capacity, small_refs=0)
TWO_BLOCKS = GpuSettings(loop_one_block_events=0)


@gpu
@pytest.mark.parametrize("seed", range(1, 200, 2))
def test_gpu_level_loop_restarts_and_stage_launches_make_the_same_tree(seed):
    # Default: every level in one launch of the level-loop kernel. Then with
    # buffers that every level outgrows (one launch per growth, each going on
    # from the level that stopped); then one launch per stage.
    V, F = random_scene(seed)
    cfg = CONFIGS[seed % len(CONFIGS)]
    reference = naive.build(V, F, cfg)
    dirty_device_pool()
    whole = kd.build(V, F, cfg, device="cuda")
    assert_same_tree(reference, whole)
    assert whole.build_info["level_loop"] == "grid"
    assert whole.build_info["loop_launches"] == 1
    # small levels run the kernel of one block a multiprocessor; the kernel of
    # two (large levels) makes the same tree, level for level
    assert whole.build_info["loop_kernel"] == "kd_build_levels_grid_one_block"
    dirty_device_pool()
    two = kd.build(V, F, cfg, device="cuda", settings=TWO_BLOCKS)
    assert_same_tree(reference, two)
    assert two.build_info["loop_kernel"] == "kd_build_levels_grid"
    assert two.build_info["level_sizes"] == whole.build_info["level_sizes"]
    dirty_device_pool()
    grown = kd.build(V, F, cfg, device="cuda", settings=TIGHT)
    assert_same_tree(reference, grown)
    assert grown.build_info["level_sizes"] == whole.build_info["level_sizes"]
    dirty_device_pool()
    every = kd.build(V, F, cfg, device="cuda", settings=ALL_LEVELS)
    assert_same_tree(reference, every)
    dirty_device_pool()
    grown = kd.build(V, F, cfg, device="cuda", settings=TIGHT_ALL_LEVELS)
    assert_same_tree(reference, grown)
    assert grown.build_info["level_sizes"] == every.build_info["level_sizes"]
    if every.build_info["levels"] > 2:
        assert grown.build_info["loop_launches"] > 1
    dirty_device_pool()
    staged = kd.build(V, F, cfg, device="cuda", kernels="stages")
    assert_same_tree(reference, staged)
    assert staged.build_info["level_loop"] == "stages"
    assert staged.build_info["level_sizes"] == every.build_info["level_sizes"]


def _scene_built_whole(rng_seed, seed):
    """A generated scene (``seed`` picks its kind and config), the reference's tree,
    the GPU's built with every level in the loop, and that build's events per level."""
    rng = np.random.default_rng(rng_seed)
    V, F = (soup(rng, 400, scale=0.05), grid_soup(rng, 300), quads(rng, 60, True))[seed % 3]
    cfg = CONFIGS[seed % len(CONFIGS)]
    reference = cpu_reference.build(V, F, cfg)
    whole = kd.build(V, F, cfg, device="cuda", settings=ALL_LEVELS)
    return V, F, cfg, reference, whole, [e for _, _, e in whole.build_info["level_sizes"]]


@gpu
@pytest.mark.parametrize("seed", range(0, 60, 3))
def test_gpu_large_levels_leave_the_loop_and_small_ones_return(seed):
    # Levels above LOOP_MAX_EVENTS run one launch per stage; the build goes
    # back to the level-loop kernel when levels shrink again.
    V, F, cfg, reference, whole, sizes = _scene_built_whole(3000 + seed, seed)
    settings = GpuSettings(loop_max_events=int(np.median(sizes)), small_refs=0)
    dirty_device_pool()
    mixed = kd.build(V, F, cfg, device="cuda", settings=settings)
    assert_same_tree(reference, mixed)
    assert mixed.build_info["level_sizes"] == whole.build_info["level_sizes"]
    if max(sizes) > settings.loop_max_events:
        assert mixed.build_info["loop_launches"] >= 1


@gpu
def test_gpu_the_loop_takes_a_shrinking_level_from_the_stages():
    # With deferral, the stages hand a level with fewer events than its parent
    # back to the loop, whose first buffers are then sized for 9/8 of it
    # (loop_plan's parent_events); a level outgrowing them relaunches the loop.
    # small_refs=8: the level handed over (about 10 references per node in
    # cpu_reference's tree) has nodes the loop splits; at 64 the stages would
    # defer every node of it themselves (the next test).
    V, F = soup(np.random.default_rng(7), 3000, scale=0.02)
    settings = GpuSettings(loop_max_events=4096, small_min_refs=0, small_refs=8)
    dirty_device_pool()
    tree = kd.build(V, F, device="cuda", settings=settings)
    assert_same_tree(cpu_reference.build(V, F), tree)
    info = tree.build_info
    last_stage = info["stage_levels"][-1]
    events = [e for _, _, e in info["level_sizes"]]
    assert info["loop_launches"] >= 1 and last_stage + 1 < len(events)
    assert events[last_stage + 1] < events[last_stage]


@gpu
def test_gpu_a_level_of_small_nodes_stays_with_the_stages():
    # The stages defer small nodes as the loop does. A level they would hand to
    # the loop whose nodes all hold at most small_refs references is theirs:
    # they defer every node of it the loop would split (cpu_reference's tree of
    # this soup: 64 nodes of up to 66 references at level 6, then 2 of up to
    # 42 at level 7, about 400 events), and the loop never runs.
    V, F = soup(np.random.default_rng(7), 3000, scale=0.02)
    settings = GpuSettings(loop_max_events=4096, small_min_refs=0)
    dirty_device_pool()
    tree = kd.build(V, F, device="cuda", settings=settings)
    assert_same_tree(cpu_reference.build(V, F), tree)
    info = tree.build_info
    assert info["loop_launches"] == 0 and info["small_subtrees"] > 0
    last = info["stage_levels"][-1]
    assert info["level_sizes"][last][2] <= 4096  # a level the loop could have taken


@gpu
@pytest.mark.parametrize("scene", ["soup", "grid", "stanford_bunny"])
def test_gpu_stages_defer_small_nodes(scene, mesh_path):
    # Every level by stages, deferring nodes of up to 64 references to the
    # subtree stage (kd_defer_small, kd_defer_records): the same tree.
    rng = np.random.default_rng(11)
    V, F = {"soup": lambda: soup(rng, 3000, scale=0.02), "grid": lambda: grid_soup(rng, 2000),
            "stanford_bunny": lambda: kd.load_mesh(mesh_path("stanford_bunny"))}[scene]()
    settings = GpuSettings(level_loop=False, small_min_refs=0)
    dirty_device_pool()
    tree = kd.build(V, F, device="cuda", settings=settings)
    assert_same_tree(cpu_reference.build(V, F), tree)
    info = tree.build_info
    assert info["loop_launches"] == 0 and info["small_subtrees"] > 0
    assert info["stage_levels"] == list(range(len(info["stage_levels"])))


@gpu
@pytest.mark.parametrize("name", ["suzanne", "spot", "stanford_bunny"])
def test_gpu_level_loop_restarts_on_real_meshes(name, mesh_path):
    V, F = kd.load_mesh(mesh_path(name))
    dirty_device_pool()
    tree = kd.build(V, F, device="cuda", settings=TIGHT)
    assert_same_tree(cpu_reference.build(V, F), tree)
    assert tree.build_info["loop_launches"] > 3


@gpu
@pytest.mark.parametrize("how", ["settings", "device"])
def test_gpu_without_cooperative_launch_every_level_runs_by_stages(how, monkeypatch):
    # A device that cannot run cooperative launches gets no level-loop kernel,
    # as settings.level_loop=False pretends.
    import kdtree_gpu.builder.gpu as gpu_builder

    settings = GpuSettings(level_loop=how != "settings")
    if how == "device":
        monkeypatch.setattr(gpu_builder, "cooperative_launch", lambda index: False)
    V, F = soup(np.random.default_rng(5), 800)
    tree = kd.build(V, F, device="cuda", settings=settings)
    assert_same_tree(cpu_reference.build(V, F), tree)
    info = tree.build_info
    assert info["level_loop"] == "stages" and info["loop_launches"] == 0
    assert info["stage_levels"] == list(range(info["levels"]))


@gpu
def test_gpu_level_loop_grid_fits_the_device():
    import cupy

    from kdtree_gpu import encoding as enc

    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    assert multiprocessors(cupy.cuda.Device().id) == sms
    for one_block in (False, True):
        kernel, grid = level_loop.level_loop_kernel(cupy, one_block=one_block)
        assert grid % sms == 0 and grid >= sms
        assert kernel.num_regs * enc.LOOP_BLOCK * (grid // sms) <= 65536
        assert grid == sms if one_block else grid >= 2 * sms


@gpu
@pytest.mark.parametrize("blocks", [1, 3, 0, 1 << 20])
@pytest.mark.parametrize("scene", ["soup", "grid", "suzanne"])
def test_gpu_level_loop_grid_does_not_change_the_tree(blocks, scene, mesh_path):
    # 0: the grid from the start level's events; 1 << 20: more than the
    # device holds at once, so every resident block.
    import cupy

    rng = np.random.default_rng(blocks + 7)
    V, F = {"soup": lambda: soup(rng, 3000, scale=0.02), "grid": lambda: grid_soup(rng, 2000),
            "suzanne": lambda: kd.load_mesh(mesh_path("suzanne"))}[scene]()
    settings = GpuSettings(loop_blocks=blocks)
    tree = kd.build(V, F, device="cuda", settings=settings)
    assert_same_tree(cpu_reference.build(V, F), tree)
    # (the kernel the build ran: one or two blocks a multiprocessor)
    one_block = tree.build_info["loop_kernel"] == "kd_build_levels_grid_one_block"
    resident = level_loop.level_loop_kernel(cupy, one_block=one_block)[1]
    grids = tree.build_info["loop_blocks"]
    assert len(grids) == tree.build_info["loop_launches"] >= 1
    assert all(1 <= g <= resident for g in grids)
    # the first launch starts at the root, whose sizes build_info keeps: its
    # grid is the one asked for, or more where a block's chunk of a scan of
    # the buffers would hold more than SCAN_CHUNK_MAX items
    _, root_refs, root_events = tree.build_info["level_sizes"][0]
    cap_e, cap_r = level_loop.loop_plan(SAHConfig(), settings, root_events, root_refs, 1,
                                        resident)[2][:2]
    least = -(-(max(cap_e, cap_r) + 1) // kd.encoding.SCAN_CHUNK_MAX)
    assert grids[0] * kd.encoding.SCAN_CHUNK_MAX >= max(cap_e, cap_r) + 1
    if blocks:
        assert grids[0] == min(max(blocks, least), resident)
    else:
        assert grids[0] == level_loop.loop_grid(root_events, resident, settings) < resident


def test_a_relaunched_loop_gets_what_a_loop_from_its_level_would_get_within_twice_the_need():
    need = 1000
    assert level_loop.restart_capacity(need, 1500 + 4096) == 2 * need  # at most twice the need
    assert level_loop.restart_capacity(need, 1200) == 1200  # the first buffers' policy
    assert level_loop.restart_capacity(need, 10) == need  # a tight policy: the need itself
    assert level_loop.restart_capacity(need, 1800, limit=1100) == 1100  # the loop's event limit
    # the policy of the first buffers, from a level as large as the need
    settings = GpuSettings()
    small = settings.small_refs_for(10 ** 6)
    fresh = settings.loop_capacities(10 ** 6, 2 * 10 ** 5, small)
    assert level_loop.restart_capacity(10 ** 6, fresh[0]) == 3 * 10 ** 6 // 2 + 4096


def test_the_loop_plan_matches_the_first_buffers_of_a_root_level():
    cfg = SAHConfig()
    settings = GpuSettings()
    max_events, small, caps = level_loop.loop_plan(cfg, settings, 600_000, 100_000, 1)
    assert max_events == settings.loop_stay_bound() and small == settings.small_refs
    cap_e, cap_r, cap_n, cap_new, cap_tree = caps
    assert (cap_e, cap_r, cap_n, cap_tree) == settings.loop_capacities(600_000, 100_000, small)
    assert cap_new == 0
    # a capacity callable may give one number for the tree's nodes and leaf entries
    caps = level_loop.loop_plan(cfg, GpuSettings(loop_capacity=tight_loop_capacity), 600, 100, 1)[2]
    assert caps[4] == (1, 1)
    # a tiny level's buffers hold at least a chunk of events
    caps = level_loop.loop_plan(cfg, GpuSettings(loop_capacity=tight_loop_capacity), 6, 1, 1)[2]
    assert caps[0] == level_loop.LOOP_MIN_EVENTS
    # perfect splits: room for new events, no deferral, and a root too large for
    # a new event's key goes to the per-stage path
    clip = SAHConfig(clip=True)
    _, small, caps = level_loop.loop_plan(clip, settings, 6000, 1000, 1)
    assert small == 0 and caps[3] == caps[0] // 2 + 1024
    assert level_loop.loop_plan(clip, GpuSettings(loop_max_events=1 << 40), 1 << 33, 1, 1) is None
    # in launches of a few blocks, the buffers stay within the blocks' scan chunks
    chunk = kd.encoding.SCAN_CHUNK_MAX
    assert level_loop.loop_plan(cfg, settings, 2 * chunk, 1000, 1, resident=2) is None
    max_events, _, caps = level_loop.loop_plan(cfg, settings, chunk, chunk // 3, 1, resident=2)
    assert max_events == 2 * chunk - 1 and max(caps[0], caps[1]) + 1 <= 2 * chunk


def test_the_loop_plan_of_a_shrinking_level_from_the_stages():
    # a start level with fewer events than its parent (deep in the tree, with
    # deferral) gets buffers for SHRINKING_EIGHTHS / 8 of it, a growing one the
    # policy's; without deferral the policy's too
    cfg, settings = SAHConfig(), GpuSettings()
    events, refs = 6_000_000, 1_000_000
    policy = level_loop.loop_plan(cfg, settings, events, refs, 1)[2]
    for parent, want in ((events + 1, level_loop.SHRINKING_EIGHTHS), (events, None)):
        caps = level_loop.loop_plan(cfg, settings, events, refs, 1, parent_events=parent)[2]
        if want is None:
            assert caps == policy
        else:
            assert caps[0] == want * events // 8 + 4096 < policy[0]
            assert caps[1] == want * refs // 8 + 1024 < policy[1]
            assert caps[2:] == policy[2:]
    clip = SAHConfig(clip=True)
    assert level_loop.loop_plan(clip, settings, 6000, 1000, 1, parent_events=10 ** 6)[2] == \
        level_loop.loop_plan(clip, settings, 6000, 1000, 1)[2]


def test_every_node_small_reads_the_largest_node():
    # (NumPy arrays stand in for the level's device arrays: the function only
    # subtracts, takes the maximum and reads it)
    from types import SimpleNamespace

    nodes = SimpleNamespace(size=3, node_ref_offset=np.array([0, 10, 74, 80], np.int64))
    assert level_loop.every_node_small(np, nodes, 64)  # the largest node holds 64
    assert not level_loop.every_node_small(np, nodes, 63)
    assert not level_loop.every_node_small(np, nodes, 0)  # no deferral: never
    empty = SimpleNamespace(size=0, node_ref_offset=np.zeros(1, np.int64))
    assert not level_loop.every_node_small(np, empty, 64)


def test_loop_grid_from_the_start_level():
    per_block = kd.encoding.LOOP_BLOCK * level_loop.LOOP_EVENTS_PER_THREAD
    auto = GpuSettings()
    assert level_loop.loop_grid(0, 264, auto) == 1
    assert level_loop.loop_grid(10, 264, auto) == 1
    # the widest level is taken as 3.5x the start level
    assert level_loop.loop_grid(2 * per_block, 264, auto) == 7
    assert level_loop.loop_grid(10 ** 9, 264, auto) == 264
    assert level_loop.loop_grid(10, 264, GpuSettings(loop_blocks=5)) == 5
    assert level_loop.loop_grid(10 ** 9, 264, GpuSettings(loop_blocks=500)) == 264
    # at least enough blocks that a block's chunk of a scan of max_items items
    # holds at most SCAN_CHUNK_MAX of them (the kernel stores 16-bit counts)
    chunk = kd.encoding.SCAN_CHUNK_MAX
    assert level_loop.loop_grid(10, 264, GpuSettings(loop_blocks=1), 4 * chunk) == 4
    assert level_loop.loop_grid(10, 264, GpuSettings(loop_blocks=1), 4 * chunk + 1) == 5
    assert level_loop.loop_grid(10, 264, auto, 3 * chunk) == 3
    assert level_loop.loop_grid(10, 264, GpuSettings(loop_blocks=9), 3 * chunk) == 9
    with pytest.raises(ValueError, match="loop_blocks"):
        GpuSettings(loop_blocks=-1)


@pytest.mark.parametrize("bad", [-1, 1.5, None])
def test_loop_one_block_events_setting_is_checked(bad):
    with pytest.raises(ValueError, match="loop_one_block_events"):
        GpuSettings(loop_one_block_events=bad)
    with pytest.raises(ValueError, match="loop_stay_events"):
        GpuSettings(loop_stay_events=bad)


def test_the_loop_enters_within_one_bound_and_stays_within_another():
    cfg = SAHConfig()
    # default: the children of a level the loop runs may grow to 1.5x the entry bound
    assert GpuSettings(loop_max_events=4096).loop_stay_bound() == 6144
    assert GpuSettings(loop_max_events=4096, loop_stay_events=5000).loop_stay_bound() == 5000
    # (a stay bound below the entry bound is the entry bound)
    assert GpuSettings(loop_max_events=4096, loop_stay_events=100).loop_stay_bound() == 4096
    settings = GpuSettings(loop_max_events=4096, loop_stay_events=8192)
    assert level_loop.loop_plan(cfg, settings, 4097, 1000, 1) is None
    max_events, _, caps = level_loop.loop_plan(cfg, settings, 4096, 1000, 1)
    assert max_events == 8192 and caps[0] <= 8192
    # the stay bound stays within the resident blocks' scan chunks
    chunk = kd.encoding.SCAN_CHUNK_MAX
    wide = GpuSettings(loop_max_events=chunk, loop_stay_events=4 * chunk)
    assert level_loop.loop_plan(cfg, wide, chunk, 1000, 1, resident=2)[0] == 2 * chunk - 1


@gpu
@pytest.mark.parametrize("seed", range(0, 12, 3))
def test_gpu_a_level_growing_past_the_entry_bound_stays_in_the_loop(seed):
    # A root level the loop takes whose children grow past loop_max_events stays
    # in the loop up to loop_stay_events; at a stay bound equal to the entry
    # bound the same level goes to the stages. Same tree either way.
    V, F, cfg, reference, whole, sizes = _scene_built_whole(4000 + seed, seed)
    root = sizes[0]
    assert max(sizes) > root  # (the scenes' levels grow past the root's events)
    stay = GpuSettings(loop_max_events=root, loop_stay_events=max(sizes), small_refs=0)
    leave = GpuSettings(loop_max_events=root, loop_stay_events=root, small_refs=0)
    for settings, staged in ((stay, False), (leave, True)):
        dirty_device_pool()
        tree = kd.build(V, F, cfg, device="cuda", settings=settings)
        assert_same_tree(reference, tree)
        assert tree.build_info["level_sizes"] == whole.build_info["level_sizes"]
        assert bool(tree.build_info["stage_levels"]) == staged


@gpu
@pytest.mark.parametrize("name", ["suzanne", "stanford_bunny"])
def test_gpu_stage_launches_equal_reference_on_real_meshes(name, mesh_path):
    V, F = kd.load_mesh(mesh_path(name))
    dirty_device_pool()
    tree = kd.build(V, F, device="cuda", kernels="stages")
    assert_same_tree(cpu_reference.build(V, F), tree)


@gpu
@pytest.mark.parametrize("seed", range(20))
def test_gpu_fused_equals_reference_on_larger_scenes(seed):
    rng = np.random.default_rng(2000 + seed)
    V, F = (soup(rng, 3000, scale=0.02), grid_soup(rng, 2000), quads(rng, 400, True))[seed % 3]
    cfg = CONFIGS[seed % len(CONFIGS)]
    assert_same_tree(cpu_reference.build(V, F, cfg), kd.build(V, F, cfg, device="cuda"))


@gpu
@pytest.mark.parametrize("name", REAL_MESHES)
@pytest.mark.parametrize("axes", ["all", "longest"])
def test_gpu_equals_reference_on_real_meshes(name, axes, mesh_path):
    V, F = kd.load_mesh(mesh_path(name))
    cfg = SAHConfig(axes=axes)
    assert_same_tree(cpu_reference.build(V, F, cfg), kd.build(V, F, cfg, device="cuda"))


@gpu
def test_gpu_clip_runs_in_the_level_loop():
    V, F = soup(np.random.default_rng(0), 40)
    cfg = SAHConfig(clip=True)
    reference = cpu_reference.build(V, F, cfg)
    # the default on a GPU, clipping or not: the CUDA drivers, levels in the loop
    tree = kd.build(V, F, cfg, device="cuda")
    assert tree.build_info["kernels"] == "fused"
    assert tree.build_info["level_loop"] == "grid"
    assert tree.build_info["stage_levels"] == []
    assert_same_tree(reference, tree)
    # without the level loop every level runs by stages, with the same tree
    staged = kd.build(V, F, cfg, device="cuda", settings=GpuSettings(level_loop=False))
    assert staged.build_info["stage_levels"] == list(range(staged.build_info["levels"]))
    assert_same_tree(reference, staged)
    # every level large (workspace_block=1): children, clipped events included, made aside
    aside = kd.build(V, F, cfg, device="cuda",
                     settings=GpuSettings(level_loop=False, workspace_block=1))
    assert_same_tree(reference, aside)


@gpu
@pytest.mark.parametrize("clip", [False, True])
def test_gpu_out_of_memory_is_a_clear_error_and_the_gpu_stays_usable(clip):
    import cupy

    V, F = soup(np.random.default_rng(1), 20000, scale=0.01)
    cfg = SAHConfig(clip=clip)
    pool = cupy.get_default_memory_pool()
    # Cached blocks would be reused without counting against the limit.
    pool.free_all_blocks()
    pool.set_limit(size=4 << 20)
    try:
        with pytest.raises(MemoryError, match="does not fit in GPU memory"):
            kd.build(V, F, cfg, device="cuda")
    finally:
        pool.set_limit(size=0)
    tree = kd.build(V, F, cfg, device="cuda")
    assert_same_tree(cpu_reference.build(V, F, cfg), tree)
    assert tree.build_info["peak_device_bytes"] > 0


@gpu
@pytest.mark.parametrize("name", ["cornell_box", "suzanne"])
def test_gpu_tree_arrays_are_what_the_checked_constructor_makes(name, mesh_path):
    # The builder's tree skips KdTree's checks and conversions: its arrays
    # must already be what they would make.
    import cupy

    from kdtree_gpu.tree.kdtree import ARRAY_DTYPES

    V, F = kd.load_mesh(mesh_path(name))
    tree = kd.build(V, F, device="cuda")
    checked = kd.KdTree(**{n: tree.device_array(n) for n in ARRAY_DTYPES}, config=tree.config)
    assert tree.device == checked.device == f"cuda:{cupy.cuda.runtime.getDevice()}"
    for n in ARRAY_DTYPES:
        a, b = tree.device_array(n), checked.device_array(n)
        assert isinstance(a, cupy.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        assert a.flags.c_contiguous
    # the host bounds kept from the build are the device bounds
    np.testing.assert_array_equal(tree.bounds, tree.device_array("bounds").get())
    assert_same_tree(cpu_reference.build(V, F), tree)
    tree.check()


@gpu
def test_gpu_profile_names_every_stage():
    V, F = soup(np.random.default_rng(2), 500)
    tree = kd.build(V, F, device="cuda", profile=True)
    table = tree.build_info["profile_table"]
    for name in ("prepare_mesh", "create_root_events", "build_levels_grid",
                 "read_level_counts", "traversal layout", "pack layout"):
        assert name in table
    tree = kd.build(V, F, device="cuda", profile=True, kernels="stages")
    table = tree.build_info["profile_table"]
    for name in ("compute_split_costs: costs", "select_best_splits", "classify_triangles",
                 "split_refs_and_events", "emit_level", "read_level_counts"):
        assert name in table


@gpu
@pytest.mark.parametrize("n", [1, 2, 255, 2047, 2048, 2049, 16383, 16384, 16385, 18_465, 100_003,
                               3_000_001])
def test_gpu_scans_equal_numpy_cumsum(n):
    import cupy

    rng = np.random.default_rng(n)
    # packed two-count values, as the builder scans them
    values = rng.integers(0, 3, n) | (rng.integers(0, 3, n) << 32)
    expected = np.cumsum(values)
    # Dirty the memory pool so an element the scan skips shows up as garbage.
    junk = cupy.full(4 * n + 64, -7, dtype=np.int64)
    del junk
    got = inclusive_scan(cupy.asarray(values)).get()
    assert np.array_equal(got, expected)
    # in place (the leaf packing's offsets): the same numbers over the input
    x = cupy.asarray(values)
    assert inclusive_scan_in_place(x) is x and np.array_equal(x.get(), expected)
