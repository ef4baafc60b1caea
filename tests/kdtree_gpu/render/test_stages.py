"""The stages (kdtree_gpu.render.stages): every CUDA kernel against its array-expression twin.

Stage by stage: both sides start each stage from the same state (the twin's
queues and film copied into the kernels' buffers), run it, and must leave the
same state behind, so a difference names the stage that made it. The kernels
run compiled for the host (no GPU needed) and, in the ``gpu`` tests, on the
GPU against the twins on CuPy. Whole renders are compared as well.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from kdtree_gpu import kernels
from kdtree_gpu.arrays import to_numpy
from kdtree_gpu.render import RENDER_SOURCE, Renderer
from kdtree_gpu.render import context as render_context
from kdtree_gpu.render.compaction import COUNTER_SHADOW_RAYS, live_mask
from kdtree_gpu.render.stages import (accumulate_film, add_emission, compact_paths,
                                      compact_shadow_rays, expand_light_samples,
                                      generate_camera_rays, handle_escaped_rays, intersect_closest,
                                      russian_roulette, sample_bsdf, sample_lights,
                                      trace_shadow_rays)
from kdtree_gpu.scenes import furnace_scene
from kdtree_gpu.soa import SoA

RENDER_PACKAGE = Path(render_context.__file__).parent


def test_every_kernel_launch_passes_as_many_arguments_as_the_kernel_takes():
    # the CUDA kernels cannot run here; at least their signatures and the
    # launches in the render package (ctx.launch / self.launch) must agree
    cu = (kernels.CUDA_DIR / RENDER_SOURCE).read_text()
    params = {name: len([p for p in body.split(",") if p.strip()])
              for name, body in re.findall(r'extern "C" __global__ void (kd_\w+)\((.*?)\)\s*\{', cu,
                                           re.S)}
    launches = {}
    for path in sorted(RENDER_PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "launch"
                    and len(node.args) >= 4 and isinstance(node.args[1], ast.Constant)):
                name = node.args[1].value
                assert isinstance(node.args[3], ast.Tuple), (path.name, name)
                assert name not in launches, f"{name} launched in two places"
                launches[name] = len(node.args[3].elts)
    assert launches and set(launches) == set(params)
    assert launches == params


# --- stage by stage ------------------------------------------------------------------
def state(ctx) -> dict:
    """What a stage may write: the queue buffers and the film, by name."""
    b = ctx.buffers
    out = {"paths0": b.paths[0], "paths1": b.paths[1], "light_samples": b.light_samples,
           "shadow": b.shadow, "shadow_compact": b.shadow_compact,
           "pass_radiance": ctx.pass_radiance, "film_sum": ctx.film_sum}
    return {name: value for name, value in out.items() if value is not None}


def copy_state(source: dict, destination: dict) -> None:
    for name, value in source.items():
        if isinstance(value, SoA):
            for field, array in value.arrays().items():
                getattr(destination[name], field)[...] = array
        else:
            destination[name][...] = value


def assert_same_state(stage: str, kernel: dict, twin: dict, skip=()) -> None:
    """Every buffer alike; a queue's fields in its live rows only.

    Dead rows are left as they fall: a kernel returns early, a twin writes
    whole selections.
    """
    for name, value in twin.items():
        if name in skip:
            continue
        if not isinstance(value, SoA):
            assert_close(stage, name, kernel[name], value)
            continue
        live = to_numpy(live_mask(value)) if value.live_field else slice(None)
        for field, array in value.arrays().items():
            rows = slice(None) if field == value.live_field else live
            assert_close(stage, f"{name}.{field}", to_numpy(getattr(kernel[name], field))[rows],
                         to_numpy(array)[rows])


def assert_close(stage: str, name: str, a, b):
    """Kernel result ``a`` and twin result ``b`` agree up to float32 rounding."""
    a, b = to_numpy(a), to_numpy(b)
    assert a.shape == b.shape, (stage, name, a.shape, b.shape)
    if a.dtype.kind == "f":
        same = np.isclose(a, b, rtol=1e-4, atol=1e-6, equal_nan=True)
    else:
        same = a == b
    # a few decisions taken on a value within rounding of its threshold may differ
    assert same.size == 0 or same.mean() >= 0.99, (
        f"{stage}: {name} differs in {int((~same).sum())} of {same.size} values; first at "
        f"{np.argwhere(~same)[:3].tolist()}: kernel {a[~same][:3]}, twin {b[~same][:3]}")


class SideBySide:
    """One render's contexts for the kernels and for their twins, stepped stage by stage."""

    def __init__(self, kernel_renderer: Renderer, twin_renderer: Renderer, spp: int, seed: int):
        capacity = kernel_renderer.width * kernel_renderer.height * spp
        # no depth limit, roulette from the first bounce: every stage runs
        settings = dict(compaction=True, seed=seed, max_depth=None, rr_start_depth=1)
        self.kernels = kernel_renderer.context(capacity, **settings)
        self.twins = twin_renderer.context(capacity, **settings)
        assert self.kernels.use_kernels and not self.twins.use_kernels
        self.stages = []

    def step(self, stage: str, function, kernel_args=(), twin_args=(), skip=()):
        """Start both from the twins' state, run ``function``, compare the states after."""
        copy_state(state(self.twins), state(self.kernels))
        self.kernels.buffers.current = self.twins.buffers.current
        results = (function(self.kernels, *kernel_args), function(self.twins, *twin_args))
        assert_same_state(stage, state(self.kernels), state(self.twins), skip)
        self.stages.append(stage)
        return results


def compare_stage_by_stage(kernel_renderer, twin_renderer, spp=2, seed=3):
    run = SideBySide(kernel_renderer, twin_renderer, spp, seed)
    qk, qt = run.step("generate camera rays", generate_camera_rays, (0, spp), (0, spp))
    depth = 0
    while qt.size and depth < 6:
        hk, ht = run.step("intersect closest", intersect_closest, (qk,), (qt,))
        for name, array in ht.arrays().items():
            assert_close("intersect closest", name, getattr(hk, name), array)
        run.step("handle escaped rays", handle_escaped_rays, (qk, hk), (qt, ht))
        run.step("add emission", add_emission, (qk, hk, depth), (qt, ht, depth))
        sk, st = run.step("sample lights", sample_lights, (qk, hk, depth), (qt, ht, depth))
        shadow_k, shadow_t = run.step("expand light samples", expand_light_samples,
                                      (qk, hk, sk), (qt, ht, st))
        # the kernel leaves the dead rows at the back (no count on the host), the twin
        # stops at the last live row: compare the rows in front, and the back's flags
        (ck, _), (ct, num_rays) = run.step("compact shadow rays", compact_shadow_rays,
                                           (shadow_k,), (shadow_t,), skip=("shadow_compact",))
        assert int(run.kernels.buffers.compactor.read_counters()[COUNTER_SHADOW_RAYS]) == num_rays
        for name, array in ct.arrays().items():
            assert_close("compact shadow rays", name, getattr(ck, name)[:num_rays], array)
        assert np.all(to_numpy(ck.shadow_tmax[num_rays:]) == -1)
        run.step("trace shadow rays", trace_shadow_rays, (qk, hk, sk), (qt, ht, st),
                 skip=("shadow_compact",))
        run.step("sample bsdf", sample_bsdf, (qk, hk, depth), (qt, ht, depth))
        depth += 1
        run.step("russian roulette", russian_roulette, (qk, depth), (qt, depth))
        (qk, live_k), (qt, live_t) = run.step("compact paths", compact_paths, (qk,), (qt,))
        assert live_k == live_t
    run.step("accumulate film", accumulate_film)
    assert depth >= 2 and "russian roulette" in run.stages


def test_host_kernels_match_their_twins_stage_by_stage(host_renderer, render_helpers):
    twins = Renderer(render_helpers.box_room(), 10, 10, device="cpu")
    compare_stage_by_stage(host_renderer(render_helpers.box_room(), 10, twins.tree), twins)


@pytest.mark.gpu
def test_gpu_kernels_match_their_twins_stage_by_stage(render_helpers):
    kernel_renderer = Renderer(render_helpers.box_room(), 24, 24, device="cuda", kernels="cuda")
    twins = Renderer(render_helpers.box_room(), 24, 24, device="cuda", kernels="xp",
                     tree=kernel_renderer.tree)
    compare_stage_by_stage(kernel_renderer, twins, spp=4)


# --- whole renders ---------------------------------------------------------------------
def test_cuda_kernels_compiled_for_the_host_match_the_numpy_stages(host_renderer, render_helpers):
    reference = Renderer(render_helpers.box_room(), 12, 12, device="cpu")
    emulated = host_renderer(render_helpers.box_room(), 12, reference.tree)
    for compaction in (True, False):
        a = reference.render(spp=4, max_depth=5, compaction=compaction)
        b = emulated.render(spp=4, max_depth=5, compaction=compaction)
        assert np.all(np.isfinite(b.image))
        assert abs(b.image.mean() / a.image.mean() - 1) < 1e-3
        assert np.isclose(a.image, b.image, rtol=1e-4, atol=1e-6).mean() > 0.97
        assert a.stats["paths_per_depth"] == b.stats["paths_per_depth"]
    image = host_renderer(furnace_scene(0.5), 8).render(spp=64, max_depth=None).image
    assert abs(image.mean() / 2.0 - 1) < 0.02


@pytest.mark.gpu
def test_gpu_kernels_match_array_twins(render_helpers):
    # same random numbers and the same arithmetic up to rounding: the CUDA
    # kernels and the array-expression stages run on CuPy give nearly equal images
    kernel_renderer = Renderer(render_helpers.box_room(), 32, 32, device="cuda", kernels="cuda")
    twins = Renderer(render_helpers.box_room(), 32, 32, device="cuda", kernels="xp",
                     tree=kernel_renderer.tree)
    a = kernel_renderer.render(spp=16, max_depth=5).image
    b = twins.render(spp=16, max_depth=5).image
    assert abs(a.mean() / b.mean() - 1) < 0.01
    assert np.isclose(a, b, rtol=1e-3, atol=1e-4).mean() > 0.9
