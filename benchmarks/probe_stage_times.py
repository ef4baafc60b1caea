"""One JSON line for one mesh: the median GPU time of every row of the build's kernel
profile over ``REPS`` profiled builds (default 5; ``kd.build(V, F, profile=True)`` from
CuPy arrays, after one unprofiled warm-up build), and the median sum of its top-level
rows. The package is whichever ``kdtree_gpu`` is first on PYTHONPATH, so that two
commits' stage times can be compared in alternating fresh processes (the stage rows
are GPU times between CUDA events; the host's speed, which varies between processes
on a shared machine, moves them less than it moves warm builds)::

    PKG=old PYTHONPATH=OLD_ROOT python benchmarks/probe_stage_times.py stanford_armadillo@sub2
    PKG=new PYTHONPATH=. python benchmarks/probe_stage_times.py stanford_armadillo@sub2

Each line: ``{"pkg": $PKG, "mesh": ..., "kernels_ms": ..., "stages": {row: [ms, nested]}}``
(``nested``: the row ran inside another, and is not in ``kernels_ms``).
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import cupy

import kdtree_gpu as kd
from bench_build import load

REPS = int(os.environ.get("REPS", 5))

V, F = load(sys.argv[1], os.environ["KDTREE_GPU_MESH_DIR"])
V, F = cupy.asarray(V), cupy.asarray(F)
kd.build(V, F)
rows, nested, totals = {}, {}, []
for _ in range(REPS):
    profile = kd.build(V, F, profile=True).build_info["profile"]
    for name, row in profile.items():
        rows.setdefault(name, []).append(row["total_ms"])
        nested[name] = row["nested"]
    totals.append(sum(row["total_ms"] for row in profile.values() if not row["nested"]))
print(json.dumps({"pkg": os.environ.get("PKG"), "mesh": sys.argv[1],
                  "kernels_ms": round(statistics.median(totals), 3),
                  "stages": {name: [round(statistics.median(ms), 4), nested[name]]
                             for name, ms in rows.items()}}), flush=True)
