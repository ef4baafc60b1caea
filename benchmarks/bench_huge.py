#!/usr/bin/env python3
"""One very large build on one GPU: time, peak memory, tree check, hits against brute force.

The mesh is a real mesh subdivided (``--mesh stanford_armadillo@sub4``: 4-to-1
midpoint subdivision four times, 88.6M triangles). In one process:

1. a build of a tiny mesh (kernels compiled), then ``kd.build(V, F)`` on
   the host arrays, timed with CUDA events (upload and validation
   included), and the same on CuPy arrays already on the device;
2. ``build_info["peak_device_bytes"]``, CuPy's pool and ``cudaMemGetInfo``
   after the build;
3. ``tree.check()`` (the structural checks on the host);
4. ``--rays`` random rays (:func:`kdtree_gpu.testing.rays.random_rays`):
   ``tree.intersect`` against ``kd.intersect_brute`` (every triangle,
   on the GPU), compared with :func:`kdtree_gpu.testing.rays.compare_hits`.

Writes ``build_huge_<gpu>.json`` and ``.md`` under ``--out``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from _common import gpu_benchmark_parser, gpu_slug, gpu_time_ms, start_gpu_benchmark


def main():
    parser = gpu_benchmark_parser(__doc__, ["stanford_armadillo@sub4"], repeats=3)
    parser.add_argument("--rays", type=int, default=100_000)
    parser.add_argument("--no-check", action="store_true",
                        help="skip tree.check() (minutes on the host at this size)")
    args = parser.parse_args()
    import cupy
    import numpy as np

    import kdtree_gpu as kd
    from bench_build import load
    from kdtree_gpu.testing.rays import compare_hits, random_rays
    from kdtree_gpu.trace import intersect_brute

    _, device, result = start_gpu_benchmark(__file__, args.peers_dir)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"build_huge_{gpu_slug(device)}"

    def log(message):
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    def save():
        (out / f"{stem}.json").write_text(json.dumps(result, indent=1))

    spec = args.meshes[0]
    t = time.perf_counter()
    V, F = load(spec, args.mesh_dir)
    result.update(mesh=spec, triangles=int(F.shape[0]), vertices=int(V.shape[0]),
                  load_s=time.perf_counter() - t)
    log(f"{spec}: {F.shape[0]:,} triangles, loaded in {result['load_s']:.1f} s")
    kd.build(V[:3], np.array([[0, 1, 2]], np.int32), device="cuda")
    pool = cupy.get_default_memory_pool()
    free0 = cupy.cuda.runtime.memGetInfo()[0]
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    tree = kd.build(V, F, device="cuda")
    end.record()
    end.synchronize()
    n = result["triangles"]
    info = tree.build_info
    result.update(
        build_host_arrays_ms=cupy.cuda.get_elapsed_time(start, end),
        peak_device_bytes=int(info["peak_device_bytes"]),
        pool_after_bytes=int(pool.total_bytes()),
        device_after_bytes=int(free0 - cupy.cuda.runtime.memGetInfo()[0]),
        levels=info["levels"], stage_levels=len(info["stage_levels"]),
        loop_launches=info["loop_launches"], nodes=int(tree.num_nodes),
        refs=int(tree.num_refs))
    log(f"build {result['build_host_arrays_ms']:.0f} ms, peak "
        f"{result['peak_device_bytes'] / n:.0f} B/tri, nodes {tree.num_nodes:,}")
    save()
    device_mesh = (cupy.asarray(V), cupy.asarray(F))
    del tree
    ms, times = gpu_time_ms(lambda: kd.build(*device_mesh), args.repeats, 0)
    result.update(build_device_arrays_ms=ms, build_device_arrays_ms_all=times)
    log(f"build on device arrays {ms:.0f} ms")
    device_mesh = None
    tree = kd.build(V, F, device="cuda")
    save()
    t = time.perf_counter()
    try:
        if args.no_check:
            problem = "not run"
        else:
            tree.check()
            problem = "ok"
    except ValueError as exc:
        problem = f"FAILED: {exc}"
    result.update(check_s=time.perf_counter() - t, check=problem)
    log(f"tree.check(): {result['check']} ({result['check_s']:.1f} s)")
    save()
    rays = random_rays(tree.bounds, args.rays, seed=1)
    o, d = cupy.asarray(rays.origins), cupy.asarray(rays.directions)
    got = tree.intersect(o, d)
    cupy.cuda.Device().synchronize()
    t = time.perf_counter()
    want = intersect_brute(tree, o, d)
    cupy.cuda.Device().synchronize()
    comparison = compare_hits(got, want)
    described = comparison.describe() or (f"all {args.rays:,} rays agree "
                                          f"({comparison.num_hits:,} hits)")
    result.update(rays=args.rays, brute_s=time.perf_counter() - t,
                  hits=comparison.num_hits, agree=comparison.ok, comparison=described)
    log(f"{args.rays:,} rays vs brute force: {described}")
    save()
    lines = [f"# A {n / 1e6:.1f}M-triangle build on {device}", "",
             f"commit `{result['commit']}`, {result['date']}. Mesh `{spec}` ({n:,} triangles, "
             "4-to-1 midpoint subdivision of a real mesh). One process: kernels compiled on a "
             "tiny mesh first; CUDA events around `kd.build`.", "",
             "| quantity | value |", "|---|---:|",
             f"| build, host arrays (upload + validation included) | "
             f"{result['build_host_arrays_ms']:,.0f} ms |",
             f"| build, CuPy arrays (median of {args.repeats}) | {ms:,.0f} ms |",
             f"| peak device memory (build_info) | {result['peak_device_bytes'] / 2**30:.1f} GiB"
             f" = {result['peak_device_bytes'] / n:,.0f} B/triangle |",
             f"| CuPy pool after the build | {result['pool_after_bytes'] / n:,.0f} B/triangle |",
             f"| device memory after (cudaMemGetInfo drop) | "
             f"{result['device_after_bytes'] / n:,.0f} B/triangle |",
             f"| levels (by stages / loop launches) | {result['levels']} "
             f"({result['stage_levels']} / {result['loop_launches']}) |",
             f"| nodes, leaf entries | {result['nodes']:,}, {result['refs']:,} |",
             f"| tree.check() | {result['check']} ({result['check_s']:.0f} s) |",
             f"| {args.rays:,} random rays, closest hit vs brute force on the GPU | "
             f"{'agree' if comparison.ok else 'DISAGREE'}: {described} |", ""]
    (out / f"{stem}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if comparison.ok and result["check"] in ("ok", "not run") else 1


if __name__ == "__main__":
    sys.exit(main())
