"""The integrator: the loop over the stages, the :class:`Renderer` and :func:`render`.

:func:`trace_paths` is one pass of the wavefront loop (pbrt-v4's
``WavefrontPathIntegrator::Render``), a short sequence of the stage
functions of :mod:`kdtree_gpu.render.stages`; :class:`Renderer` prepares a
scene once (tree, device arrays) and renders it as often as asked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Optional

import numpy as np

from ..device import resolve_device
from ..encoding import COMPACT_BLOCK
from ..launch import Profiler, active_profiler, profiling, set_active_profiler
from ..scenes import SceneError, as_scene
from .compaction import COUNTER_SHADOW_RAYS_TOTAL, Compactor
from .context import RenderContext, launch_kernel
from .image import save_png
from .queues import QueueBuffers
from .scene import DEFAULT_RAY_EPSILON, upload_scene
from .stages import (accumulate_film, add_emission, compact_paths, generate_camera_rays,
                     handle_escaped_rays, intersect_closest, russian_roulette, sample_bsdf,
                     sample_lights, trace_shadow_rays)
from .tracers import BruteForceTracer, KdTreeTracer

ACCEL_CHOICES = ("kdtree", "brute")
KERNEL_CHOICES = ("cuda", "xp")
# Paths traced at once: enough to fill a GPU, small enough for NumPy temporaries.
DEFAULT_PATHS_PER_PASS = {"cuda": 1 << 21, "cpu": 1 << 16}
DEFAULT_RR_START_DEPTH = 2
# Without Russian roulette or a depth limit a path could bounce forever in a
# closed white room; this bounds the loop whatever the settings.
DEPTH_HARD_LIMIT = 100_000


def trace_paths(ctx: RenderContext, first_sample: int, num_samples: int, stats: dict) -> None:
    """One pass: ``num_samples`` samples of every pixel, traced to the end."""
    queue = generate_camera_rays(ctx, first_sample, num_samples)
    num_live = queue.size
    depth = 0
    while num_live > 0 and depth < DEPTH_HARD_LIMIT:
        _count(stats["paths_per_depth"], depth, num_live)
        _count(stats["queue_per_depth"], depth, queue.size)
        hit = intersect_closest(ctx, queue)
        handle_escaped_rays(ctx, queue, hit)
        add_emission(ctx, queue, hit, depth)
        if ctx.max_depth is not None and depth >= ctx.max_depth:
            break
        light_samples = sample_lights(ctx, queue, hit, depth)
        stats["shadow_rays"] += trace_shadow_rays(ctx, queue, hit, light_samples)
        sample_bsdf(ctx, queue, hit, depth)
        depth += 1
        russian_roulette(ctx, queue, depth)
        queue, num_live = compact_paths(ctx, queue)
    stats["max_depth_reached"] = max(stats["max_depth_reached"], depth)
    accumulate_film(ctx)


def _count(table: list, index: int, value: int) -> None:
    while len(table) <= index:
        table.append(0)
    table[index] += int(value)


@dataclasses.dataclass
class RenderResult:
    """A rendered image and what it took.

    Attributes
    ----------
    image : (height, width, 3) float32
        Linear radiance, the mean over samples (a NumPy array).
    stats : dict
        ``device`` (``"cuda"`` or ``"cpu"``), ``width``, ``height``, ``spp``,
        ``max_depth``, ``compaction``, ``seconds`` (wall time of the passes,
        after the tree is built), ``samples_per_second`` (pixel samples),
        ``paths_per_depth`` (live paths at the start of each depth, summed
        over passes), ``queue_per_depth`` (queue entries processed, including
        masked dead paths without compaction), ``rays`` (closest-hit rays,
        live only), ``shadow_rays`` (with compaction the rays that carry
        light; without, every queue entry, masked ones included),
        ``max_depth_reached``, ``passes``, ``stages`` (per-stage profile:
        ``{description: {"launches", "total_ms", ...}}``), ``build_seconds``.
    """

    image: np.ndarray
    stats: dict

    def save_png(self, path, exposure: float = 1.0, method: str = "clamp") -> None:
        """Tone map and write the image (see :func:`kdtree_gpu.render.image.save_png`)."""
        save_png(self.image, path, exposure=exposure, method=method)


def build_tree(scene, device):
    """A kd-tree over the scene's triangles with the package builder."""
    from ..builder import build

    return build(scene.vertices, scene.faces, device=device)


def _check_int(name, value, minimum, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        what = "None or an integer" if allow_none else "an integer"
        raise ValueError(f"{name} must be {what} >= {minimum}, got {value!r}")
    return int(value)


class Renderer:
    """A scene prepared for rendering: tree built, scene arrays on the device.

    Rendering the same scene again (other sample counts, depths, seeds,
    compaction settings) reuses all of it; benchmarks time :meth:`render`
    alone.

    Parameters
    ----------
    scene_or_mesh, width, height, device, tree, camera, accel, kernels, ray_epsilon
        As in :func:`render`.

    Attributes
    ----------
    device : Device
        Resolved once (:func:`kdtree_gpu.device.resolve_device`); the
        renderer works on that device.
    scene : Scene
        With materials and a camera (:func:`kdtree_gpu.scenes.as_scene`).
    use_kernels : bool
        The stages run as the CUDA kernels of ``render.cu`` (else as array
        expressions).
    launch : callable
        How the kernels are launched:
        :func:`~kdtree_gpu.render.context.launch_kernel`, or (in the tests)
        ``render.cu`` compiled for the host, together with ``use_kernels``
        on the CPU.
    compact_block : int
        Threads per block of the compaction kernels (1 for the host build).
    """

    def __init__(self, scene_or_mesh, width: int = 512, height: int = 512, device="auto",
                 tree=None, camera=None, accel: str = "kdtree", kernels: str = "cuda",
                 ray_epsilon: float = DEFAULT_RAY_EPSILON):
        self.width = _check_int("width", width, 1)
        self.height = _check_int("height", height, 1)
        if accel not in ACCEL_CHOICES:
            raise ValueError(f"accel must be one of {ACCEL_CHOICES}, got {accel!r}")
        if kernels not in KERNEL_CHOICES:
            raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {kernels!r}")
        if not (isinstance(ray_epsilon, (int, float)) and 0 <= ray_epsilon < 1):
            raise ValueError(f"ray_epsilon must be a number in [0, 1), got {ray_epsilon!r}")
        self.device = resolve_device(device)
        self.scene = as_scene(scene_or_mesh, camera=camera)
        self.accel = accel
        self.kernels = kernels if self.device.is_cuda else "xp"
        self.xp = xp = self.device.xp
        self.build_seconds = 0.0
        with self.device.use():
            if accel == "brute":
                self.tree = None
                self.tracer = BruteForceTracer(xp, self.scene.vertices, self.scene.faces)
            else:
                if tree is None:
                    start = time.perf_counter()
                    tree = build_tree(self.scene, self.device)
                    self.build_seconds = time.perf_counter() - start
                elif tree.num_triangles != self.scene.num_triangles:
                    raise SceneError(f"tree has {tree.num_triangles} triangles but the scene has "
                                     f"{self.scene.num_triangles}; build it over the scene's "
                                     "triangles")
                self.tree = tree
                self.tracer = KdTreeTracer(tree, self.device)
            self.device_scene = upload_scene(xp, self.scene, self.width, self.height, ray_epsilon)
        self.use_kernels = self.device.is_cuda and self.kernels == "cuda"
        self.launch = launch_kernel
        self.compact_block = COMPACT_BLOCK

    def context(self, capacity: int, compaction: bool = True, seed: int = 0,
                max_depth: Optional[int] = 8,
                rr_start_depth: int = DEFAULT_RR_START_DEPTH) -> RenderContext:
        """The state of one render: settings, film, and queues for passes of ``capacity`` paths."""
        xp = self.xp
        compactor = None
        if self.use_kernels and compaction:
            compactor = Compactor(xp, launch=self.launch, block=self.compact_block)
        num_pixels = self.width * self.height
        return RenderContext(
            xp=xp, device=self.device, scene=self.device_scene, tracer=self.tracer,
            width=self.width, height=self.height, seed=int(seed), max_depth=max_depth,
            rr_start_depth=rr_start_depth, compaction=compaction, use_kernels=self.use_kernels,
            buffers=QueueBuffers.allocate(xp, capacity, self.use_kernels, compaction, compactor),
            pass_radiance=xp.zeros((num_pixels, 3), dtype=np.float32),
            film_sum=xp.zeros((num_pixels, 3), dtype=np.float32), launch=self.launch)

    def render(self, spp: int = 64, max_depth: Optional[int] = 8, compaction: bool = True,
               seed: int = 0, rr_start_depth: int = DEFAULT_RR_START_DEPTH,
               paths_per_pass: Optional[int] = None, profile: bool = True,
               profiler=None) -> RenderResult:
        """Trace ``spp`` samples per pixel; see :func:`render` for the parameters.

        Parameters
        ----------
        profile : bool
            Record per-stage times (CUDA events around every launch, or
            ``perf_counter`` on the CPU) into ``stats["stages"]``. Off, the
            stages run without events and ``stats["stages"]`` is empty.
        """
        spp = _check_int("spp", spp, 1)
        max_depth = _check_int("max_depth", max_depth, 0, allow_none=True)
        rr_start_depth = _check_int("rr_start_depth", rr_start_depth, 0)
        if not isinstance(compaction, bool):
            raise TypeError(f"compaction must be a bool, got {compaction!r}")
        if paths_per_pass is None:
            paths_per_pass = DEFAULT_PATHS_PER_PASS[self.device.kind]
        paths_per_pass = _check_int("paths_per_pass", paths_per_pass, 1)
        num_pixels = self.width * self.height
        samples_per_pass = max(1, min(spp, paths_per_pass // num_pixels))
        with self.device.use():
            # every queue of every bounce lives in the context's buffers
            # (allocated before the clock starts)
            ctx = self.context(samples_per_pass * num_pixels, compaction, seed, max_depth,
                               rr_start_depth)
            image, stats, run = self._trace(ctx, spp, samples_per_pass, profile, profiler)
        stats.update({
            "device": self.device.kind,
            "width": self.width,
            "height": self.height,
            "spp": spp,
            "max_depth": max_depth,
            "compaction": compaction,
            "kernels": self.kernels,
            "accel": self.accel,
            "seed": int(seed),
            "passes": run["passes"],
            "samples_per_pass": samples_per_pass,
            "seconds": run["seconds"],
            "build_seconds": self.build_seconds,
            "samples_per_second": num_pixels * spp / max(run["seconds"], 1e-12),
            "rays": int(sum(stats["paths_per_depth"])),
            "stages": run["stages"],
            "scene": self.scene.name,
            "num_triangles": self.scene.num_triangles,
        })
        image = np.asarray(image, dtype=np.float32).reshape(self.height, self.width, 3)
        return RenderResult(image=image, stats=stats)

    def _trace(self, ctx: RenderContext, spp: int, samples_per_pass: int, profile: bool,
               profiler):
        """Every pass, timed.

        Returns
        -------
        image : (num_pixels, 3) float32
            The mean over samples, on the host.
        stats : dict
            The loop's counts (see :class:`RenderResult`).
        run : dict
            ``passes``, ``seconds``, ``stages``.
        """
        stats = {"paths_per_depth": [], "queue_per_depth": [], "shadow_rays": 0,
                 "max_depth_reached": 0}
        if profile:
            profiler = profiler or active_profiler() or Profiler()
            before = profiler.as_dict()
            scope = profiling(profiler)
        else:
            scope = _profiling_off()
        passes = 0
        with scope:
            if self.device.is_cuda:
                self.xp.cuda.get_current_stream().synchronize()
            start = time.perf_counter()
            for first in range(0, spp, samples_per_pass):
                trace_paths(ctx, first, min(samples_per_pass, spp - first), stats)
                passes += 1
            image = ctx.film_sum / np.float32(spp)
            if self.device.is_cuda:
                image = image.get()  # device-to-host copy: waits for the last pass
            seconds = time.perf_counter() - start
        if ctx.buffers.compactor is not None:
            # shadow rays counted on the device (the GPU is idle: no wait)
            stats["shadow_rays"] += int(
                ctx.buffers.compactor.read_counters()[COUNTER_SHADOW_RAYS_TOTAL])
        stages = _profile_difference(before, profiler.as_dict()) if profile else {}
        return image, stats, {"passes": passes, "seconds": seconds, "stages": stages}


@contextlib.contextmanager
def _profiling_off():
    previous = set_active_profiler(None)
    try:
        yield
    finally:
        set_active_profiler(previous)


def render(scene_or_mesh, width: int = 512, height: int = 512, spp: int = 64,
           max_depth: Optional[int] = 8, device="auto", compaction: bool = True,
           seed: int = 0, tree=None, camera=None, accel: str = "kdtree",
           rr_start_depth: int = DEFAULT_RR_START_DEPTH, paths_per_pass: Optional[int] = None,
           kernels: str = "cuda", ray_epsilon: float = DEFAULT_RAY_EPSILON,
           profile: bool = True, profiler=None) -> RenderResult:
    """Path-trace a scene.

    Parameters
    ----------
    scene_or_mesh : Scene, (vertices, faces), or an object with scene fields
        See :func:`kdtree_gpu.scenes.as_scene`; a bare mesh or a
        geometry-only scene gets a default camera and an area light above it.
    width, height : int
        Image size in pixels.
    spp : int
        Samples per pixel.
    max_depth : int or None
        Maximum number of bounces (pbrt-v4 convention, see
        :mod:`kdtree_gpu.render`); ``None``: no limit but Russian roulette.
    device : {"auto", "cuda", "cuda:N", "gpu", "cpu"} or Device
        Resolved by :func:`kdtree_gpu.device.resolve_device`.
    compaction : bool
        Gather live paths after every bounce (True) or keep dead paths in the
        queue, masked (False).
    seed : int
        Seed of the random numbers; equal seeds give equal images on one
        device.
    tree : KdTree, optional
        Built over exactly the scene's triangles (for a bare mesh: the mesh
        plus the two light triangles appended by
        :func:`~kdtree_gpu.scenes.mesh_scene`). Default: built here with
        :func:`kdtree_gpu.builder.build` on ``device``.
    camera : Camera, optional
        Replaces the scene's camera.
    accel : {"kdtree", "brute"}
        ``"brute"`` tests every ray against every triangle (a test oracle for
        small scenes; no tree is built).
    rr_start_depth : int
        First depth at which Russian roulette may end a path.
    paths_per_pass : int, optional
        Paths traced together; whole samples per pass, at least one. Default
        about 2M on the GPU and 64K on the CPU.
    kernels : {"cuda", "xp"}
        On the GPU, run the stages as the CUDA kernels of ``render.cu``
        (default) or as their array-expression twins on CuPy (for testing).
    ray_epsilon : float
        Offset of secondary ray origins off the surface, relative to the
        largest coordinate of the hit point (see
        :func:`kdtree_gpu.render.stages.offset_origin`).
    profile : bool
        Record per-stage times into ``stats["stages"]``.
    profiler : kdtree_gpu.launch.Profiler, optional
        Records every launch and stage (default: the active profiler, or a
        new one); ``stats["stages"]`` holds this render's share of it.

    Returns
    -------
    RenderResult

    Raises
    ------
    ValueError
        A bad size, sample count, depth or choice.
    SceneError
        A scene that cannot be rendered.
    """
    renderer = Renderer(scene_or_mesh, width, height, device=device, tree=tree, camera=camera,
                        accel=accel, kernels=kernels, ray_epsilon=ray_epsilon)
    return renderer.render(spp=spp, max_depth=max_depth, compaction=compaction, seed=seed,
                           rr_start_depth=rr_start_depth, paths_per_pass=paths_per_pass,
                           profile=profile, profiler=profiler)


def _profile_difference(before: dict, after: dict) -> dict:
    out = {}
    for description, s in after.items():
        b = before.get(description, {"launches": 0, "total_ms": 0.0})
        launches = s["launches"] - b["launches"]
        if launches <= 0:
            continue
        total = s["total_ms"] - b["total_ms"]
        out[description] = {"launches": launches, "total_ms": total, "avg_ms": total / launches}
    grand = sum(s["total_ms"] for s in out.values())
    for s in out.values():
        s["share"] = s["total_ms"] / grand if grand > 0 else 0.0
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["total_ms"]))
