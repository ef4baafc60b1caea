"""Tests of the wavefront path tracer (kdtree_gpu.render and its scene/image helpers).

CPU tests use small images and the brute-force tracer (every ray against
every triangle), so they check the estimator independently of the kd-tree.
GPU tests (marked ``gpu``) compare the CUDA kernels with the NumPy stages.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import kdtree_gpu.render as R  # the package attribute "render" is the function
from kdtree_gpu.render_image import encode_png, save_png, tonemap
from kdtree_gpu.render_scene import (Camera, RenderScene, SceneError, as_render_scene,
                                     build_alias_table, furnace_scene, icosphere, light_tables,
                                     mesh_scene)


# --- scenes ------------------------------------------------------------------------
def lit_floor_scene(light_half=0.5, light_height=1.0, albedo=0.5, light_radiance=1.0):
    """A large floor under a square emitter; the camera looks straight down at the center."""
    s, h, big = light_half, light_height, 50.0
    V = np.array([[-big, 0, -big], [big, 0, -big], [big, 0, big], [-big, 0, big],
                  [-s, h, -s], [s, h, -s], [s, h, s], [-s, h, s]], np.float32)
    F = np.array([[0, 2, 1], [0, 3, 2], [4, 5, 6], [4, 6, 7]], np.int32)
    camera = Camera(position=(0.0, 0.5 * h, 0.0), look_at=(0.0, 0.0, 0.0), up=(0.0, 0.0, -1.0),
                    vfov_degrees=2.0)
    return RenderScene(V, F, [0, 0, 1, 1], [[albedo] * 3, [0, 0, 0]],
                       [[0, 0, 0], [light_radiance] * 3], camera, name="lit floor")


def box_room(width=1.0, light_radiance=8.0):
    """A closed white room with a red and a green wall, a ceiling light, and a cube inside."""
    def quad(a, b, c, d):
        return [a, b, c, d]

    w = width
    quads = [
        (quad([0, 0, 0], [w, 0, 0], [w, 0, w], [0, 0, w]), 0),  # floor
        (quad([0, w, 0], [0, w, w], [w, w, w], [w, w, 0]), 0),  # ceiling
        (quad([0, 0, w], [w, 0, w], [w, w, w], [0, w, w]), 0),  # back
        (quad([0, 0, 0], [0, 0, w], [0, w, w], [0, w, 0]), 1),  # left, red
        (quad([w, 0, 0], [w, w, 0], [w, w, w], [w, 0, w]), 2),  # right, green
        (quad([0, 0, 0], [0, w, 0], [w, w, 0], [w, 0, 0]), 0),  # front (closed room)
        (quad([0.4 * w, 0.99 * w, 0.4 * w], [0.6 * w, 0.99 * w, 0.4 * w],
              [0.6 * w, 0.99 * w, 0.6 * w], [0.4 * w, 0.99 * w, 0.6 * w]), 3),  # light
    ]
    lo, hi = 0.3 * w, 0.55 * w
    cube = [([lo, 0, lo], [hi, 0, lo], [hi, 0, hi], [lo, 0, hi]),
            ([lo, 0.25 * w, lo], [lo, 0.25 * w, hi], [hi, 0.25 * w, hi], [hi, 0.25 * w, lo])]
    V, F, M = [], [], []
    for corners, mat in quads + [(c, 0) for c in cube]:
        base = len(V)
        V += corners
        F += [[base, base + 1, base + 2], [base, base + 2, base + 3]]
        M += [mat, mat]
    camera = Camera(position=(0.5 * w, 0.5 * w, 0.05 * w), look_at=(0.5 * w, 0.45 * w, w),
                    vfov_degrees=70)
    albedo = [[0.75, 0.75, 0.75], [0.65, 0.06, 0.05], [0.12, 0.45, 0.15], [0.78, 0.78, 0.78]]
    emission = [[0, 0, 0], [0, 0, 0], [0, 0, 0], [light_radiance] * 3]
    return RenderScene(np.array(V, np.float32), np.array(F, np.int32), np.array(M, np.int32),
                       albedo, emission, camera, name="box room")


def rect_corner_form_factor(x, y):
    """Form factor from a point to a parallel rectangle with one corner straight above it.

    ``x``, ``y``: rectangle sides divided by the height.
    """
    a = x / math.sqrt(1 + x * x) * math.atan(y / math.sqrt(1 + x * x))
    b = y / math.sqrt(1 + y * y) * math.atan(x / math.sqrt(1 + y * y))
    return (a + b) / (2 * math.pi)


def render_cpu(scene, size=16, spp=16, **kwargs):
    kwargs.setdefault("accel", "brute")
    return R.render(scene, size, size, spp=spp, device="cpu", **kwargs)


# --- the estimator ------------------------------------------------------------------
@pytest.mark.parametrize("albedo", [0.5, 0.8])
def test_furnace_matches_le_over_one_minus_albedo(albedo):
    # closed enclosure, Le and albedo everywhere: L = Le / (1 - a) in every
    # direction, reached only if emission, light sampling, MIS and Russian
    # roulette are all unbiased
    result = render_cpu(furnace_scene(albedo), size=16, spp=64, max_depth=None)
    expected = 1.0 / (1.0 - albedo)
    image = result.image
    assert np.all(np.isfinite(image))
    assert abs(image.mean() / expected - 1.0) < 0.01
    # every pixel is an estimate of the same value
    assert abs(np.median(image) / expected - 1.0) < 0.05
    # Russian roulette ended every path: the loop stopped before the hard limit
    assert result.stats["max_depth_reached"] < R.DEPTH_HARD_LIMIT
    assert result.stats["paths_per_depth"][-1] < result.stats["paths_per_depth"][0]


def test_furnace_with_roulette_from_the_first_bounce():
    result = render_cpu(furnace_scene(0.7), size=16, spp=64, max_depth=None, rr_start_depth=0)
    assert abs(result.image.mean() / (1.0 / 0.3) - 1.0) < 0.015


@pytest.mark.parametrize("max_depth", [0, 1, 3])
def test_furnace_truncated_at_max_depth(max_depth):
    # emission collected at depths 0..max_depth: Le (1 - a^(D+1)) / (1 - a)
    albedo = 0.5
    result = render_cpu(furnace_scene(albedo), size=16, spp=32, max_depth=max_depth,
                        rr_start_depth=100)
    expected = (1 - albedo ** (max_depth + 1)) / (1 - albedo)
    assert abs(result.image.mean() / expected - 1.0) < 0.01
    if max_depth == 0:
        np.testing.assert_allclose(result.image, 1.0)
    assert len(result.stats["paths_per_depth"]) == max_depth + 1


def test_direct_light_below_square_emitter_matches_form_factor():
    # radiance of a diffuse floor under a square emitter (max_depth 1: light
    # sampling and BSDF sampling of the emitter, MIS-combined) is
    # albedo * Le * F with F the point-to-rectangle form factor
    scene = lit_floor_scene(light_half=0.5, light_height=1.0, albedo=0.5, light_radiance=1.0)
    result = render_cpu(scene, size=8, spp=512, max_depth=1)
    expected = 0.5 * 1.0 * 4 * rect_corner_form_factor(0.5, 0.5)
    assert abs(result.image.mean() / expected - 1.0) < 0.01


def test_closed_room_is_finite_and_nonnegative():
    result = render_cpu(box_room(), size=24, spp=8, max_depth=6)
    assert np.all(np.isfinite(result.image))
    assert result.image.min() >= 0
    assert result.image.mean() > 0
    # looking down +z with +y up, +x is on the image's left: the green wall
    # (x = 1) shows on the left, the red one (x = 0) on the right
    left = result.image[:, :3].mean(axis=(0, 1))
    right = result.image[:, -3:].mean(axis=(0, 1))
    assert left[1] > left[0] and right[0] > right[1]


def test_same_seed_same_image_other_seed_other_image():
    scene = box_room()
    a = render_cpu(scene, size=12, spp=4, max_depth=4, seed=7).image
    b = render_cpu(scene, size=12, spp=4, max_depth=4, seed=7).image
    c = render_cpu(scene, size=12, spp=4, max_depth=4, seed=8).image
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_compaction_and_batching_do_not_change_the_image():
    # the random numbers depend on (seed, sample, pixel, depth, dimension) only
    scene = box_room()
    size, spp = 12, 4
    reference = render_cpu(scene, size=size, spp=spp, max_depth=5, compaction=True,
                           paths_per_pass=size * size).image
    masked = render_cpu(scene, size=size, spp=spp, max_depth=5, compaction=False,
                        paths_per_pass=size * size)
    batched = render_cpu(scene, size=size, spp=spp, max_depth=5, compaction=True,
                         paths_per_pass=size * size * spp)
    np.testing.assert_allclose(masked.image, reference, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(batched.image, reference, rtol=1e-5, atol=1e-6)
    assert batched.stats["passes"] == 1 and masked.stats["passes"] == spp
    # without compaction the queue keeps its length while paths die
    assert all(q == size * size * spp for q in masked.stats["queue_per_depth"])
    assert masked.stats["paths_per_depth"] == reference_stats(scene, size, spp)["paths_per_depth"]


def reference_stats(scene, size, spp):
    return render_cpu(scene, size=size, spp=spp, max_depth=5, compaction=True,
                      paths_per_pass=size * size).stats


def test_stats_report_stages_and_counts():
    result = render_cpu(box_room(), size=8, spp=2, max_depth=3)
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


# --- scenes and inputs ---------------------------------------------------------------
def test_mesh_scene_adds_a_light_and_frames_the_mesh():
    V, F = icosphere(1)
    scene = mesh_scene(V, F)
    assert scene.num_triangles == len(F) + 2
    light_tri, _, _, pmf = light_tables(scene)
    np.testing.assert_array_equal(light_tri, [len(F), len(F) + 1])
    assert abs(pmf.sum() - 1) < 1e-6
    result = render_cpu((V, F), size=16, spp=4, max_depth=2)
    center = result.image[6:10, 6:10].mean()
    corner = result.image[:2, :2].mean()
    assert center > corner  # the lit sphere in the middle, dim background at the corners
    assert np.all(np.isfinite(result.image))


def test_scene_object_with_named_fields_is_accepted():
    room = box_room()
    obj = {"vertices": room.vertices, "faces": room.faces, "material_ids": room.tri_material,
           "albedo": room.material_albedo, "emission": room.material_emission,
           "camera": {"position": room.camera.position, "look_at": room.camera.look_at,
                      "fov": room.camera.vfov_degrees}}
    scene = as_render_scene(obj)
    np.testing.assert_array_equal(scene.tri_material, room.tri_material)
    assert scene.camera == room.camera


def test_bad_scenes_and_arguments_raise_clear_errors():
    V, F = icosphere(0)
    with pytest.raises(SceneError, match="material id"):
        RenderScene(V, F, np.full(len(F), 3, np.int32), [[0.5] * 3], [[0] * 3], Camera())
    with pytest.raises(SceneError, match="albedo must be <= 1"):
        RenderScene(V, F, np.zeros(len(F), np.int32), [[1.5] * 3], [[0] * 3], Camera())
    with pytest.raises(SceneError, match="missing"):
        as_render_scene({"vertices": V})
    with pytest.raises(SceneError, match="parallel"):
        Camera(position=(0, 0, 0), look_at=(0, 1, 0), up=(0, 1, 0)).frame(4, 4)
    with pytest.raises(ValueError, match="spp"):
        R.render((V, F), 4, 4, spp=0, device="cpu", accel="brute")
    with pytest.raises(ValueError, match="max_depth"):
        R.render((V, F), 4, 4, spp=1, max_depth=-1, device="cpu", accel="brute")
    with pytest.raises(ValueError, match="accel"):
        R.render((V, F), 4, 4, spp=1, device="cpu", accel="bvh")


def test_scene_without_lights_renders_background_only():
    V, F = icosphere(0)
    scene = RenderScene(V, F, np.zeros(len(F), np.int32), [[0.5] * 3], [[0] * 3],
                        Camera(position=(0, 0, 4), look_at=(0, 0, 0)),
                        background=[0.25, 0.5, 1.0])
    image = render_cpu(scene, size=8, spp=8, max_depth=3).image
    assert np.all(np.isfinite(image))
    # corners see the background directly
    np.testing.assert_allclose(image[0, 0], [0.25, 0.5, 1.0], rtol=1e-6)
    # the sphere reflects at most albedo times the background
    assert image[4, 4, 2] < 0.5 * 1.0 + 1e-6


# --- building blocks -------------------------------------------------------------------
def test_alias_table_samples_in_proportion_to_weights():
    weights = np.array([1.0, 0.0, 3.0, 0.5, 10.0])
    prob, alias, pmf = build_alias_table(weights)
    np.testing.assert_allclose(pmf, weights / weights.sum())
    # exact probability of each item from the table itself
    n = len(weights)
    exact = np.zeros(n)
    for i in range(n):
        exact[i] += prob[i] / n
        exact[alias[i]] += (1 - prob[i]) / n
    np.testing.assert_allclose(exact, pmf, atol=1e-6)
    with pytest.raises(ValueError):
        build_alias_table([0.0, 0.0])


def test_pcg_hash_array_matches_scalar():
    x = np.array([0, 1, 2, 12345, 0xFFFFFFFF, 0x80000000], dtype=np.uint32)
    expected = [R.pcg_hash_scalar(int(v)) for v in x]
    np.testing.assert_array_equal(R.pcg_hash(np, x), np.array(expected, dtype=np.uint32))
    u = R.uniform_from_key(np, np.arange(100000, dtype=np.uint32), R.stream_salt(3, 2))
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01


def test_orthonormal_basis_is_orthonormal():
    rng = np.random.default_rng(0)
    n = rng.normal(size=(1000, 3))
    n = (n / np.linalg.norm(n, axis=1, keepdims=True)).astype(np.float32)
    n[0] = [0, 0, -1]
    n[1] = [0, 0, 1]
    t, b = R.orthonormal_basis(np, n)
    for a, c in ((t, b), (t, n), (b, n)):
        assert np.abs(np.sum(a * c, axis=1)).max() < 1e-5
    assert np.abs(np.linalg.norm(t, axis=1) - 1).max() < 1e-5


def test_brute_force_tracer_hits_and_misses():
    V = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], np.float32)
    F = np.array([[0, 1, 2]], np.int32)
    tracer = R.BruteForceTracer(np, V, F)
    O = np.array([[0.25, 0.25, 1], [2, 2, 1], [0.25, 0.25, 1]], np.float32)
    D = np.array([[0, 0, -1], [0, 0, -1], [0, 0, -1]], np.float32)
    hit = tracer.intersect(O, D, np.zeros(3, np.float32), np.array([np.inf, np.inf, 0.5], np.float32))
    np.testing.assert_array_equal(hit.hit_tri, [0, -1, -1])
    np.testing.assert_allclose(hit.hit_t[0], 1.0)
    np.testing.assert_allclose([hit.hit_u[0], hit.hit_v[0]], [0.25, 0.25])


def test_soa_allocate_and_take_keep_fields_together():
    q = R.PathQueue.allocate(np, 5)
    assert q.ray_origin.shape == (5, 3) and q.ray_origin.dtype == np.float32
    assert q.path_key.dtype == np.uint32 and q.path_alive.dtype == np.uint8
    q.path_pixel[:] = np.arange(5)
    q.ray_origin[:, 0] = np.arange(5)
    sub = q.take(np.array([4, 1]))
    assert sub.size == 2
    np.testing.assert_array_equal(sub.path_pixel, [4, 1])
    np.testing.assert_array_equal(sub.ray_origin[:, 0], [4, 1])


# --- images ------------------------------------------------------------------------------
def test_tonemap_and_png_round_trip(tmp_path):
    image = np.zeros((3, 4, 3), np.float32)
    image[0, 0] = [1.0, 0.5, 0.0]
    image[1, 1] = [np.nan, np.inf, -1.0]
    pixels = tonemap(image)
    assert pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels[0, 0], [255, 188, 0])  # sRGB(0.5) = 0.735
    np.testing.assert_array_equal(pixels[1, 1], [0, 255, 0])
    path = tmp_path / "out.png"
    save_png(image, path)
    assert path.read_bytes() == encode_png(pixels)
    assert [p.name for p in tmp_path.iterdir()] == ["out.png"]
    PIL = pytest.importorskip("PIL.Image")
    with PIL.open(path) as img:
        np.testing.assert_array_equal(np.asarray(img.convert("RGB")), pixels)


# --- the kd-tree path --------------------------------------------------------------------
def test_kdtree_render_matches_brute_force_on_cpu():
    pytest.importorskip("kdtree_gpu.trace")
    scene = box_room()
    kd = R.render(scene, 12, 12, spp=4, max_depth=4, device="cpu", accel="kdtree")
    brute = render_cpu(scene, size=12, spp=4, max_depth=4)
    # same random numbers, hits equal up to the last bits of t: nearly the same image
    assert abs(kd.image.mean() / brute.image.mean() - 1) < 0.01


def test_cornell_box_with_mesh_renders_on_cpu():
    scenes = pytest.importorskip("kdtree_gpu.scenes")
    pytest.importorskip("kdtree_gpu.trace")
    V, F = icosphere(2)
    scene = scenes.cornell_box_with(V, F)
    result = R.render(scene, 16, 16, spp=4, max_depth=4, device="cpu")
    assert np.all(np.isfinite(result.image)) and result.image.mean() > 0


# --- GPU -----------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_furnace():
    for compaction in (True, False):
        result = R.render(furnace_scene(0.5), 64, 64, spp=64, max_depth=None, device="cuda",
                          compaction=compaction)
        assert np.all(np.isfinite(result.image))
        assert abs(result.image.mean() / 2.0 - 1) < 0.01


@pytest.mark.gpu
def test_gpu_and_cpu_agree_in_mean():
    # same tree, same random numbers: the two renders differ by rounding only
    cpu_renderer = R.Renderer(box_room(), 32, 32, device="cpu")
    gpu_renderer = R.Renderer(box_room(), 32, 32, device="cuda", tree=cpu_renderer.tree)
    cpu = cpu_renderer.render(spp=64, max_depth=6)
    gpu = gpu_renderer.render(spp=64, max_depth=6)
    assert np.all(np.isfinite(gpu.image))
    assert abs(gpu.image.mean() / cpu.image.mean() - 1) < 0.01


@pytest.mark.gpu
def test_gpu_kernels_match_array_twins():
    # same random numbers and the same arithmetic up to rounding: the CUDA
    # kernels and the array-expression stages run on CuPy give nearly equal images
    kernels = R.Renderer(box_room(), 32, 32, device="cuda", kernels="cuda")
    twins = R.Renderer(box_room(), 32, 32, device="cuda", kernels="xp", tree=kernels.tree)
    a = kernels.render(spp=16, max_depth=5).image
    b = twins.render(spp=16, max_depth=5).image
    assert abs(a.mean() / b.mean() - 1) < 0.01
    assert np.isclose(a, b, rtol=1e-3, atol=1e-4).mean() > 0.9


@pytest.mark.gpu
def test_gpu_compaction_does_not_change_the_image():
    renderer = R.Renderer(box_room(), 32, 32, device="cuda")
    on = renderer.render(spp=8, max_depth=8, compaction=True)
    off = renderer.render(spp=8, max_depth=8, compaction=False)
    np.testing.assert_allclose(on.image, off.image, rtol=1e-4, atol=1e-5)
    assert off.stats["queue_per_depth"][-1] == 32 * 32 * 8
    assert on.stats["queue_per_depth"][-1] < 32 * 32 * 8
    assert on.stats["paths_per_depth"] == off.stats["paths_per_depth"]


def test_icosphere_is_closed_and_wound_inward():
    V, F = icosphere(2)
    assert len(F) == 20 * 16
    # every edge is shared by exactly two triangles, in opposite directions
    edges = np.concatenate([F[:, [0, 1]], F[:, [1, 2]], F[:, [2, 0]]])
    assert len({tuple(e) for e in edges.tolist()}) == len(edges)
    assert {tuple(e[::-1]) for e in edges.tolist()} == {tuple(e) for e in edges.tolist()}
    P = V[F].astype(np.float64)
    normal = np.cross(P[:, 1] - P[:, 0], P[:, 2] - P[:, 0])
    assert np.all(np.sum(normal * P.mean(axis=1), axis=1) < 0)


def test_emission_leaves_the_front_face_unless_two_sided():
    down = lit_floor_scene()
    up = dataclasses.replace(down, faces=down.faces[:, ::-1].copy())  # light now faces up
    expected = 0.5 * 4 * rect_corner_form_factor(0.5, 0.5)
    image_up = render_cpu(up, size=4, spp=64, max_depth=1).image
    assert image_up.max() == 0
    both = dataclasses.replace(up, two_sided_emission=True)
    image_both = render_cpu(both, size=8, spp=256, max_depth=1).image
    assert abs(image_both.mean() / expected - 1) < 0.02


def test_renderer_reuses_its_tree_and_profiles_on_request():
    renderer = R.Renderer(box_room(), 8, 8, device="cpu", accel="brute")
    quiet = renderer.render(spp=2, max_depth=2, profile=False)
    loud = renderer.render(spp=2, max_depth=2, profile=True)
    assert quiet.stats["stages"] == {}
    assert "render: sample bsdf" in loud.stats["stages"]
    np.testing.assert_array_equal(quiet.image, loud.image)


def test_every_kernel_launch_passes_as_many_arguments_as_the_kernel_takes():
    # the CUDA kernels cannot run here; at least their signatures and the
    # launches in render.py must agree
    import ast
    import re
    from pathlib import Path

    cu = (Path(R.__file__).parent / "cuda" / R.RENDER_SOURCE).read_text()
    params = {name: len([p for p in body.split(",") if p.strip()])
              for name, body in re.findall(r'extern "C" __global__ void (kd_\w+)\((.*?)\)\s*\{', cu,
                                           re.S)}
    launches = {}
    for node in ast.walk(ast.parse(Path(R.__file__).read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_launch":
            name = node.args[2].value
            assert isinstance(node.args[4], ast.Tuple)
            launches[name] = len(node.args[4].elts)
    assert launches and set(launches) == set(params)
    assert launches == params


def test_builtin_scenes_are_accepted():
    scenes = pytest.importorskip("kdtree_gpu.scenes")
    cornell = as_render_scene(scenes.cornell_box())
    assert cornell.num_triangles == scenes.cornell_box().faces.shape[0]
    light_tri, _, _, _ = light_tables(cornell)
    assert len(light_tri) == 2
    # the Cornell light faces down: its front face lights the floor
    assert np.all(cornell.vertices[cornell.faces[light_tri]][:, :, 1] > 1.9)
    sphere = as_render_scene(scenes.icosphere(1))  # geometry only: default light and camera
    assert sphere.num_triangles == 80 + 2


def test_cornell_box_renders_with_the_kdtree_on_cpu():
    scenes = pytest.importorskip("kdtree_gpu.scenes")
    kd = R.render(scenes.cornell_box(), 16, 16, spp=8, max_depth=4, device="cpu")
    brute = R.render(scenes.cornell_box(), 16, 16, spp=8, max_depth=4, device="cpu", accel="brute")
    assert np.all(np.isfinite(kd.image)) and kd.image.mean() > 0
    assert abs(kd.image.mean() / brute.image.mean() - 1) < 0.02


# --- the CUDA kernels, compiled for the host ------------------------------------------------
# render.cu uses only built-in types and a few CUDA intrinsics; with this shim
# g++ compiles it as plain C++, each kernel a function of one thread. Running
# every thread in turn checks the kernels' logic (indexing, argument order,
# formulas) against the NumPy stages without a GPU. The block-wide kernels
# (compaction) run with blocks of one thread (R.COMPACT_BLOCK = 1): barriers
# and warp votes then involve that thread alone, which still checks the tile
# arithmetic, the ranks and the field moves; the GPU tests check the block scan.
HOST_SHIM = r"""
#pragma once
#include <cmath>
#include <cstring>
#include <algorithm>
struct float3 { float x, y, z; };
struct float4 { float x, y, z, w; };
struct kd_dim3 { unsigned int x, y, z; };
static kd_dim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0}, blockDim = {1, 1, 1};
extern "C" void kd_host_set_thread(int block, int thread, int block_dim) {
    blockIdx.x = (unsigned int)block;
    threadIdx.x = (unsigned int)thread;
    blockDim.x = (unsigned int)block_dim;
}
inline float3 make_float3(float x, float y, float z) { return {x, y, z}; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float atomicAdd(float* a, float v) { float old = *a; *a = old + v; return old; }
inline int atomicAdd(int* a, int v) { int old = *a; *a = old + v; return old; }
inline void __syncthreads() {}
inline int __syncthreads_count(int predicate) { return predicate != 0; }
inline unsigned int __ballot_sync(unsigned int, int predicate) { return predicate != 0; }
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
#define __shared__ static
inline void sincospif(float x, float* s, float* c) {
    double a = 3.14159265358979323846 * (double)x;
    *s = (float)std::sin(a);
    *c = (float)std::cos(a);
}
using std::min;
using std::max;
#define __global__
#define __device__
#define __forceinline__ inline
"""


def compile_render_cu_for_host(folder):
    import ctypes
    import shutil
    import subprocess
    from pathlib import Path

    from kdtree_gpu import kernels

    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    shim = Path(folder) / "host_shim.h"
    shim.write_text(HOST_SHIM)
    defines = kernels.write_defines_header(Path(folder) / "kd_defines.h")
    library = Path(folder) / "render_host.so"
    source = Path(R.__file__).parent / "cuda" / R.RENDER_SOURCE
    subprocess.run(["g++", "-std=c++17", "-O1", "-ffp-contract=off", "-shared", "-fPIC",
                    "-include", str(shim), "-include", str(defines), "-x", "c++", str(source),
                    "-o", str(library)], check=True, capture_output=True)
    return ctypes.CDLL(str(library))


def host_launcher(lib):
    import ctypes

    def launch(ctx, description, name, n, args, block=None):
        block = block or 256
        function = getattr(lib, name)
        types, values = [], []
        for a in args:
            if isinstance(a, np.ndarray):
                assert a.flags.c_contiguous, (name, a.shape)
                types.append(ctypes.c_void_p)
                values.append(a.ctypes.data)
            elif isinstance(a, np.int32):
                types.append(ctypes.c_int)
                values.append(int(a))
            elif isinstance(a, np.uint32):
                types.append(ctypes.c_uint)
                values.append(int(a))
            elif isinstance(a, np.float32):
                types.append(ctypes.c_float)
                values.append(float(a))
            else:
                raise TypeError(f"{name}: argument of type {type(a).__name__}")
        function.argtypes = types
        # thread i of the grid, in order; a block-wide kernel needs block == 1
        for i in range(n):
            lib.kd_host_set_thread(i // block, i % block, block)
            function(*values)

    return launch


def test_cuda_kernels_compiled_for_the_host_match_the_numpy_stages(tmp_path, monkeypatch):
    lib = compile_render_cu_for_host(tmp_path)
    monkeypatch.setattr(R, "COMPACT_BLOCK", 1)
    reference = R.Renderer(box_room(), 12, 12, device="cpu")
    emulated = R.Renderer(box_room(), 12, 12, device="cpu", tree=reference.tree)
    emulated.use_kernels = True
    monkeypatch.setattr(R, "_launch", host_launcher(lib))
    for compaction in (True, False):
        a = reference.render(spp=4, max_depth=5, compaction=compaction)
        b = emulated.render(spp=4, max_depth=5, compaction=compaction)
        assert np.all(np.isfinite(b.image))
        assert abs(b.image.mean() / a.image.mean() - 1) < 1e-3
        assert np.isclose(a.image, b.image, rtol=1e-4, atol=1e-6).mean() > 0.97
        assert a.stats["paths_per_depth"] == b.stats["paths_per_depth"]
    furnace = R.Renderer(furnace_scene(0.5), 8, 8, device="cpu")
    furnace.use_kernels = True
    image = furnace.render(spp=64, max_depth=None).image
    assert abs(image.mean() / 2.0 - 1) < 0.02


# --- stream compaction ------------------------------------------------------------------------
def random_queue(cls, n, rng, live_fraction=0.4):
    """A queue of ``n`` rows of random values; about ``live_fraction`` of them live."""
    arrays = {}
    for f in dataclasses.fields(cls):
        dtype, width = f.metadata["dtype"], f.metadata["width"]
        shape = (n,) if width is None else (n, width)
        if dtype.kind == "f":
            arrays[f.name] = rng.normal(size=shape).astype(dtype)
        else:
            arrays[f.name] = rng.integers(0, 1 << 20, size=shape).astype(dtype)
    queue = cls(**arrays)
    live = rng.random(n) < live_fraction
    if cls.live_field == "path_alive":
        # any nonzero flag is live
        queue.path_alive[:] = np.where(live, rng.integers(1, 4, n), 0)
    else:
        tmax = np.where(live, rng.uniform(0.1, 5.0, n), rng.choice([-1.0, 0.0, -0.0, np.nan], n))
        queue.shadow_tmax[:] = tmax.astype(np.float32)
    return queue, live


def poisoned(cls, xp, capacity):
    """A queue whose every byte is 0xA5, so that rows left unwritten show."""
    queue = cls.allocate(xp, capacity, zero=False)
    for array in queue.arrays().values():
        array.view(np.uint8)[...] = 0xA5
    return queue


def assert_compacted(source, live, destination, num_live, dead_to_back, capacity):
    n = source.size
    assert num_live == int(live.sum())
    for name, array in source.arrays().items():
        out = np.asarray(getattr(destination, name))
        np.testing.assert_array_equal(out[:num_live].view(np.uint8), array[live].view(np.uint8), name)
        untouched = slice(num_live if not (dead_to_back and name == source.live_field) else n,
                          capacity)
        assert np.all(out[untouched].view(np.uint8) == 0xA5), name
    if dead_to_back:
        flag = np.asarray(getattr(destination, source.live_field))[num_live:n]
        assert np.all(flag == 0) if flag.dtype == np.uint8 else np.all(flag == -1)


@pytest.mark.parametrize("cls", [R.PathQueue, R.ShadowQueue])
@pytest.mark.parametrize("dead_to_back", [False, True])
def test_compaction_twin_equals_boolean_mask_compaction(cls, dead_to_back):
    rng = np.random.default_rng(5)
    for n in (0, 1, 37, 1000):
        source, live = random_queue(cls, n, rng)
        destination = poisoned(cls, np, n + 5)
        num_live = R.compact_rows_xp(np, source, destination, dead_to_back=dead_to_back)
        assert_compacted(source, live, destination, num_live, dead_to_back, n + 5)


def test_field_table_lists_every_field_with_its_row_bytes():
    a, b = R.PathQueue.allocate(np, 4), R.PathQueue.allocate(np, 4)
    table = R.field_table(np, a, b).reshape(-1, 3)
    assert table.shape[0] == len(a.arrays())
    assert table[0].tolist() == [a.ray_origin.ctypes.data, b.ray_origin.ctypes.data, 12]
    assert table[-1].tolist() == [a.path_alive.ctypes.data, b.path_alive.ctypes.data, 1]
    with pytest.raises(TypeError, match="one queue type"):
        R.field_table(np, a, R.ShadowQueue.allocate(np, 4))


def test_compaction_tiles_cover_every_row_with_few_tiles():
    for n in (1, 255, 256, 257, 100_000, 1 << 20, (1 << 21) + 3):
        tile_size, num_tiles = R.compaction_tiles(n)
        assert tile_size % R.COMPACT_BLOCK == 0
        assert num_tiles <= R.COMPACT_MAX_TILES
        assert (num_tiles - 1) * tile_size < n <= num_tiles * tile_size


@pytest.mark.parametrize("max_tiles", [R.COMPACT_MAX_TILES, 7])
def test_compaction_kernel_compiled_for_the_host_matches_its_twin(tmp_path, monkeypatch, max_tiles):
    lib = compile_render_cu_for_host(tmp_path)
    monkeypatch.setattr(R, "_launch", host_launcher(lib))
    monkeypatch.setattr(R, "COMPACT_BLOCK", 1)
    # few tiles: several rows per tile, ranks carried across rows of one block
    monkeypatch.setattr(R, "COMPACT_MAX_TILES", max_tiles)
    rng = np.random.default_rng(11)
    compactor = R.Compactor(np)
    expected_sum = 0
    for cls, dead_to_back in ((R.PathQueue, False), (R.ShadowQueue, True)):
        for n, fraction in ((1, 1.0), (50, 0.0), (50, 1.0), (333, 0.4)):
            capacity = n + 3
            buffer = cls.allocate(np, capacity)
            source, live = random_queue(cls, n, rng, fraction)
            for name, array in source.arrays().items():
                getattr(buffer, name)[:n] = array
            destination = poisoned(cls, np, capacity)
            table = R.field_table(np, buffer, destination)
            compactor.compact("test", buffer.prefix(n), table, destination,
                              dead_to_back=dead_to_back, total_slot=R.COUNTER_SHADOW_RAYS,
                              sum_slot=R.COUNTER_SHADOW_RAYS_TOTAL)
            counters = compactor.read_counters()
            expected_sum += int(live.sum())
            assert counters[R.COUNTER_SHADOW_RAYS_TOTAL] == expected_sum
            assert_compacted(source, live, destination, int(counters[R.COUNTER_SHADOW_RAYS]),
                             dead_to_back, capacity)
            twin = poisoned(cls, np, capacity)
            R.compact_rows_xp(np, source, twin, dead_to_back=dead_to_back)
            for name in source.arrays():
                np.testing.assert_array_equal(getattr(twin, name).view(np.uint8),
                                              getattr(destination, name).view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("cls", [R.PathQueue, R.ShadowQueue])
def test_gpu_compaction_kernel_matches_its_twin(cls):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(3)
    compactor = R.Compactor(cp)
    dead_to_back = cls is R.ShadowQueue
    expected_sum = 0
    # one row; all dead; all live; one row per thread; several rows per thread
    for n, fraction in ((1, 1.0), (1000, 0.0), (1000, 1.0), (70_001, 0.3), (600_000, 0.55)):
        capacity = n + 100
        host, live = random_queue(cls, n, rng, fraction)
        buffer = cls.allocate(cp, capacity)
        for name, array in host.arrays().items():
            getattr(buffer, name)[:n] = cp.asarray(array)
        destination = poisoned(cls, cp, capacity)
        compactor.compact("test", buffer.prefix(n), R.field_table(cp, buffer, destination),
                          destination, dead_to_back=dead_to_back, total_slot=R.COUNTER_LIVE_PATHS,
                          sum_slot=R.COUNTER_SHADOW_RAYS_TOTAL)
        counters = compactor.read_counters()
        expected_sum += int(live.sum())
        assert counters[R.COUNTER_SHADOW_RAYS_TOTAL] == expected_sum
        num_live = int(counters[R.COUNTER_LIVE_PATHS])
        gpu = cls(**{name: cp.asnumpy(a) for name, a in destination.arrays().items()})
        assert_compacted(host, live, gpu, num_live, dead_to_back, capacity)
        twin = poisoned(cls, cp, capacity)
        assert R.compact_rows_xp(cp, buffer.prefix(n), twin, dead_to_back=dead_to_back) == num_live
        for name in host.arrays():
            np.testing.assert_array_equal(cp.asnumpy(getattr(twin, name)).view(np.uint8),
                                          gpu.arrays()[name].view(np.uint8), name)

