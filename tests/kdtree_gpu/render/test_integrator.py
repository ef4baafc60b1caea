"""The integrator (kdtree_gpu.render.integrator): the estimator against closed forms, the API.

CPU tests use the brute-force tracer by default (``render_helpers.render_cpu``),
so they check the estimator independently of the kd-tree.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kdtree_gpu import scenes
from kdtree_gpu.render import Renderer, render
from kdtree_gpu.render.integrator import DEPTH_HARD_LIMIT
from kdtree_gpu.scenes import furnace_scene


# --- the estimator ------------------------------------------------------------------
@pytest.mark.parametrize("albedo", [0.5, 0.8])
def test_furnace_matches_le_over_one_minus_albedo(albedo, render_helpers):
    # closed enclosure, Le and albedo everywhere: L = Le / (1 - a) in every
    # direction, reached only if emission, light sampling, MIS and Russian
    # roulette are all unbiased
    result = render_helpers.render_cpu(furnace_scene(albedo), size=16, spp=64, max_depth=None)
    expected = 1.0 / (1.0 - albedo)
    image = result.image
    assert np.all(np.isfinite(image))
    assert abs(image.mean() / expected - 1.0) < 0.01
    # every pixel is an estimate of the same value
    assert abs(np.median(image) / expected - 1.0) < 0.05
    # Russian roulette ended every path: the loop stopped before the hard limit
    assert result.stats["max_depth_reached"] < DEPTH_HARD_LIMIT
    assert result.stats["paths_per_depth"][-1] < result.stats["paths_per_depth"][0]


def test_furnace_with_roulette_from_the_first_bounce(render_helpers):
    result = render_helpers.render_cpu(furnace_scene(0.7), size=16, spp=64, max_depth=None,
                                       rr_start_depth=0)
    assert abs(result.image.mean() / (1.0 / 0.3) - 1.0) < 0.015


@pytest.mark.parametrize("max_depth", [0, 1, 3])
def test_furnace_truncated_at_max_depth(max_depth, render_helpers):
    # emission collected at depths 0..max_depth: Le (1 - a^(D+1)) / (1 - a)
    albedo = 0.5
    result = render_helpers.render_cpu(furnace_scene(albedo), size=16, spp=32,
                                       max_depth=max_depth, rr_start_depth=100)
    expected = (1 - albedo ** (max_depth + 1)) / (1 - albedo)
    assert abs(result.image.mean() / expected - 1.0) < 0.01
    if max_depth == 0:
        np.testing.assert_allclose(result.image, 1.0)
    assert len(result.stats["paths_per_depth"]) == max_depth + 1


def test_direct_light_below_square_emitter_matches_form_factor(render_helpers):
    # radiance of a diffuse floor under a square emitter (max_depth 1: light
    # sampling and BSDF sampling of the emitter, MIS-combined) is
    # albedo * Le * F with F the point-to-rectangle form factor
    h = render_helpers
    scene = h.lit_floor_scene(light_half=0.5, light_height=1.0, albedo=0.5, light_radiance=1.0)
    result = h.render_cpu(scene, size=8, spp=512, max_depth=1)
    expected = 0.5 * 1.0 * 4 * h.rect_corner_form_factor(0.5, 0.5)
    assert abs(result.image.mean() / expected - 1.0) < 0.01


def test_emission_leaves_the_front_face_unless_two_sided(render_helpers):
    h = render_helpers
    down = h.lit_floor_scene()
    up = dataclasses.replace(down, faces=down.faces[:, ::-1].copy())  # light now faces up
    expected = 0.5 * 4 * h.rect_corner_form_factor(0.5, 0.5)
    image_up = h.render_cpu(up, size=4, spp=64, max_depth=1).image
    assert image_up.max() == 0
    both = dataclasses.replace(up, two_sided_emission=True)
    image_both = h.render_cpu(both, size=8, spp=256, max_depth=1).image
    assert abs(image_both.mean() / expected - 1) < 0.02


def test_closed_room_is_finite_and_nonnegative(render_helpers):
    result = render_helpers.render_cpu(render_helpers.box_room(), size=24, spp=8, max_depth=6)
    assert np.all(np.isfinite(result.image))
    assert result.image.min() >= 0
    assert result.image.mean() > 0
    # looking down +z with +y up, +x is on the image's left: the green wall
    # (x = 1) shows on the left, the red one (x = 0) on the right
    left = result.image[:, :3].mean(axis=(0, 1))
    right = result.image[:, -3:].mean(axis=(0, 1))
    assert left[1] > left[0] and right[0] > right[1]


def test_scene_without_lights_renders_background_only(render_helpers):
    V, F = scenes.icosphere(0, inward=True).arrays()
    scene = scenes.Scene(V, F, np.zeros(len(F), np.int32), [[0.5] * 3], [[0] * 3],
                         scenes.Camera(position=(0, 0, 4), look_at=(0, 0, 0)),
                         background=[0.25, 0.5, 1.0])
    image = render_helpers.render_cpu(scene, size=8, spp=8, max_depth=3).image
    assert np.all(np.isfinite(image))
    # corners see the background directly
    np.testing.assert_allclose(image[0, 0], [0.25, 0.5, 1.0], rtol=1e-6)
    # the sphere reflects at most albedo times the background
    assert image[4, 4, 2] < 0.5 * 1.0 + 1e-6


def test_bare_mesh_is_lit_and_framed(render_helpers):
    V, F = scenes.icosphere(1, inward=True).arrays()
    result = render_helpers.render_cpu((V, F), size=16, spp=4, max_depth=2)
    center = result.image[6:10, 6:10].mean()
    corner = result.image[:2, :2].mean()
    assert center > corner  # the lit sphere in the middle, dim background at the corners
    assert np.all(np.isfinite(result.image))


# --- random numbers, passes, compaction ------------------------------------------------
def test_same_seed_same_image_other_seed_other_image(render_helpers):
    h = render_helpers
    scene = h.box_room()
    a = h.render_cpu(scene, size=12, spp=4, max_depth=4, seed=7).image
    b = h.render_cpu(scene, size=12, spp=4, max_depth=4, seed=7).image
    c = h.render_cpu(scene, size=12, spp=4, max_depth=4, seed=8).image
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_compaction_and_batching_do_not_change_the_image(render_helpers):
    # the random numbers depend on (seed, sample, pixel, depth, dimension) only
    h = render_helpers
    scene = h.box_room()
    size, spp = 12, 4
    reference = h.render_cpu(scene, size=size, spp=spp, max_depth=5, compaction=True,
                             paths_per_pass=size * size)
    masked = h.render_cpu(scene, size=size, spp=spp, max_depth=5, compaction=False,
                          paths_per_pass=size * size)
    batched = h.render_cpu(scene, size=size, spp=spp, max_depth=5, compaction=True,
                           paths_per_pass=size * size * spp)
    np.testing.assert_allclose(masked.image, reference.image, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(batched.image, reference.image, rtol=1e-5, atol=1e-6)
    assert batched.stats["passes"] == 1 and masked.stats["passes"] == spp
    # without compaction the queue keeps its length while paths die
    assert all(q == size * size * spp for q in masked.stats["queue_per_depth"])
    assert masked.stats["paths_per_depth"] == reference.stats["paths_per_depth"]


def test_stats_report_stages_and_counts(render_helpers):
    result = render_helpers.render_cpu(render_helpers.box_room(), size=8, spp=2, max_depth=3)
    stats = result.stats
    for name in ("render: generate camera rays", "render: intersect closest",
                 "render: handle escaped rays", "render: add emission", "render: sample lights",
                 "render: trace shadow rays", "render: sample bsdf", "render: compact paths",
                 "render: accumulate film"):
        assert stats["stages"][name]["launches"] >= 1, name
    assert stats["paths_per_depth"][0] == 8 * 8 * 2
    assert stats["rays"] == sum(stats["paths_per_depth"])
    assert stats["samples_per_second"] > 0
    assert abs(sum(s["share"] for s in stats["stages"].values()) - 1.0) < 1e-9
    assert stats["device"] == "cpu" and stats["scene"] == "box room"


def test_renderer_reuses_its_tree_and_profiles_on_request(render_helpers):
    renderer = Renderer(render_helpers.box_room(), 8, 8, device="cpu", accel="brute")
    quiet = renderer.render(spp=2, max_depth=2, profile=False)
    loud = renderer.render(spp=2, max_depth=2, profile=True)
    assert quiet.stats["stages"] == {}
    assert "render: sample bsdf" in loud.stats["stages"]
    np.testing.assert_array_equal(quiet.image, loud.image)


def test_bad_arguments_raise_clear_errors():
    V, F = scenes.icosphere(0, inward=True).arrays()
    with pytest.raises(ValueError, match="spp"):
        render((V, F), 4, 4, spp=0, device="cpu", accel="brute")
    with pytest.raises(ValueError, match="max_depth"):
        render((V, F), 4, 4, spp=1, max_depth=-1, device="cpu", accel="brute")
    with pytest.raises(ValueError, match="accel"):
        render((V, F), 4, 4, spp=1, device="cpu", accel="bvh")
    with pytest.raises(ValueError, match="device"):
        render((V, F), 4, 4, spp=1, device="tpu", accel="brute")
    other = Renderer(scenes.cornell_box(), 4, 4, device="cpu")
    with pytest.raises(scenes.SceneError, match="triangles"):
        Renderer((V, F), 4, 4, device="cpu", tree=other.tree)


# --- the kd-tree path --------------------------------------------------------------------
def test_kdtree_render_matches_brute_force_on_cpu(render_helpers):
    scene = render_helpers.box_room()
    kd = render(scene, 12, 12, spp=4, max_depth=4, device="cpu", accel="kdtree")
    brute = render_helpers.render_cpu(scene, size=12, spp=4, max_depth=4)
    # same random numbers, hits equal up to the last bits of t: nearly the same image
    assert abs(kd.image.mean() / brute.image.mean() - 1) < 0.01


def test_cornell_box_with_mesh_renders_on_cpu():
    V, F = scenes.icosphere(2, inward=True).arrays()
    scene = scenes.cornell_box_with(V, F)
    result = render(scene, 16, 16, spp=4, max_depth=4, device="cpu")
    assert np.all(np.isfinite(result.image)) and result.image.mean() > 0


def test_cornell_box_renders_with_the_kdtree_on_cpu():
    kd = render(scenes.cornell_box(), 16, 16, spp=8, max_depth=4, device="cpu")
    brute = render(scenes.cornell_box(), 16, 16, spp=8, max_depth=4, device="cpu", accel="brute")
    assert np.all(np.isfinite(kd.image)) and kd.image.mean() > 0
    assert abs(kd.image.mean() / brute.image.mean() - 1) < 0.02


# --- GPU -----------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_furnace():
    for compaction in (True, False):
        result = render(furnace_scene(0.5), 64, 64, spp=64, max_depth=None, device="cuda",
                        compaction=compaction)
        assert np.all(np.isfinite(result.image))
        assert abs(result.image.mean() / 2.0 - 1) < 0.01
        assert result.stats["device"] == "cuda"


@pytest.mark.gpu
def test_gpu_and_cpu_agree_in_mean(render_helpers):
    # same tree, same random numbers: the two renders differ by rounding only
    cpu_renderer = Renderer(render_helpers.box_room(), 32, 32, device="cpu")
    gpu_renderer = Renderer(render_helpers.box_room(), 32, 32, device="cuda",
                            tree=cpu_renderer.tree)
    cpu = cpu_renderer.render(spp=64, max_depth=6)
    gpu = gpu_renderer.render(spp=64, max_depth=6)
    assert np.all(np.isfinite(gpu.image))
    assert abs(gpu.image.mean() / cpu.image.mean() - 1) < 0.01


@pytest.mark.gpu
def test_gpu_compaction_does_not_change_the_image(render_helpers):
    renderer = Renderer(render_helpers.box_room(), 32, 32, device="cuda")
    on = renderer.render(spp=8, max_depth=8, compaction=True)
    off = renderer.render(spp=8, max_depth=8, compaction=False)
    np.testing.assert_allclose(on.image, off.image, rtol=1e-4, atol=1e-5)
    assert off.stats["queue_per_depth"][-1] == 32 * 32 * 8
    assert on.stats["queue_per_depth"][-1] < 32 * 32 * 8
    assert on.stats["paths_per_depth"] == off.stats["paths_per_depth"]
