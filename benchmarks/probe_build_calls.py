"""Where a warm ``kd.build``'s host time goes, call by call, without added synchronizes.

The builder's Python functions (and CuPy's reads, copies and memory-pool calls it makes)
are wrapped with a wall clock; one warm build (profiling off) is then printed as a nested
list: when each call began (ms from the build's start), how long it took, and its own time
without the wrapped calls inside it. A call that waits for the GPU (a read) shows the
wait as its own time. Then the same build's wall time, and the GPU time between two CUDA
events around it::

    python benchmarks/probe_build_calls.py stanford_bunny [MESH ...]

``KEEP=1`` builds with ``GpuSettings(keep_workspace=True)`` (the workspace's blocks are
kept between builds: no device allocation or free in a warm build); ``KD_SETTINGS`` (JSON)
gives other ``GpuSettings`` fields, e.g. ``KD_SETTINGS='{"loop_one_block_events": 4194304}'``.
"""
import functools
import importlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import cupy

from bench_build import load, timed_build
from kdtree_gpu.builder.settings import GpuSettings

calls = []  # [depth, name, start, end, inner]
depth = [0]
on = [False]


def wrap(owner, attr, name=None):
    fn = getattr(owner, attr)
    name = name or f"{getattr(owner, '__name__', owner)}.{attr}"

    @functools.wraps(fn)
    def timed(*a, **k):
        if not on[0]:
            return fn(*a, **k)
        rec = [depth[0], name, time.perf_counter(), 0.0, 0.0]
        calls.append(rec)
        depth[0] += 1
        try:
            return fn(*a, **k)
        finally:
            depth[0] -= 1
            rec[3] = time.perf_counter()

    setattr(owner, attr, timed)


MODULES = {
    "kdtree_gpu.builder.api": ["_build_levels", "coerce_mesh_cuda", "_build_device"],
    "kdtree_gpu.builder.gpu": ["build_levels_cuda", "prepare_mesh_cuda", "level_loop_kernel",
                               "root_loop_buffers", "create_root_events_cuda",
                               "build_levels_grid", "build_level_stages",
                               "build_small_subtrees", "pack_layout"],
    "kdtree_gpu.builder.gpu.root": ["_summary_init", "check_trace_range",
                                    "inclusive_scan_in_place", "arrays_in_one_block"],
    "kdtree_gpu.builder.gpu.small": ["room_under_peak", "_stage_buffers", "pack_leaves",
                                     "level_records", "launch"],
    "kdtree_gpu.builder.gpu.level_loop": ["loop_plan", "every_node_small", "launch",
                                          "moved_aside", "copied_level"],
}
CLASSES = {
    "kdtree_gpu.builder.gpu.workspace": {"Workspace": ["__init__", "__enter__", "__exit__",
                                                       "trim", "release_unused", "sample",
                                                       "before_device_allocation", "_malloc"]},
    "kdtree_gpu.builder.gpu.output": {"TreeOutput": ["__init__", "reserve", "finish",
                                                     "page_args", "_make", "set_final_leaf"]},
    "kdtree_gpu.tree.kdtree": {"KdTree": ["_from_builder"]},
}


def install():
    for mod, names in MODULES.items():
        m = importlib.import_module(mod)
        for n in names:
            if hasattr(m, n):
                wrap(m, n, f"{mod.rsplit('.', 1)[-1]}.{n}")
    for mod, classes in CLASSES.items():
        m = importlib.import_module(mod)
        for cls, names in classes.items():
            for n in names:
                wrap(getattr(m, cls), n, f"{cls}.{n}")
    # uploads (reads are CuPy methods: their wait is the caller's own time)
    wrap(cupy, "asarray", "cupy.asarray")


def one(V, F, settings, show):
    global calls
    calls = []
    cupy.cuda.Device().synchronize()
    on[0] = show
    t0, host_ms, start_ev, end_ev = timed_build(V, F, settings=settings)
    wall_ms = (time.perf_counter() - t0) * 1e3
    on[0] = False
    return t0, host_ms, wall_ms, cupy.cuda.get_elapsed_time(start_ev, end_ev)


def main():
    install()
    fields = json.loads(os.environ.get("KD_SETTINGS") or "{}")
    if os.environ.get("KEEP"):
        fields["keep_workspace"] = True
    settings = GpuSettings(**fields) if fields else None
    for name in sys.argv[1:]:
        V, F = load(name, os.environ["KDTREE_GPU_MESH_DIR"])
        V, F = cupy.asarray(V), cupy.asarray(F)
        for _ in range(3):
            one(V, F, settings, False)
        rows = [one(V, F, settings, False)[1:] for _ in range(7)]
        rows.sort(key=lambda r: r[2])
        host, wall, gpu = rows[len(rows) // 2]
        print(f"== {name} ({F.shape[0]} triangles, {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}"
              f", settings {fields or 'default'})")
        print(f"  unwrapped warm builds (median of 7): host returns at {host:.2f} ms, "
              f"synchronized {wall:.2f} ms, CUDA events {gpu:.2f} ms")
        t0, host, wall, gpu = one(V, F, settings, True)
        # own time: a call's duration less its direct children's
        for i, rec in enumerate(calls):
            d = rec[0]
            inner = 0.0
            for child in calls[i + 1:]:
                if child[0] <= d:
                    break
                if child[0] == d + 1:
                    inner += child[3] - child[2]
            rec[4] = (rec[3] - rec[2]) - inner
        print(f"  wrapped build: host returns at {host:.2f} ms, synchronized {wall:.2f} ms, "
              f"CUDA events {gpu:.2f} ms")
        print("  start ms | total ms | own ms | call")
        for d, nm, s, e, own in calls:
            if e - s < 20e-6 and d > 2:
                continue
            print(f"  {1e3 * (s - t0):8.3f} | {1e3 * (e - s):8.3f} | {1e3 * own:7.3f} | "
                  f"{'  ' * d}{nm}")
        agg = {}
        for d, nm, s, e, own in calls:
            a = agg.setdefault(nm, [0, 0.0])
            a[0] += 1
            a[1] += own
        print("  own time by call (ms, calls):")
        for nm, (n, own) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:15]:
            print(f"    {1e3 * own:8.3f} {n:5d}  {nm}")


if __name__ == "__main__":
    main()
