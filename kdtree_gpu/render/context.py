"""What every stage of one render shares: the render context and how kernels are launched."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Optional

import numpy as np

from ..device import Device
from ..kernels import get_function
from ..launch import DEFAULT_BLOCK, launch, stage

# The CUDA twins of the stages and of the compaction (kernels kd_render_*).
RENDER_SOURCE = "render.cu"


def launch_kernel(description: str, name: str, n: int, args: tuple,
                  block: Optional[int] = None) -> None:
    """Launch kernel ``name`` of ``render.cu`` over ``n`` threads, named ``description``.

    The kernel comes from the package's one kernel cache
    (:func:`kdtree_gpu.kernels.get_function`, memoized per device) and is
    launched and timed by :func:`kdtree_gpu.launch.launch`. Stages reach it
    as ``ctx.launch``, so that a test can run the same stages with
    ``render.cu`` compiled for the host instead.
    """
    launch(description, get_function(RENDER_SOURCE, name), n, args, block=block or DEFAULT_BLOCK)


def f32(x) -> np.float32:
    """A float kernel argument."""
    return np.float32(x)


def i32(x) -> np.int32:
    """An int kernel argument."""
    return np.int32(x)


@dataclasses.dataclass
class RenderContext:
    """State shared by the stages of one render.

    Attributes
    ----------
    xp : module
        NumPy or CuPy: the backend of every array.
    device : Device
    scene : DeviceScene
        See :mod:`kdtree_gpu.render.scene`.
    tracer : KdTreeTracer or BruteForceTracer
    width, height, seed, max_depth, rr_start_depth, compaction
        The render's settings (see :func:`kdtree_gpu.render.render`).
    use_kernels : bool
        Stages run as the kernels of ``render.cu`` (else as array expressions).
    buffers : QueueBuffers
        Every queue of every bounce.
    pass_radiance : (num_pixels, 3) float32
        Radiance of the current pass.
    film_sum : (num_pixels, 3) float32
        Sum over passes.
    launch : callable
        ``launch(description, kernel_name, n, args, block=None)``:
        :func:`launch_kernel`, or the host build of the kernels in the tests.
    """

    xp: object
    device: Device
    scene: object
    tracer: object
    width: int
    height: int
    seed: int
    max_depth: Optional[int]
    rr_start_depth: int
    compaction: bool
    use_kernels: bool
    buffers: object
    pass_radiance: object
    film_sum: object
    launch: Callable = launch_kernel

    @property
    def num_pixels(self) -> int:
        return self.width * self.height

    def stage(self, description: str):
        """Time the array expressions of a stage (see :func:`kdtree_gpu.launch.stage`)."""
        return stage(description, xp=self.xp)

    def tracer_stage(self, description: str):
        """:meth:`stage` around a tracer query, unless the tracer times its own launches.

        The GPU traversal names and times its launches ("trace closest hit",
        "trace any hit"); a stage around it would count that time twice.
        """
        if getattr(self.tracer, "records_own_launches", False):
            return contextlib.nullcontext()
        return self.stage(description)
