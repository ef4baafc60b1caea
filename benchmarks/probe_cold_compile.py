"""What a machine's first ``kd.build`` waits for: every NVRTC compilation, timed.

Run in a fresh process with empty kernel caches (``CUPY_CACHE_DIR``, ``KDTREE_GPU_CACHE_DIR``
pointing at new folders): CuPy's NVRTC call (``compiler._compile_using_nvrtc_no_warning``,
which its kernel cache calls) is wrapped with a wall clock, so each compilation the first
build (and then the first ``tree.intersect``) asks for in this process is listed with its
source (the package's modules by their ``#line`` file name, CuPy's own kernels by their first
kernel name), its seconds and its binary's size; then the build's wall time, the sum of those
compilations and the rest: modules compiled ahead in child processes
(``compile_ahead.compile_modules``) are in the rest (imports excluded: they ran before the clock)::

    CUPY_CACHE_DIR=$(mktemp -d) KDTREE_GPU_CACHE_DIR=$(mktemp -d) \\
        python benchmarks/probe_cold_compile.py stanford_bunny

One JSON line per mesh (``compiles``: [source, seconds, bytes], in the order they ran).
"""
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import cupy
import cupy.cuda.compiler as compiler

import kdtree_gpu as kd
from bench_build import load

compiles = []
_compile = compiler._compile_using_nvrtc_no_warning


def _source_name(source: str) -> str:
    m = re.search(r'#line 1 "([^"]+)"', source)
    if m:
        return m.group(1)
    m = re.search(r"__global__\s+void\s+(\w+)", source)
    return "cupy:" + (m.group(1) if m else "?")


def timed_compile(source, *args, **kwargs):
    t = time.perf_counter()
    out = _compile(source, *args, **kwargs)
    size = len(out[0])
    compiles.append([_source_name(source), round(time.perf_counter() - t, 3), size])
    return out


compiler._compile_using_nvrtc_no_warning = timed_compile


def main():
    mesh_dir = os.environ.get("KDTREE_GPU_MESH_DIR")
    for mesh in sys.argv[1:]:
        V, F = load(mesh, mesh_dir)
        V, F = cupy.asarray(V), cupy.asarray(F)
        cupy.cuda.Device().synchronize()
        compiles.clear()
        t = time.perf_counter()
        tree = kd.build(V, F)
        cupy.cuda.Device().synchronize()
        build_s = time.perf_counter() - t
        build_compiles = list(compiles)
        compiles.clear()
        lo, hi = (cupy.asarray(b, dtype=cupy.float32) for b in tree.bounds)
        o = cupy.broadcast_to((lo + hi) / 2, (1024, 3)).copy()
        d = cupy.random.default_rng(1).standard_normal((1024, 3), dtype=cupy.float32)
        t = time.perf_counter()
        tree.intersect(o, d)
        cupy.cuda.Device().synchronize()
        query_s = time.perf_counter() - t
        t = time.perf_counter()
        kd.build(V, F)
        cupy.cuda.Device().synchronize()
        second_s = time.perf_counter() - t
        summed = sum(c[1] for c in build_compiles)
        print(json.dumps({
            "mesh": mesh, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
            "cpus": os.cpu_count(), "cupy": cupy.__version__,
            "nvrtc": list(compiler._get_nvrtc_version()), "build_s": round(build_s, 3),
            "build_compile_s": round(summed, 3), "build_rest_s": round(build_s - summed, 3),
            "query_s": round(query_s, 3), "second_build_s": round(second_s, 4),
            "compiles": build_compiles, "query_compiles": list(compiles)}), flush=True)


if __name__ == "__main__":
    main()
