"""Fixtures of the path tracer's tests: small scenes, render.cu compiled for the host, queues.

CPU tests use small images and often the brute-force tracer (every ray
against every triangle), so they check the estimator independently of the
kd-tree. The CUDA kernels are checked against their NumPy twins in two
ways: compiled for the host with g++ (``host_kernels``; runs without a GPU)
and, in the tests marked ``gpu``, on the GPU against the twins on CuPy.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import shutil
import subprocess
import types

import numpy as np
import pytest

from kdtree_gpu import kernels
from kdtree_gpu.arrays import to_numpy
from kdtree_gpu.render import RENDER_SOURCE
from kdtree_gpu.render import render as render_function
from kdtree_gpu.scenes import Camera, Scene


# --- scenes ------------------------------------------------------------------------
def lit_floor_scene(light_half=0.5, light_height=1.0, albedo=0.5, light_radiance=1.0):
    """A large floor under a square emitter; the camera looks straight down at the center."""
    s, h, big = light_half, light_height, 50.0
    V = np.array([[-big, 0, -big], [big, 0, -big], [big, 0, big], [-big, 0, big],
                  [-s, h, -s], [s, h, -s], [s, h, s], [-s, h, s]], np.float32)
    F = np.array([[0, 2, 1], [0, 3, 2], [4, 5, 6], [4, 6, 7]], np.int32)
    camera = Camera(position=(0.0, 0.5 * h, 0.0), look_at=(0.0, 0.0, 0.0), up=(0.0, 0.0, -1.0),
                    vfov_degrees=2.0)
    return Scene(V, F, [0, 0, 1, 1], [[albedo] * 3, [0, 0, 0]],
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
    return Scene(np.array(V, np.float32), np.array(F, np.int32), np.array(M, np.int32),
                 albedo, emission, camera, name="box room")


def rect_corner_form_factor(x, y):
    """Form factor from a point to a parallel rectangle with one corner straight above it.

    ``x``, ``y``: rectangle sides divided by the height.
    """
    a = x / math.sqrt(1 + x * x) * math.atan(y / math.sqrt(1 + x * x))
    b = y / math.sqrt(1 + y * y) * math.atan(x / math.sqrt(1 + y * y))
    return (a + b) / (2 * math.pi)


def render_cpu(scene, size=16, spp=16, **kwargs):
    """A square CPU render, by default with the brute-force tracer."""
    kwargs.setdefault("accel", "brute")
    return render_function(scene, size, size, spp=spp, device="cpu", **kwargs)


# --- queues ----------------------------------------------------------------------------
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
    """``destination`` holds the live rows of ``source`` in order, and nothing else was written."""
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


def assert_same_bytes(a, b):
    """Two queues of one type hold the same bytes in every field (NumPy or CuPy)."""
    for name, array in a.arrays().items():
        np.testing.assert_array_equal(to_numpy(array).view(np.uint8),
                                      to_numpy(getattr(b, name)).view(np.uint8), name)


@pytest.fixture(scope="session")
def render_helpers():
    """The helpers above: ``render_helpers.box_room()``, ``render_helpers.render_cpu(...)``, ..."""
    return types.SimpleNamespace(
        lit_floor_scene=lit_floor_scene, box_room=box_room,
        rect_corner_form_factor=rect_corner_form_factor, render_cpu=render_cpu,
        random_queue=random_queue, poisoned=poisoned, assert_compacted=assert_compacted,
        assert_same_bytes=assert_same_bytes)


# --- the CUDA kernels, compiled for the host ------------------------------------------------
# render.cu uses only built-in types and a few CUDA intrinsics; with this shim
# g++ compiles it as plain C++, each kernel a function of one thread. Running
# every thread in turn checks the kernels' logic (indexing, argument order,
# formulas) against the NumPy stages without a GPU. The block-wide kernels
# (compaction) run with blocks of one thread (Renderer.compact_block = 1,
# Compactor(block=1)): barriers and warp votes then involve that thread alone,
# which still checks the tile arithmetic, the ranks and the field moves; the
# GPU tests check the block scan.
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
    """``render.cu`` built as a shared library with g++ (skips the test without g++)."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    shim = folder / "host_shim.h"
    shim.write_text(HOST_SHIM)
    defines = kernels.write_defines_header(folder / "kd_defines.h")
    library = folder / "render_host.so"
    source = kernels.CUDA_DIR / RENDER_SOURCE
    subprocess.run(["g++", "-std=c++17", "-O1", "-ffp-contract=off", "-shared", "-fPIC",
                    "-include", str(shim), "-include", str(defines), "-x", "c++", str(source),
                    "-o", str(library)], check=True, capture_output=True)
    return ctypes.CDLL(str(library))


def host_launcher(lib):
    """A ``launch(description, name, n, args, block=None)`` that runs every thread in turn."""

    def launch(description, name, n, args, block=None):
        block = block or 256
        function = getattr(lib, name)
        argtypes, values = [], []
        for a in args:
            if isinstance(a, np.ndarray):
                assert a.flags.c_contiguous, (name, a.shape)
                argtypes.append(ctypes.c_void_p)
                values.append(a.ctypes.data)
            elif isinstance(a, np.int32):
                argtypes.append(ctypes.c_int)
                values.append(int(a))
            elif isinstance(a, np.uint32):
                argtypes.append(ctypes.c_uint)
                values.append(int(a))
            elif isinstance(a, np.float32):
                argtypes.append(ctypes.c_float)
                values.append(float(a))
            else:
                raise TypeError(f"{name}: argument of type {type(a).__name__}")
        function.argtypes = argtypes
        # thread i of the grid, in order; a block-wide kernel needs block == 1
        for i in range(n):
            lib.kd_host_set_thread(i // block, i % block, block)
            function(*values)

    return launch


@pytest.fixture(scope="session")
def host_kernels(tmp_path_factory):
    """``render.cu`` compiled for the host: a launcher for ``Renderer.launch`` / ``Compactor``."""
    return host_launcher(compile_render_cu_for_host(tmp_path_factory.mktemp("render_host")))


def host_kernel_renderer(launch, scene, size, tree=None):
    """A CPU renderer whose stages run the host build of the kernels (blocks of one thread)."""
    from kdtree_gpu.render import Renderer

    renderer = Renderer(scene, size, size, device="cpu", tree=tree)
    renderer.use_kernels = True
    renderer.launch = launch
    renderer.compact_block = 1
    return renderer


@pytest.fixture(scope="session")
def host_renderer(host_kernels):
    """``host_renderer(scene, size, tree=None)``: :func:`host_kernel_renderer` with ``host_kernels``."""
    return lambda scene, size, tree=None: host_kernel_renderer(host_kernels, scene, size, tree)
