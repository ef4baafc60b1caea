"""Perfect splits in the level pipeline (kdtree_gpu.builder.clip) against the CPU reference.

The clipped boxes must be the same bits as ``cpu_reference.clip``'s, the
merged events the order of a full sort, and the trees node for node those of
``cpu_reference.build`` and the naive builder under ``SAHConfig(clip=True)``.
GPU tests (``-m gpu``) run the same code on CuPy.
"""

import numpy as np
import pytest

import cpu_reference
import kdtree_gpu as kd
from cpu_reference import naive
from cpu_reference.clip import clip_child_box
from kdtree_gpu import SAHConfig
from kdtree_gpu import encoding as enc
from kdtree_gpu.builder.clip import clip_child_boxes, merge_events, reference_boxes
from kdtree_gpu.builder.settings import GpuSettings
from kdtree_gpu.builder.soa import EventSoA
from kdtree_gpu.builder.stages import create_root_events
from kdtree_gpu.device import gpu_available
from kdtree_gpu.testing import meshes as scenes
from kdtree_gpu.testing.meshes import CLIP_CONFIGS, needles_through_clouds, tight_loop_capacity

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")

# --- clipped boxes ----------------------------------------------------------------
def clip_cases(rng, m):
    """Triangles and (previous, child) boxes that cut them: random, on a grid, flat, touching."""
    kind = rng.integers(0, 4, m)
    v = rng.random((m, 3, 3)).astype(np.float32)
    grid = rng.integers(0, 4, (m, 3, 3)).astype(np.float32)
    v[kind == 1] = grid[kind == 1]
    # kind 2: a triangle in an axis plane (flat on that axis)
    flat_axis = rng.integers(0, 3, m)
    rows = np.flatnonzero(kind == 2)
    v[rows, :, flat_axis[rows]] = v[rows, :1, flat_axis[rows]]
    # kind 3: huge and tiny scales
    v[kind == 3] *= np.float32(10.0) ** rng.integers(-20, 20, (int((kind == 3).sum()), 1, 1))
    prev_lo, prev_hi = v.min(axis=1), v.max(axis=1)
    # the child: the previous box cut by a plane at a vertex or between
    axis = rng.integers(0, 3, m)
    r = np.arange(m)
    t = rng.choice([0.0, 0.25, 0.5, 1.0], m).astype(np.float32)
    plane = prev_lo[r, axis] + t * (prev_hi[r, axis] - prev_lo[r, axis])
    at_vertex = rng.random(m) < 0.3
    plane[at_vertex] = v[r, rng.integers(0, 3, m), axis][at_vertex]
    plane = np.clip(plane, prev_lo[r, axis], prev_hi[r, axis])  # a plane in the box, as a split's
    child_lo, child_hi = prev_lo.copy(), prev_hi.copy()
    left = rng.random(m) < 0.5
    child_hi[r[left], axis[left]] = plane[left]
    child_lo[r[~left], axis[~left]] = plane[~left]
    # a node box larger than the previous box on some axes
    grow = rng.random((m, 3)) < 0.3
    child_lo = np.where(grow, child_lo - np.abs(child_lo) * 0.5 - 1, child_lo).astype(np.float32)
    return v, prev_lo, prev_hi, child_lo, child_hi


def reference_clip(v, prev_lo, prev_hi, child_lo, child_hi):
    lo = np.empty_like(prev_lo)
    hi = np.empty_like(prev_hi)
    for i in range(v.shape[0]):
        clip_child_box(v[i, 0], v[i, 1], v[i, 2], prev_lo[i], prev_hi[i], child_lo[i],
                       child_hi[i], lo[i], hi[i])
    return lo, hi


@pytest.mark.parametrize("seed", range(6))
def test_clipped_boxes_are_the_reference_bits(seed):
    v, prev_lo, prev_hi, child_lo, child_hi = clip_cases(np.random.default_rng(seed), 3000)
    lo, hi = clip_child_boxes(np, v[:, 0], v[:, 1], v[:, 2], prev_lo, prev_hi, child_lo, child_hi)
    ref_lo, ref_hi = reference_clip(v, prev_lo, prev_hi, child_lo, child_hi)
    np.testing.assert_array_equal(lo.view(np.uint32), ref_lo.view(np.uint32))
    np.testing.assert_array_equal(hi.view(np.uint32), ref_hi.view(np.uint32))


def test_clipping_cuts_boxes_and_never_makes_negative_zero():
    v, prev_lo, prev_hi, child_lo, child_hi = clip_cases(np.random.default_rng(11), 3000)
    lo, hi = clip_child_boxes(np, v[:, 0], v[:, 1], v[:, 2], prev_lo, prev_hi, child_lo, child_hi)
    assert np.all(lo <= hi)
    assert np.all(lo >= np.maximum(prev_lo, child_lo)) and np.all(hi <= np.minimum(prev_hi, child_hi))
    # the cases clip: some box shrank beyond the plain intersection of the boxes
    assert np.any((lo > np.maximum(prev_lo, child_lo)) | (hi < np.minimum(prev_hi, child_hi)))
    assert not np.any(np.signbit(lo) & (lo == 0)) and not np.any(np.signbit(hi) & (hi == 0))


# --- reference boxes and the merge ----------------------------------------------------
def test_reference_boxes_at_the_root_are_the_triangle_boxes():
    V, F = scenes.grid_soup(np.random.default_rng(4), 50)
    tri = V[F]
    lo, hi = tri.min(axis=1), tri.max(axis=1)
    ref_tri = np.arange(F.shape[0], dtype=np.int32)
    events = create_root_events(np, lo, hi, ref_tri)
    ref_lo, ref_hi = reference_boxes(np, events, F.shape[0], 1)  # one node: segment = axis
    np.testing.assert_array_equal(ref_lo, lo)
    np.testing.assert_array_equal(ref_hi, hi)


def random_sorted_events(rng, n, num_segments, refs_per_child, num_children):
    """Distinct events of random segments, sorted by (segment, position, kind, reference)."""
    seg = rng.integers(0, num_segments, n)
    child = seg % num_children
    ref = child * refs_per_child + rng.integers(0, refs_per_child, n)
    pos = rng.integers(0, 6, n).astype(np.float32)
    kind = rng.integers(0, 3, n).astype(enc.EVENT_KIND_DTYPE)
    order = np.lexsort((ref, kind, pos, seg))
    ev = np.stack([seg, pos, kind, ref])[:, order]
    keep = np.concatenate([[True], np.any(np.diff(ev, axis=1) != 0, axis=0)])
    seg, pos, kind, ref = (a[keep] for a in (seg[order], pos[order], kind[order], ref[order]))
    return EventSoA(event_pos=pos, event_kind=kind, event_ref=ref.astype(np.int32),
                    event_seg=seg.astype(np.int32))


@pytest.mark.parametrize("seed", range(8))
def test_merge_equals_a_full_sort(seed):
    rng = np.random.default_rng(seed)
    num_children, refs_per_child = 4, 9
    num_segments = 3 * num_children
    a = random_sorted_events(rng, 400, num_segments, refs_per_child, num_children)
    b = random_sorted_events(rng, int(rng.integers(0, 60)), num_segments, refs_per_child,
                             num_children)
    # the two lists share no event (a reference's event is either kept or new)
    key = lambda e: set(zip(e.event_seg, e.event_pos, e.event_kind, e.event_ref))  # noqa: E731
    shared = key(a) & key(b)
    keep = np.array([k not in shared for k in zip(b.event_seg, b.event_pos, b.event_kind,
                                                   b.event_ref)], dtype=bool)
    b = EventSoA(*(getattr(b, f)[keep] for f in ("event_pos", "event_kind", "event_ref",
                                                  "event_seg")))
    a_offset = np.searchsorted(a.event_seg, np.arange(num_segments + 1)).astype(np.int64)
    child_ref_offset = np.arange(num_children + 1, dtype=np.int64) * refs_per_child
    merged, offset = merge_events(np, a, a_offset, b, child_ref_offset, num_children)
    seg = np.concatenate([a.event_seg, b.event_seg])
    pos = np.concatenate([a.event_pos, b.event_pos])
    kind = np.concatenate([a.event_kind, b.event_kind])
    ref = np.concatenate([a.event_ref, b.event_ref])
    order = np.lexsort((ref, kind, pos, seg))
    np.testing.assert_array_equal(merged.event_seg, seg[order])
    np.testing.assert_array_equal(merged.event_pos, pos[order])
    np.testing.assert_array_equal(merged.event_kind, kind[order])
    np.testing.assert_array_equal(merged.event_ref, ref[order])
    np.testing.assert_array_equal(offset, np.searchsorted(seg[order], np.arange(num_segments + 1)))


# --- whole trees ----------------------------------------------------------------------
def clip_scene(seed):
    rng = np.random.default_rng(seed)
    kind = seed % 4
    if kind == 0:
        return needles_through_clouds(rng)
    if kind == 1:
        return scenes.grid_soup(rng, 200)
    if kind == 2:
        return scenes.quads(rng, 30, duplicate=bool(seed % 8 == 2))
    return scenes.soup(rng, 300, scale=0.2)


@pytest.mark.parametrize("seed", range(60))
def test_numpy_pipeline_clips_as_the_naive_builder(seed):
    V, F = scenes.random_scene(seed)
    cfg = CLIP_CONFIGS[seed % len(CLIP_CONFIGS)]
    scenes.assert_same_tree(naive.build(V, F, cfg), kd.build(V, F, cfg, device="cpu", kernels="xp"))


@pytest.mark.parametrize("axes", ["all", "longest"])
@pytest.mark.parametrize("seed", range(12))
def test_numpy_pipeline_clips_as_the_reference(seed, axes):
    V, F = clip_scene(seed)
    cfg = SAHConfig(clip=True, axes=axes)
    reference = cpu_reference.build(V, F, cfg)
    scenes.assert_same_tree(reference, kd.build(V, F, cfg, device="cpu", kernels="xp"))
    if seed % 4 == 0:
        # the needles straddle: clipping changes the tree
        assert cpu_reference.build(V, F, SAHConfig(axes=axes)).compare(reference) is not None


def test_numpy_pipeline_clips_a_real_mesh(mesh_path):
    V, F = kd.load_mesh(mesh_path("suzanne"))
    cfg = SAHConfig(clip=True)
    scenes.assert_same_tree(cpu_reference.build(V, F, cfg),
                            kd.build(V, F, cfg, device="cpu", kernels="xp"))


# --- GPU: the CUDA kernels and the same code on CuPy ----------------------------------------
@gpu
@needs_gpu
def test_gpu_clipped_boxes_are_the_reference_bits():
    import cupy

    from kdtree_gpu.kernels import get_function
    from kdtree_gpu.launch import launch

    v, prev_lo, prev_hi, child_lo, child_hi = clip_cases(np.random.default_rng(21), 20000)
    ref_lo, ref_hi = reference_clip(v, prev_lo, prev_hi, child_lo, child_hi)
    rows = [cupy.asarray(np.ascontiguousarray(a)) for a in
            (v[:, 0], v[:, 1], v[:, 2], prev_lo, prev_hi, child_lo, child_hi)]
    # the NumPy twin on CuPy arrays
    lo, hi = clip_child_boxes(cupy, *rows)
    np.testing.assert_array_equal(lo.get().view(np.uint32), ref_lo.view(np.uint32))
    np.testing.assert_array_equal(hi.get().view(np.uint32), ref_hi.view(np.uint32))
    # the CUDA device function of the builder
    out = cupy.empty((v.shape[0], 2, 3), dtype=np.float32)
    launch("clip child boxes", get_function("clip.cu", "kd_clip_child_boxes"), v.shape[0],
           (cupy.ascontiguousarray(cupy.stack(rows, axis=1), dtype=np.float32),
            np.int64(v.shape[0]), out))
    np.testing.assert_array_equal(out[:, 0].get().view(np.uint32), ref_lo.view(np.uint32))
    np.testing.assert_array_equal(out[:, 1].get().view(np.uint32), ref_hi.view(np.uint32))


@gpu
@needs_gpu
@pytest.mark.parametrize("kernels", ["fused", "stages", "xp"])
@pytest.mark.parametrize("seed", range(8))
def test_gpu_builders_clip_as_the_reference(seed, kernels):
    V, F = clip_scene(seed)
    cfg = SAHConfig(clip=True, axes="all" if seed % 2 else "longest")
    scenes.assert_same_tree(cpu_reference.build(V, F, cfg),
                            kd.build(V, F, cfg, device="cuda", kernels=kernels))


# The level-loop kernel's clipping, through each way out of the loop: buffers
# that every level outgrows (a relaunch per level, the new-event list
# included), a segment limit that sends levels with more new events to the
# per-stage path and back, one block and many (the grid-strided passes).
LOOP_CLIP_SETTINGS = {
    "tight": GpuSettings(loop_capacity=tight_loop_capacity),
    "segment-4": GpuSettings(clip_segment=4),
    "segment-0": GpuSettings(clip_segment=0),
    "one-block": GpuSettings(loop_blocks=1),
    "tight-segment": GpuSettings(loop_capacity=tight_loop_capacity, clip_segment=16,
                                 loop_blocks=3),
}


@gpu
@needs_gpu
@pytest.mark.parametrize("name", sorted(LOOP_CLIP_SETTINGS))
@pytest.mark.parametrize("seed", range(8))
def test_gpu_level_loop_clips_as_the_reference(seed, name):
    V, F = clip_scene(seed)
    cfg = SAHConfig(clip=True, axes="all" if seed % 2 else "longest")
    settings = LOOP_CLIP_SETTINGS[name]
    tree = kd.build(V, F, cfg, device="cuda", kernels="fused", settings=settings)
    scenes.assert_same_tree(cpu_reference.build(V, F, cfg), tree)
    info = tree.build_info
    if name == "segment-0" and seed % 4 == 0:
        # the needles straddle: the levels that clip them leave the loop
        assert info["stage_levels"] and info["loop_launches"] >= 1
    if name == "one-block" and seed % 4 != 0:
        assert not info["stage_levels"]  # every level ran in the loop


@gpu
@needs_gpu
@pytest.mark.parametrize("name", ["suzanne", "stanford_bunny", "conference"])
def test_gpu_level_loop_clips_real_meshes_in_the_loop(name, mesh_path):
    V, F = kd.load_mesh(mesh_path(name))
    cfg = SAHConfig(clip=True)
    tree = kd.build(V, F, cfg, device="cuda", kernels="fused")
    scenes.assert_same_tree(cpu_reference.build(V, F, cfg), tree)
    # no level of these meshes has a child segment over the default limit
    assert tree.build_info["stage_levels"] == []


@gpu
@needs_gpu
@pytest.mark.parametrize("seed", range(0, 120, 3))
def test_gpu_clip_equals_naive_builder(seed):
    V, F = scenes.random_scene(seed)
    cfg = CLIP_CONFIGS[seed % len(CLIP_CONFIGS)]
    scenes.assert_same_tree(naive.build(V, F, cfg),
                            kd.build(V, F, cfg, device="cuda", kernels="fused"))


@gpu
@needs_gpu
@pytest.mark.parametrize("name", scenes.REAL_MESHES)
@pytest.mark.parametrize("axes", ["all", "longest"])
def test_gpu_clips_real_meshes_as_the_reference(name, axes, mesh_path):
    V, F = kd.load_mesh(mesh_path(name))
    cfg = SAHConfig(clip=True, axes=axes)
    scenes.assert_same_tree(cpu_reference.build(V, F, cfg),
                            kd.build(V, F, cfg, device="cuda", kernels="fused"))
