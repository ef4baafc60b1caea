"""The level-loop kernel of one block a multiprocessor against the kernel of two, in one
process: for each mesh, ``kd.build(profile=True)`` from CuPy arrays alternating between the
default settings and ``GpuSettings(loop_one_block_events=N)`` (N = 0: always two blocks;
2**40: always one),
REPS rounds (default 5); the median of the loop's GPU time (the profile's
``build_levels_grid`` row), of the profile's kernel sum, and of unprofiled warm builds
(CUDA events), one JSON line per mesh and setting::

    python benchmarks/probe_loop_kernels.py stanford_bunny conference [MESH ...]
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import cupy

import kdtree_gpu as kd
from bench_build import load, timed_build
from kdtree_gpu.builder.settings import GpuSettings

REPS = int(os.environ.get("REPS", 5))
VARIANTS = {"default": GpuSettings(), "two_blocks": GpuSettings(loop_one_block_events=0),
            "one_block": GpuSettings(loop_one_block_events=1 << 40)}

for name in sys.argv[1:]:
    V, F = load(name, os.environ["KDTREE_GPU_MESH_DIR"])
    V, F = cupy.asarray(V), cupy.asarray(F)
    rows = {v: {"loop_ms": [], "kernels_ms": [], "warm_ms": []} for v in VARIANTS}
    kernel = {}
    for settings in VARIANTS.values():
        kd.build(V, F, settings=settings)
    for _ in range(REPS):
        for variant, settings in VARIANTS.items():
            tree = kd.build(V, F, settings=settings, profile=True)
            prof = tree.build_info["profile"]
            kernel[variant] = tree.build_info["loop_kernel"]
            rows[variant]["loop_ms"].append(prof.get("build_levels_grid", {}).get("total_ms", 0.0))
            rows[variant]["kernels_ms"].append(
                sum(r["total_ms"] for r in prof.values() if not r["nested"]))
            _, _, start, end = timed_build(V, F, settings=settings)
            rows[variant]["warm_ms"].append(cupy.cuda.get_elapsed_time(start, end))
    for variant, r in rows.items():
        print(json.dumps({"mesh": name, "triangles": int(F.shape[0]), "variant": variant,
                          "loop_kernel": kernel[variant],
                          **{k: round(statistics.median(v), 3) for k, v in r.items()}}),
              flush=True)
