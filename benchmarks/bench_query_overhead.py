#!/usr/bin/env python3
"""Where a single synchronized ``tree.intersect`` spends its time, beside the kernel alone.

A renderer or a training loop that queues its queries meets the kernel's
rate (bench_traversal.py, *queued*); a caller who waits for every result
also pays the host's work of each call. For each mesh and ray count (one
ray: host work only; ``--width`` x ``--height`` primary rays from
``peer_bench.make_primary_rays``), on CuPy arrays:

* wall clock of one call and its synchronization (median of ``--repeats``
  after ``--warmup``, timed as bench_traversal.py times its single calls):
  the kernel alone (the traversal launch with its
  arguments made in advance, ``trace.gpu.prepared_launch``), and through
  the public API ``tree.intersect`` checked (the default), unchecked
  (``check=False``) and into preallocated outputs (``out=``, checked);
* host microseconds per call, nothing synchronized (``--calls`` calls back
  to back; with one ray the GPU keeps up, so this is the host's work): the
  kernel launch alone, one ``cupy.empty`` of the ray count (a query makes
  four), the API unchecked and with ``out=``.

Usage::

    PYTHONPATH=. python benchmarks/bench_query_overhead.py --peers-dir .peers --out benchmarks/results

Writes ``query_overhead_<gpu>.json`` and ``.md``.
"""

from __future__ import annotations

import sys
import time

from _common import gpu_benchmark_parser, gpu_slug, md_head, md_row, run_meshes, start_gpu_benchmark
from bench_first_hit import load
from bench_traversal import time_wall

DEFAULT_MESHES = ["stanford_bunny", "conference"]


def parse_args(argv=None):
    parser = gpu_benchmark_parser(__doc__, DEFAULT_MESHES, repeats=60, warmup=10)
    parser.add_argument("--calls", type=int, default=1000,
                        help="calls per host-time measurement")
    return parser.parse_args(argv)


def host_us(fn, sync, calls, warmup):
    """Host microseconds per call of ``calls`` calls with nothing synchronized."""
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    sync()
    return 1e6 * elapsed / calls


def bench_mesh(spec, args, pb):
    import cupy

    import kdtree_gpu as kd
    from kdtree_gpu.trace import gpu as rg

    sync = cupy.cuda.get_current_stream().synchronize
    _, V, F = load(pb, args.mesh_dir, spec)
    tree = kd.build(cupy.asarray(V), cupy.asarray(F))
    O, D = pb.make_primary_rays(V, args.width, args.height)
    record = {"mesh": spec, "triangles": int(F.shape[0]), "sets": []}
    reps, warm = args.repeats, args.warmup

    def wall_us(fn):  # as bench_traversal's single calls (peer_bench's timing)
        return 1e6 * time_wall(pb, fn, reps, warm)

    for O_h, D_h in ((O[:1], D[:1]), (O, D)):
        Od = cupy.asarray(O_h, dtype=cupy.float32)
        Dd = cupy.asarray(D_h, dtype=cupy.float32)
        n = int(Od.shape[0])
        launch, _ = rg.prepared_launch(tree, Od, Dd)
        out = (cupy.empty(n, cupy.float32), cupy.empty(n, cupy.int32),
               cupy.empty(n, cupy.float32), cupy.empty(n, cupy.float32))
        got, want = tree.intersect(Od, Dd, out=out), tree.intersect(Od, Dd)
        if not all(bool((a == b).all()) for a, b in zip(got[:2], want[:2])):
            raise RuntimeError(f"{spec}: out= gave other hits than a plain query")
        row = {
            "rays": n,
            "kernel_wall_us": wall_us(launch),
            "api_wall_us": wall_us(lambda: tree.intersect(Od, Dd)),
            "unchecked_wall_us": wall_us(lambda: tree.intersect(Od, Dd, check=False)),
            "out_wall_us": wall_us(lambda: tree.intersect(Od, Dd, out=out)),
        }
        if n == 1:
            calls = args.calls
            row.update(
                kernel_host_us=host_us(launch, sync, calls, warm),
                empty_host_us=host_us(lambda: cupy.empty(n, cupy.float32), sync, calls, warm),
                unchecked_host_us=host_us(lambda: tree.intersect(Od, Dd, check=False), sync,
                                          calls, warm),
                out_host_us=host_us(lambda: tree.intersect(Od, Dd, out=out, check=False), sync,
                                    calls, warm))
        for name in ("api", "unchecked", "out"):
            row[f"{name}_over_kernel"] = row["kernel_wall_us"] / row[f"{name}_wall_us"]
        record["sets"].append(row)
    return record


def markdown(result):
    lines = [f"# Single-call query overhead, {result['device']}", "",
             f"commit `{result['commit']}`, {result['date']}. `tree.intersect` on CuPy arrays; "
             "wall clock of one call plus a synchronization, median of "
             f"{result['repeats']} after {result['warmup']}; host = microseconds of host work per "
             f"call, {result['calls']} calls with nothing synchronized (one ray). Rate columns: "
             "kernel alone wall time / API wall time (1.0: the API adds nothing).", ""]
    lines += md_head("mesh", "rays", "kernel us", "API us", "unchecked us", "out= us",
                     "API/kernel", "unchecked/kernel", "out=/kernel", "host: launch",
                     "host: one empty", "host: API unchecked", "host: API out=")
    for rec in result["meshes"]:
        if "error" in rec:
            lines.append(md_row(rec["mesh"], rec["error"], *[""] * 11))
            continue
        for s in rec["sets"]:
            def f(key, spec=".1f"):
                return format(s[key], spec) if key in s else "-"
            lines.append(md_row(rec["mesh"], f"{s['rays']:,}", f("kernel_wall_us"),
                                f("api_wall_us"), f("unchecked_wall_us"), f("out_wall_us"),
                                f("api_over_kernel", ".2f"), f("unchecked_over_kernel", ".2f"),
                                f("out_over_kernel", ".2f"), f("kernel_host_us"),
                                f("empty_host_us"), f("unchecked_host_us"), f("out_host_us")))
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    pb, device, result = start_gpu_benchmark("bench_query_overhead.py", args.peers_dir)
    result.update(width=args.width, height=args.height, repeats=args.repeats,
                  warmup=args.warmup, calls=args.calls)
    return run_meshes(result, args.meshes, lambda spec: bench_mesh(spec, args, pb), markdown,
                      args.out, f"query_overhead_{gpu_slug(device)}")


if __name__ == "__main__":
    sys.exit(main())
