"""The CUDA stages against their NumPy twins, stage by stage, and the CUDA cost
model against ``config.split_cost``, bit for bit (GPU tests, ``-m gpu``).

For every level of a build, the NumPy pipeline's stage functions run on CuPy
arrays (:func:`kdtree_gpu.builder.pipeline.run_level`) and each CUDA stage of
:mod:`kdtree_gpu.builder.gpu.level_stages` runs on the same inputs, in its
block-wide (small) and grid-wide form; their outputs must be equal, so a
difference names the stage that made it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kdtree_gpu import SAHConfig
from kdtree_gpu import encoding as enc
from kdtree_gpu.builder.gpu.level_costs import (compute_split_costs_gpu, event_costs,
                                                select_best_splits_gpu)
from kdtree_gpu.builder.gpu.level_stages import (child_arrays, classify_triangles_gpu,
                                                 clip_straddling_gpu, emit_level_gpu,
                                                 reference_boxes_gpu, route_to_children_gpu,
                                                 split_refs_and_events_gpu)
from kdtree_gpu.builder.gpu.output import TreeOutput
from kdtree_gpu.builder.gpu.root import create_root_events_cuda
from kdtree_gpu.builder.pipeline import root_level_xp, run_level
from kdtree_gpu.builder.soa import EventSoA, RefSoA
from kdtree_gpu.builder.stages import create_root_events
from kdtree_gpu.config import split_cost
from kdtree_gpu.device import gpu_available
from kdtree_gpu.mesh import load_mesh, prepare_mesh
from kdtree_gpu.primitives import segmented_argmin
from kdtree_gpu.testing.meshes import CONFIGS

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")]



def scene(seed):
    rng = np.random.default_rng(seed)
    if seed % 2:
        # integer coordinates: equal event positions, planar triangles
        V = (rng.integers(0, 8, (300, 1, 3)) + rng.integers(0, 2, (300, 3, 3))).reshape(-1, 3)
    else:
        V = (rng.random((400, 1, 3)) + 0.1 * rng.random((400, 3, 3))).reshape(-1, 3)
    V = V.astype(np.float32)
    return V, np.arange(len(V), dtype=np.int32).reshape(-1, 3)


def equal(a, b, what):
    a, b = np.asarray(a.get() if hasattr(a, "get") else a), np.asarray(b.get() if hasattr(b, "get") else b)
    assert a.shape == b.shape, f"{what}: shapes {a.shape} vs {b.shape}"
    bad = np.flatnonzero(~((a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f"
                           else a == b).reshape(-1))
    assert bad.size == 0, f"{what}: {bad.size} entries differ, first {bad[:5].tolist()}"


def open_close_scan(kind):
    """The exclusive scan of packed (opens, closes) counts, E + 1 items (NumPy)."""
    opens = np.concatenate([[0], np.cumsum(kind != enc.EVENT_END)])
    closes = np.concatenate([[0], np.cumsum(kind != enc.EVENT_START)])
    return opens.astype(np.int64) + (closes.astype(np.int64) << 32)


def check_level(cp, cfg, lvl, tri_lo, tri_hi, max_depth, want, small, mesh):
    where = f"level {lvl.level} ({'block' if small else 'grid'} kernels)"
    if not cfg.clip and lvl.level % 2:
        # odd levels as the level loop hands them over: without stored segments (the
        # kernels derive them); even ones as the stages' large levels store them
        events = lvl.events
        lvl = dataclasses.replace(lvl, events=EventSoA(*events.args()[:3], None))
    level_active = lvl.level < max_depth
    costs = compute_split_costs_gpu(cp, cfg, lvl.events, lvl.refs, lvl.nodes, level_active,
                                    small, store_costs=True)
    equal(costs.open_close.get(), open_close_scan(lvl.events.event_kind.get()),
          f"compute_split_costs, {where}: open/close scan")
    equal(event_costs(costs.event_cost), want["event_cost"],
          f"compute_split_costs, {where}: event_cost")
    finite = np.isfinite(want["event_cost"].get())
    equal(costs.event_side.get()[finite], want["event_side"].get()[finite],
          f"compute_split_costs, {where}: event_side")
    # each segment's pair, final with the pass: its minimum cost's bits and its
    # lowest event index at that minimum (R8), or (INF_BITS, NO_INDEX) without a
    # candidate, as the twin's costs give them (the builder stores no cost)
    twin_cost = want["event_cost"].get()
    at = segmented_argmin(twin_cost, lvl.nodes.seg_event_offset.get())
    low = np.where(at >= 0, twin_cost[np.maximum(at, 0)], np.inf)
    has = np.isfinite(low)
    pairs = costs.seg_argmin.get()
    equal(pairs[:, 0], np.where(has, low.view(np.uint64), np.uint64(enc.INF_BITS)),
          f"select_best_splits, {where}: segment minima")
    equal(pairs[:, 1], np.where(has, at.astype(np.uint64), np.uint64(enc.NO_INDEX)),
          f"select_best_splits, {where}: segment arg-mins")
    best, node_split, split_leaf_ex = select_best_splits_gpu(
        cp, cfg, lvl.events, lvl.nodes, costs, level_active, small)
    equal(node_split, want["node_split"], f"decide_leaves, {where}: node_split")
    s = want["node_split"].get()
    for name in ("node_axis", "node_pos", "node_side", "node_cost"):
        equal(getattr(best, name).get()[s], getattr(want["best"], name).get()[s],
              f"select_best_splits, {where}: {name}")
    equal(split_leaf_ex.get() & 0xFFFFFFFF, want["split_rank"], f"decide_leaves, {where}: rank")
    box_lo, box_hi = tri_lo, tri_hi
    if cfg.clip:
        box_lo, box_hi = reference_boxes_gpu(cp, lvl.events, lvl.refs.size, lvl.nodes.size)
        equal(box_lo, want["ref_lo"], f"reference_boxes, {where}: lo")
        equal(box_hi, want["ref_hi"], f"reference_boxes, {where}: hi")
    ref_class = classify_triangles_gpu(cp, lvl.refs, best, node_split, box_lo, box_hi, cfg.clip)
    equal(ref_class, want["ref_class"], f"classify_triangles, {where}")
    ref_lr_ex, event_scan, child_ref_offset, child_event_offset, totals = route_to_children_gpu(
        cp, lvl.nodes, node_split, split_leaf_ex, ref_class, lvl.events, cfg.clip, small)
    counts = [want[k] for k in ("num_split", "num_child_refs", "num_child_events",
                                "num_leaf_refs")]
    equal(totals, counts, f"route_to_children, {where}: totals")
    num_split = counts[0]
    equal(child_ref_offset[:2 * num_split + 1],
          want["ref_route"].child_offset[:2 * num_split + 1], f"route_refs, {where}")
    equal(child_event_offset[:6 * num_split + 1],
          want["event_route"].child_offset[:6 * num_split + 1], f"route_events, {where}")
    n = lvl.nodes.size
    out = TreeOutput(cp, lvl.level_base + n, lvl.leaf_ref_base + counts[3] + 1)
    child_nodes = emit_level_gpu(cp, lvl.nodes, node_split, best, split_leaf_ex, lvl.level_base,
                                 lvl.leaf_ref_base, out)
    assert child_nodes.size == 2 * n  # (rows for two children per node: the split ones' first)
    child_nodes = child_nodes.prefix(2 * num_split)
    for name, got, expected in zip(("node_axis", "node_split", "node_child", "node_count"),
                                   out.nodes.args(), want["level_arrays"][:4]):
        equal(got[lvl.level_base:lvl.level_base + n], expected, f"emit_level, {where}: {name}")
    child_refs, child_events = split_refs_and_events_gpu(
        cp, lvl.refs, lvl.events, lvl.nodes, ref_class, ref_lr_ex, event_scan, split_leaf_ex,
        child_ref_offset, child_event_offset, lvl.leaf_ref_base, out.leaf,
        child_arrays(cp, counts[1], counts[2], segments=True), cfg.clip)
    scatter = (cp, lvl.refs, lvl.events, lvl.nodes, ref_class, ref_lr_ex, event_scan,
               split_leaf_ex, child_ref_offset, child_event_offset)
    check_guessed_rooms(cp, scatter, lvl.leaf_ref_base, out.leaf, cfg.clip,
                        (child_refs, child_events), where)
    seg_event_offset = child_event_offset[:6 * num_split + 1]
    if cfg.clip and num_split:
        child_events, seg_event_offset = clip_straddling_gpu(
            cp, mesh, lvl.refs, box_lo, box_hi, ref_class, ref_lr_ex, lvl.nodes, split_leaf_ex,
            child_ref_offset, child_nodes, child_events, seg_event_offset, num_split)
    equal(out.leaf[lvl.leaf_ref_base:lvl.leaf_ref_base + counts[3]], want["level_arrays"][4],
          f"split_refs, {where}: leaf_tris")
    nxt = want["next"]
    if nxt is None:
        return
    equal(child_nodes.node_lo, nxt.nodes.node_lo, f"make_child_nodes, {where}: node_lo")
    equal(child_nodes.node_hi, nxt.nodes.node_hi, f"make_child_nodes, {where}: node_hi")
    for got, expected, name in zip(child_refs.args(), nxt.refs.args(), ("ref_tri", "ref_node")):
        equal(got, expected, f"split_refs, {where}: {name}")
    for got, expected, name in zip(child_events.args(), nxt.events.args(),
                                   ("event_pos", "event_kind", "event_ref", "event_seg")):
        equal(got, expected, f"split_events{' and clip_straddling' * cfg.clip}, {where}: {name}")
    equal(seg_event_offset, nxt.nodes.seg_event_offset, f"split_events, {where}: offsets")


def check_guessed_rooms(cp, scatter, leaf_ref_base, leaf, clip, exact, where):
    # The scatter into arrays of a guessed size (build_level_stages launches it
    # before it reads the counts): rows within the room are the exact ones, and
    # nothing past it is written (here: the rest of a larger block, filled first).
    refs, events = exact
    for room in ((refs.size // 2, events.size // 3), (refs.size + 5, events.size + 9)):
        spare = 16
        guessed = (RefSoA.allocate(cp, room[0] + spare), EventSoA.allocate(cp, room[1] + spare))
        for soa in guessed:
            for a in soa.args():
                a.fill(np.nan if a.dtype.kind == "f" else -3)
        split_refs_and_events_gpu(*scatter, leaf_ref_base, leaf,
                                  tuple(g.prefix(r) for g, r in zip(guessed, room)), clip)
        for got_soa, want_soa, r, what in zip(guessed, exact, room, ("split_refs", "split_events")):
            for got, want in zip(got_soa.args(), want_soa.args()):
                k = min(r, want.shape[0])
                equal(got[:k], want[:k], f"{what} into a room of {r} rows, {where}")
                rest = got[k:].get()
                assert (np.isnan(rest) if rest.dtype.kind == "f" else rest == -3).all(), (
                    f"{what} into a room of {r} rows wrote past it, {where}")


def run_both(V, F, cfg):
    import cupy

    V_h, F_h, tri_lo_h, tri_hi_h, valid, bounds = prepare_mesh(V, F)
    mesh = (cupy.asarray(V_h), cupy.asarray(F_h))
    lvl, tri_lo, tri_hi = root_level_xp(cupy, tri_lo_h, tri_hi_h, valid, bounds)
    max_depth = cfg.resolved_max_depth(lvl.refs.size)
    levels = 0
    while lvl is not None:
        want = run_level(cupy, cfg, lvl, tri_lo, tri_hi, max_depth, mesh)
        for small in (True, False):
            check_level(cupy, cfg, lvl, tri_lo, tri_hi, max_depth, want, small, mesh)
        lvl = want["next"]
        levels += 1
    assert levels > 1


@pytest.mark.parametrize("seed", range(12))
def test_cuda_stages_equal_their_numpy_twins(seed):
    V, F = scene(seed)
    run_both(V, F, CONFIGS[seed % len(CONFIGS)])


@pytest.mark.parametrize("seed", range(8))
def test_cuda_clipping_stages_equal_their_numpy_twins(seed):
    V, F = scene(seed)
    run_both(V, F, dataclasses.replace(CONFIGS[seed % len(CONFIGS)], clip=True))


@pytest.mark.parametrize("name", ["suzanne", "spot"])
def test_cuda_stages_equal_their_numpy_twins_on_real_meshes(name, mesh_dir):
    path = mesh_dir / f"{name}.ply"
    if not path.is_file():
        pytest.skip(f"{name} not in the mesh folder")
    V, F = load_mesh(path)
    run_both(V, F, SAHConfig())


def test_cuda_cost_model_is_config_split_cost_bit_for_bit():
    import cupy

    from kdtree_gpu import kernels

    source = kernels.cuda_preamble() + r'''
#include "sah.cuh"
extern "C" __global__ void kd_test_split_cost(const double* k, const double* areas,
                                              const long long* counts, long long n, double* out)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = kd_split_cost(k[3 * i], k[3 * i + 1], k[3 * i + 2], areas[3 * i], areas[3 * i + 1],
                           areas[3 * i + 2], counts[2 * i], counts[2 * i + 1]);
}
'''
    module = cupy.RawModule(code=source, options=kernels.compile_options())
    kernel = module.get_function("kd_test_split_cost")
    rng = np.random.default_rng(7)
    n = 200_000
    k = np.stack([rng.uniform(0.1, 30, n), rng.uniform(0.1, 30, n), rng.uniform(0.05, 1, n)], 1)
    # half areas of sub-boxes: magnitudes across many orders, near-ties included
    areas = np.exp(rng.uniform(-40, 40, (n, 3)))
    areas[::7, 1] = areas[::7, 0]
    counts = rng.integers(0, 5000, (n, 2))
    counts[::5, 0] = 0
    counts[::11, 1] = 0
    out = cupy.empty(n, cupy.float64)
    kernel(((n + 255) // 256,), (256,), (cupy.asarray(k), cupy.asarray(areas),
                                         cupy.asarray(counts), np.int64(n), out))
    got = out.get()
    want = np.array([split_cost(*k[i], *areas[i], int(counts[i, 0]), int(counts[i, 1]))
                     for i in range(n)])
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))


@pytest.mark.parametrize("num_tris", [1, 2, 37, 700, 1366])
def test_cuda_root_events_equal_their_numpy_twin(num_tris):
    import cupy as cp

    rng = np.random.default_rng(num_tris)
    # integer coordinates: equal positions, planar and degenerate triangles
    V = (rng.integers(0, 6, (num_tris, 1, 3)) + rng.integers(0, 2, (num_tris, 3, 3)))
    V = V.reshape(-1, 3).astype(np.float32)
    F = np.arange(len(V), dtype=np.int32).reshape(-1, 3)
    _, _, tri_lo, tri_hi, valid, _ = prepare_mesh(V, F)
    ref_tri = np.flatnonzero(valid).astype(np.int32)
    want = create_root_events(np, tri_lo, tri_hi, ref_tri)
    planar = [int((tri_lo[ref_tri, k] == tri_hi[ref_tri, k]).sum()) for k in range(3)]
    got = create_root_events_cuda(cp, cp.asarray(tri_lo), cp.asarray(tri_hi),
                                  cp.asarray(ref_tri), planar)
    for name, a in want.arrays().items():
        equal(getattr(got, name), a, f"create_root_events ({num_tris} triangles): {name}")


@pytest.mark.parametrize("guess", ["short", "default", "wide"])
@pytest.mark.parametrize("seed", range(6))
def test_scatter_launched_before_the_count_read_makes_the_reference_tree(seed, guess,
                                                                          monkeypatch):
    # Each level run by stages after the first launches its scatter into arrays
    # of a guessed size before it reads its counts; a guess that falls short is
    # launched again at the counts. Short guesses (half the items: levels
    # relaunch), the builder's, and the bound (twice the items: none does).
    import cpu_reference
    import kdtree_gpu as kd
    from kdtree_gpu.builder import GpuSettings
    from kdtree_gpu.builder.gpu import level_stages
    from kdtree_gpu.testing.meshes import CLIP_CONFIGS, assert_same_tree

    builder_guess = level_stages.child_room
    scale = {"short": 0.5, "wide": 2}.get(guess)
    if scale is not None:
        def child_room(growth, level, num_refs, num_events):
            if builder_guess(growth, level, num_refs, num_events) is None:
                return None
            return int(scale * num_refs), int(scale * num_events)
        monkeypatch.setattr(level_stages, "child_room", child_room)
    cfg = (CONFIGS + CLIP_CONFIGS)[seed]
    V, F = scene(seed)
    tree = kd.build(V, F, cfg, device="cuda", kernels="stages",
                    settings=GpuSettings(small_refs=seed % 2 * 16))
    assert_same_tree(cpu_reference.build(V, F, cfg), tree)
    info = tree.build_info
    assert len(info["stage_levels"]) > 2
    if guess == "short":
        assert info["scatter_relaunches"] >= 1
    elif guess == "wide":
        assert info["scatter_relaunches"] == 0
