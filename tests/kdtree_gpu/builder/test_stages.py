"""The NumPy stage functions that the GPU drivers use directly (kdtree_gpu/builder/stages.py)."""

import numpy as np
import pytest

from kdtree_gpu import SAHConfig
from kdtree_gpu.builder.pipeline import root_level_xp, run_level
from kdtree_gpu.builder.stages import event_segments
from kdtree_gpu.mesh import prepare_mesh


def _scene(seed):
    rng = np.random.default_rng(seed)
    if seed % 2:  # integer coordinates: equal positions, planar triangles, empty segments
        V = (rng.integers(0, 8, (200, 1, 3)) + rng.integers(0, 2, (200, 3, 3))).reshape(-1, 3)
    else:
        V = (rng.random((300, 1, 3)) + 0.1 * rng.random((300, 3, 3))).reshape(-1, 3)
    V = V.astype(np.float32)
    return V, np.arange(len(V), dtype=np.int32).reshape(-1, 3)


@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_event_segments_derived_from_place_and_reference_equal_the_stored_ones(seed, clip):
    # the level loop keeps no segment per event: on every level of a build,
    # the segments derived as the kernel derives them are the pipeline's
    cfg = SAHConfig(clip=clip)
    V, F = _scene(seed)
    V_h, F_h, tri_lo, tri_hi, valid, bounds = prepare_mesh(V, F)
    lvl, tri_lo, tri_hi = root_level_xp(np, tri_lo, tri_hi, valid, bounds)
    max_depth = cfg.resolved_max_depth(lvl.refs.size)
    levels = 0
    while lvl is not None:
        derived = event_segments(np, lvl.events.event_ref, lvl.refs.ref_node,
                                 lvl.nodes.seg_event_offset, lvl.nodes.size)
        np.testing.assert_array_equal(derived, lvl.events.event_seg, err_msg=f"level {levels}")
        lvl = run_level(np, cfg, lvl, tri_lo, tri_hi, max_depth, (V_h, F_h))["next"]
        levels += 1
    assert levels > 3
