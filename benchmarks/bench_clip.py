#!/usr/bin/env python3
"""Perfect splits: clip off against clip on, per mesh, on one GPU.

For each mesh and each setting (``SAHConfig()`` and ``SAHConfig(clip=True)``):

* GPU build as a user calls it, ``kd.build(V, F, config, kernels=...)`` on
  CuPy arrays (``--kernels``, default the CUDA drivers, ``"fused"``):
  CUDA events around the call, median of ``--repeats`` after ``--warmup``;
  the first call of the process (compilation included) separately;
* the CPU reference, ``cpu_reference.build`` on every core of the machine
  (wall clock, median of ``--cpu-repeats`` after one warm-up);
* whether the two trees are identical node by node (``KdTree.compare``);
* the tree: nodes, references per triangle, SAH cost (``tree.stats()``);
* rays through the public API on the GPU tree, 1920 x 1080 primary and
  diffuse rays of ``peer_bench`` (the same rays for both settings):
  ``tree.intersect`` queued (unchecked calls back to back between CUDA
  events) and single synchronized calls with the default check, as
  ``bench_traversal.py`` measures them, with nodes and triangles per ray.

Usage::

    PYTHONPATH=. python benchmarks/bench_clip.py --peers-dir .peers --out benchmarks/results

Writes ``clip_<gpu>.json`` and ``clip_<gpu>.md``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from _common import (gpu_benchmark_parser, gpu_slug, gpu_time_ms, md_head, md_row,
                     run_meshes, start_gpu_benchmark)

DEFAULT_MESHES = ["suzanne", "stanford_bunny", "happy_buddha_100k", "lucy_100k",
                  "stanford_dragon_res2", "stanford_armadillo", "sponza_dabrovic", "conference"]


def parse_args(argv=None):
    p = gpu_benchmark_parser(__doc__, DEFAULT_MESHES, repeats=5, warmup=2, mesh_dir="")
    p.add_argument("--cpu-repeats", type=int, default=3)
    p.add_argument("--no-rays", action="store_true", help="builds only")
    p.add_argument("--kernels", default="fused", choices=["fused", "stages", "xp"],
                   help="the GPU builder for both settings (kd.build's kernels)")
    return p.parse_args(argv)


def bench_setting(V, F, cfg, rays, args, pb):
    import cupy

    import cpu_reference
    import kdtree_gpu as kd
    from bench_traversal import measure_ours

    Vd, Fd = cupy.asarray(V), cupy.asarray(F)
    cupy.cuda.get_current_stream().synchronize()
    t0 = time.perf_counter()
    tree = kd.build(Vd, Fd, cfg, kernels=args.kernels)
    cupy.cuda.get_current_stream().synchronize()
    first_s = time.perf_counter() - t0
    gpu_ms, gpu_all = gpu_time_ms(lambda: kd.build(Vd, Fd, cfg, kernels=args.kernels),
                                  args.repeats, args.warmup)
    cpu_reference.build(V, F, cfg)  # warm-up (numba cache)
    cpu_s = []
    for _ in range(args.cpu_repeats):
        t0 = time.perf_counter()
        ref = cpu_reference.build(V, F, cfg)
        cpu_s.append(time.perf_counter() - t0)
    difference = ref.compare(tree)
    stats = tree.stats()
    record = {"clip": cfg.clip, "gpu_build_ms": gpu_ms, "gpu_build_ms_all": gpu_all,
              "first_build_s": first_s, "cpu_reference_s": statistics.median(cpu_s),
              "cpu_reference_s_all": cpu_s, "identical": difference is None,
              "difference": difference, "levels": tree.build_info.get("levels"),
              "level_loop": tree.build_info.get("level_loop"),
              "nodes": int(stats["nodes"]), "refs_per_tri": float(stats["refs_per_tri"]),
              "sah_cost": float(stats["sah_cost"])}
    if rays is not None:
        record["rays"] = {name: measure_ours(tree, r, False, args, pb) for name, r in rays.items()}
    return record


def bench_mesh(name, args, pb):
    import cupy

    from kdtree_gpu import SAHConfig

    mesh_name, V, F = pb.load_mesh(str(Path(args.mesh_dir) / f"{name}.ply"))
    rays = None
    if not args.no_rays:
        O, D = pb.make_primary_rays(V, args.width, args.height)
        O2, D2 = pb.make_diffuse_rays(V, F, args.width * args.height, seed=1234)
        rays = {"primary": (cupy.asarray(O), cupy.asarray(D), 0.0, np.inf),
                "diffuse": (cupy.asarray(O2), cupy.asarray(D2), 0.0, np.inf)}
    record = {"mesh": mesh_name, "triangles": int(len(F))}
    for cfg in (SAHConfig(), SAHConfig(clip=True)):
        record["clip" if cfg.clip else "plain"] = bench_setting(V, F, cfg, rays, args, pb)
    plain, clip = record["plain"], record["clip"]
    record["gpu_clip_over_plain"] = clip["gpu_build_ms"] / plain["gpu_build_ms"]
    record["cpu_clip_over_gpu_clip"] = clip["cpu_reference_s"] * 1e3 / clip["gpu_build_ms"]
    return record


def markdown_table(result):
    lines = [f"# Perfect splits (clip=True) against plain splits, {result['device']}",
             "",
             f"commit `{result['commit']}`, {result['date']}. GPU build: `kd.build(..., "
             f"kernels='{result['kernels']}')` on CuPy arrays, CUDA events, median of {result['repeats']} after {result['warmup']} "
             "warm-up calls; CPU reference: `cpu_reference.build` on "
             f"{result['cpu_count']} cores, wall clock, median. Rays: {result['width']}x"
             f"{result['height']} peer_bench primary and diffuse rays (the same for both "
             "settings), `tree.intersect` on CuPy arrays, Grays/s queued (unchecked calls "
             "back to back between CUDA events) and single (one synchronized checked call). "
             "Bars: clipped GPU build <= 2x the plain one; >= 20x faster than the clipped "
             "CPU reference.",
             "",
             *md_head("mesh", "tris", "clip", "GPU build ms", "CPU ref ms", "identical",
                      "nodes", "refs/tri", "SAH cost", "primary queued", "primary single",
                      "diffuse queued", "diffuse single", "nodes/ray (diffuse)",
                      "tris/ray (diffuse)", left=("mesh", "clip", "identical"))]
    summary = ["", *md_head("mesh", "GPU clip / GPU plain (<= 2)", "CPU clip / GPU clip (>= 20)",
                            "SAH clip / plain", "primary queued clip / plain",
                            "diffuse queued clip / plain")]
    for r in result["meshes"]:
        if "error" in r:
            lines.append(f"| {r['mesh']} | ERROR: {r['error']} |")
            continue
        for key in ("plain", "clip"):
            s = r[key]
            rays = s.get("rays", {})

            def grays(name, field):
                return f"{rays[name][field] / 1e3:.2f}" if name in rays else "-"

            lines.append(md_row(
                r["mesh"], f"{r['triangles']:,}", "on" if s["clip"] else "off",
                f"{s['gpu_build_ms']:.2f}", f"{1e3 * s['cpu_reference_s']:.1f}",
                "yes" if s["identical"] else "NO", f"{s['nodes']:,}", f"{s['refs_per_tri']:.2f}",
                f"{s['sah_cost']:.2f}", grays("primary", "queued_mrays_per_s"),
                grays("primary", "mrays_per_s_wall"), grays("diffuse", "queued_mrays_per_s"),
                grays("diffuse", "mrays_per_s_wall"),
                f"{rays['diffuse']['nodes_per_ray']:.1f}" if rays else "-",
                f"{rays['diffuse']['tests_per_ray']:.1f}" if rays else "-"))
        p, c = r["plain"], r["clip"]

        def ratio(name):
            if name not in c.get("rays", {}):
                return "-"
            return f"{c['rays'][name]['queued_mrays_per_s'] / p['rays'][name]['queued_mrays_per_s']:.2f}"

        summary.append(md_row(r["mesh"], f"{r['gpu_clip_over_plain']:.2f}",
                              f"{r['cpu_clip_over_gpu_clip']:.1f}",
                              f"{c['sah_cost'] / p['sah_cost']:.3f}", ratio("primary"),
                              ratio("diffuse")))
    return "\n".join(lines + summary) + "\n"


def main(argv=None):
    args = parse_args(argv)
    pb, device, result = start_gpu_benchmark("bench_clip.py", args.peers_dir)
    result.update(repeats=args.repeats, warmup=args.warmup, width=args.width, height=args.height,
                  cpu_count=os.cpu_count(), kernels=args.kernels)
    return run_meshes(result, args.meshes, lambda name: bench_mesh(name, args, pb),
                      markdown_table, args.out, f"clip_{gpu_slug(device)}")


if __name__ == "__main__":
    sys.exit(main())
