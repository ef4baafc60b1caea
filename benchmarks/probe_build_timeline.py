"""Where a warm ``kd.build`` leaves the GPU idle: a timeline of one profiled build.

For each mesh: two warm builds, then one ``kd.build(profile=True)`` whose launches and
stages (the profiler's CUDA event pairs) are placed on one time axis from an event recorded
just before the call. The GPU is idle between the end of one top-level record and the
start of the next; those gaps are listed (largest first, with the records on either side
and the host's clock when each record was queued) and summed by the record that follows
them. Then one more warm build runs under cProfile (profiling off): the host functions
with the most time of their own. Work that is neither a launch nor a stage (CuPy's own
small kernels, copies) shows as gap here::

    python benchmarks/probe_build_timeline.py stanford_armadillo@sub2 [MESH ...]
"""
import cProfile
import io
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import cupy

import kdtree_gpu as kd
from kdtree_gpu import launch as launch_mod
from bench_build import load, timed_build

records = []
_add_events = launch_mod.Profiler.add_events


def add_events(self, description, start, end, nested=False):
    records.append((description, start, end, time.perf_counter(), nested))
    _add_events(self, description, start, end, nested)


launch_mod.Profiler.add_events = add_events


def timeline(V, F, top=25):
    records.clear()
    t0, host_ms, ref, done = timed_build(V, F, profile=True)
    rows = []
    for desc, start, end, host, nested in records:
        if nested:
            continue
        rows.append((cupy.cuda.get_elapsed_time(ref, start), cupy.cuda.get_elapsed_time(ref, end),
                     desc, 1000 * (host - t0)))
    rows.sort()
    span = cupy.cuda.get_elapsed_time(ref, done)
    busy = sum(e - s for s, e, _, _ in rows)
    gaps, reach, prev = [], 0.0, "(start)"
    for s, e, desc, host in rows:
        if s > reach:
            gaps.append((s - reach, prev, desc, s, host))
        reach = max(reach, e)
        prev = desc
    gaps.append((span - reach, prev, "(end)", span, host_ms))
    print(f"  span {span:.2f} ms (host {host_ms:.2f}), records {len(rows)}, "
          f"busy {busy:.2f}, idle {sum(g[0] for g in gaps):.2f}")
    by_next = {}
    for g in gaps:
        by_next.setdefault(g[2], [0.0, 0])
        by_next[g[2]][0] += g[0]
        by_next[g[2]][1] += 1
    print("  idle before (ms, count):")
    for desc, (ms, n) in sorted(by_next.items(), key=lambda kv: -kv[1][0])[:15]:
        print(f"    {ms:8.3f} {n:5d}  {desc}")
    print("  largest gaps: ms | after | before | gpu at ms | host queued at ms")
    for g in sorted(gaps, reverse=True)[:top]:
        print(f"    {g[0]:7.3f} | {g[1]} | {g[2]} | {g[3]:.2f} | {g[4]:.2f}")


for name in sys.argv[1:]:
    V, F = load(name, os.environ["KDTREE_GPU_MESH_DIR"])
    V, F = cupy.asarray(V), cupy.asarray(F)
    for _ in range(2):
        kd.build(V, F)
    cupy.cuda.Device().synchronize()
    print(f"== {name} ({F.shape[0]} triangles, {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()})")
    timeline(V, F)
    timeline(V, F, top=0)
    prof = cProfile.Profile()
    prof.enable()
    kd.build(V, F)
    cupy.cuda.Device().synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
    print("\n".join(line for line in s.getvalue().splitlines()[4:] if line.strip()))
