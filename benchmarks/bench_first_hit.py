#!/usr/bin/env python3
"""Time to first hit: ``kd.build`` then the first ``tree.intersect`` of a new tree.

What a user does (README): ``tree = kd.build(V, F)`` on CuPy arrays, then
``t, tri, u, v = tree.intersect(origins, directions)`` with 1920 x 1080
primary rays (``peer_bench.make_primary_rays``, the rays of every peer), and
waits for the result. For each mesh, each repeat builds a fresh tree:

* ``build``: wall clock of ``kd.build(V, F)`` (mesh already on the GPU),
  device synchronized before and after;
* ``first query``: wall clock of the first ``tree.intersect`` on that tree,
  synchronized (``check=True``, the default: one small read names bad rays);
* ``time to first hit``: both, back to back;
* ``later query``: the same call again on the same tree, right after the
  first (the first query must cost at most 1.2x a later one: nothing is
  packed or uploaded then);
* ``later after a build``: the same call on the same tree once more, right
  after ``kd.build`` made (and dropped) another tree: the host conditions of
  the first query (right after a build) without its being the tree's first.
  Any host call right after a millisecond of other work runs slower than
  the same call repeated: measured on an H100 machine, an unchecked query's
  host time was 0.024 ms repeated back to back and 0.10-0.18 ms after 2 ms
  of Python or a 5 ms sleep, on an old tree; a one-element CuPy ``fill``
  0.017 ms repeated and 0.055 ms right after a build. ``first / later after
  a build`` compares like with like: what the first query pays for being
  the first;
* ``unchecked``: ``check=False`` time to first hit (nothing waits for the GPU
  until the caller does);
* ``memory``: CuPy's pool ``total_bytes()`` right after the build, in a
  fresh process (one subprocess per mesh), per triangle.

Median of ``--repeats`` after a warm-up (kernels compiled, pool warm); the
kernel alone (the traversal launch on prepared arrays, CUDA events) beside
it (the launch with its arguments made in advance, 20 queued back to back
between CUDA events). OptiX: build (PREFER_FAST_TRACE) + compaction + the same primary rays on
the same H200 (``peers/results/h200_optix.md``).

Usage::

    PYTHONPATH=. python benchmarks/bench_first_hit.py --peers-dir .peers --out benchmarks/results

Writes ``first_hit_<gpu>.json`` and ``first_hit_<gpu>.md``.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import (gpu_benchmark_parser, gpu_slug, gpu_time_per_call_ms, md_head, md_row,
                     optix_table, run_meshes, start_gpu_benchmark)

DEFAULT_MESHES = ["stanford_bunny", "conference", "stanford_armadillo@sub1",
                  "stanford_armadillo@sub2"]
# Bars of the ray-API work, ms (time to first hit with today's builder).
BARS_MS = {"stanford_bunny": 8.0, "conference": 16.0, "stanford_armadillo@sub1": 60.0}


def parse_args(argv=None):
    parser = gpu_benchmark_parser(__doc__, DEFAULT_MESHES, repeats=7)
    parser.add_argument("--memory-only", metavar="MESH",
                        help="(internal) print the pool bytes after one build of MESH")
    return parser.parse_args(argv)


def load(pb, mesh_dir, spec):
    name, _, sub = spec.partition("@sub")
    path = str(Path(mesh_dir) / f"{name}.ply") + (f"@sub{sub}" if sub else "")
    return pb.load_mesh(path)


def wall_ms(fn, sync):
    sync()
    start = time.perf_counter()
    result = fn()
    sync()
    return 1e3 * (time.perf_counter() - start), result


def memory_in_fresh_process(args, spec):
    cmd = [sys.executable, __file__, "--memory-only", spec, "--mesh-dir", args.mesh_dir,
           "--peers-dir", args.peers_dir]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or ["failed"]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def memory_only(args):
    import cupy

    import kdtree_gpu as kd

    pb = importlib.import_module("peer_bench")
    _, V, F = load(pb, args.mesh_dir, args.memory_only)
    Vd, Fd = cupy.asarray(V), cupy.asarray(F)
    pool = cupy.get_default_memory_pool()
    mesh_bytes = pool.total_bytes()
    tree = kd.build(Vd, Fd)
    cupy.cuda.get_current_stream().synchronize()
    total = pool.total_bytes()
    print(json.dumps({"pool_total_bytes": int(total), "mesh_bytes": int(mesh_bytes),
                      "peak_device_bytes": tree.build_info.get("peak_device_bytes"),
                      "bytes_per_triangle": total / len(F)}))
    return 0


def bench_mesh(spec, args, pb, optix):
    import cupy

    import kdtree_gpu as kd
    from kdtree_gpu.trace import gpu as rg

    sync = cupy.cuda.get_current_stream().synchronize
    name, V, F = load(pb, args.mesh_dir, spec)
    O, D = pb.make_primary_rays(V, args.width, args.height)
    Vd, Fd, Od, Dd = (cupy.asarray(a) for a in (V, F, O, D))
    n = len(O)
    # warm-up: compiles, loads modules, fills the pool
    tree = kd.build(Vd, Fd)
    tree.intersect(Od, Dd)
    rows = {"build": [], "first": [], "later": [], "later_after_build": [], "sum": [],
            "unchecked_sum": []}
    for _ in range(args.repeats):
        tree = None
        build_ms, tree = wall_ms(lambda: kd.build(Vd, Fd), sync)
        first_ms, hits = wall_ms(lambda: tree.intersect(Od, Dd), sync)
        later_ms, _ = wall_ms(lambda: tree.intersect(Od, Dd), sync)
        rows["build"].append(build_ms)
        rows["first"].append(first_ms)
        rows["later"].append(later_ms)
        rows["sum"].append(build_ms + first_ms)
        other = kd.build(Vd, Fd)  # another tree, dropped: the first query's host conditions
        del other
        sync()
        rows["later_after_build"].append(wall_ms(lambda: tree.intersect(Od, Dd), sync)[0])
        tree = None
        sync()
        start = time.perf_counter()
        tree = kd.build(Vd, Fd)
        unchecked = tree.intersect(Od, Dd, check=False)
        sync()
        rows["unchecked_sum"].append(1e3 * (time.perf_counter() - start))
    launch, _ = rg.prepared_launch(tree, Od, Dd)
    kernel_ms, _ = gpu_time_per_call_ms(launch, 20, 7, 2)
    hit_fraction = float((hits[1] >= 0).mean())
    assert bool((unchecked[1] == hits[1]).all()), "check=False changed the hits"
    med = {k: statistics.median(v) for k, v in rows.items()}
    record = {"mesh": name, "spec": spec, "triangles": int(len(F)), "rays": n,
              "hit_fraction": hit_fraction, "ms": med, "ms_all": rows,
              "kernel_ms": kernel_ms, "first_over_later": med["first"] / med["later"],
              "first_over_later_after_build": med["first"] / med["later_after_build"],
              "nodes": tree.num_nodes, "refs": tree.num_refs}
    key = name if name in optix else spec
    if key in optix:
        o = optix[key]
        o_trace = n / (o["primary_mrays"] * 1e6) * 1e3
        record["optix"] = {**o, "trace_ms": o_trace,
                           "first_hit_ms": o["build_ms"] + o["compact_ms"] + o_trace}
    if spec in BARS_MS:
        record["bar_ms"] = BARS_MS[spec]
    record["memory"] = memory_in_fresh_process(args, spec)
    return record


def markdown(result):
    lines = [f"# Time to first hit, {result['device']}", "",
             f"commit `{result['commit']}`, {result['date']}; `kd.build(V, F)` on CuPy arrays, "
             f"then `tree.intersect(O, D)` of {result['width']}x{result['height']} primary rays "
             "(peer_bench rays), synchronized; wall clock, median of "
             f"{result['repeats']} fresh trees after a warm-up. Kernel alone: the traversal "
             "launch on prepared arrays, CUDA events. Memory: CuPy pool total bytes right after "
             "the build in a fresh process. Later after a build: the same tree's query right "
             "after another `kd.build` (the first query's host conditions). OptiX: "
             "PREFER_FAST_TRACE build + compaction + the same rays, same H200 (h200_optix.md).",
             "",
             *md_head("mesh", "triangles", "kd.build ms", "first intersect ms",
                      "time to first hit ms", "bar ms", "unchecked ms", "later intersect ms",
                      "first/later", "later after a build ms", "first/later after a build",
                      "kernel alone ms", "OptiX ms", "ours/OptiX", "pool B/tri")]
    for r in result["meshes"]:
        if "error" in r:
            lines.append(f"| {r['spec']} | ERROR {r['error']} |")
            continue
        m = r["ms"]
        optix = r.get("optix", {}).get("first_hit_ms")
        ratio = "-" if optix is None else f"{m['sum'] / optix:.1f}x"
        optix_ms = "-" if optix is None else f"{optix:.2f}"
        mem = r["memory"].get("bytes_per_triangle")
        mem = "-" if mem is None else f"{mem:,.0f}"
        lines.append(md_row(r["mesh"], f"{r['triangles']:,}", f"{m['build']:.2f}",
                            f"{m['first']:.2f}", f"{m['sum']:.2f}", r.get("bar_ms", "-"),
                            f"{m['unchecked_sum']:.2f}", f"{m['later']:.2f}",
                            f"{r['first_over_later']:.2f}", f"{m['later_after_build']:.2f}",
                            f"{r['first_over_later_after_build']:.2f}", f"{r['kernel_ms']:.3f}",
                            optix_ms,
                            ratio, mem))
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    if args.memory_only:
        sys.path.insert(0, str(Path(args.peers_dir).resolve()))
        return memory_only(args)
    pb, device, result = start_gpu_benchmark("bench_first_hit.py", args.peers_dir)
    optix = optix_table(args.peers_dir)
    result.update(width=args.width, height=args.height, repeats=args.repeats)
    return run_meshes(result, args.meshes, lambda spec: bench_mesh(spec, args, pb, optix),
                      markdown, args.out, f"first_hit_{gpu_slug(device)}")

if __name__ == "__main__":
    sys.exit(main())
