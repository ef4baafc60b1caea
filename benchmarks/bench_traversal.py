#!/usr/bin/env python3
"""Ray traversal benchmark: the GPU kd-tree beside NVIDIA Warp and Embree, same rays.

For each mesh, three ray sets of 1920 x 1080 rays each:

* primary: pinhole camera rays, ``peer_bench.make_primary_rays`` (row-major,
  coherent), closest hit;
* diffuse: cosine-distributed directions from surface points,
  ``peer_bench.make_diffuse_rays`` (seed 1234, incoherent), closest hit;
* shadow: from every primary hit point toward a point light above the scene
  (at the box centre in x and z, ``0.25 * diagonal`` above the box top in y),
  any hit. The direction is ``light - point`` unnormalized, with
  ``tmin = 1e-4`` and ``tmax = 1 - 1e-4`` (fractions of the distance to the
  light), so neither the surface the ray starts on nor the light counts.
  Only rays of pixels that hit something, so fewer than 1920 x 1080.

Our time: CUDA events around one query after ``--warmup`` runs, median of
``--repeats``; and, for the ratios, the wall-clock time with synchronization
that ``peer_bench`` uses for every peer (``peer_bench._timed``), so both sides
are measured alike. Peers (primary and diffuse, through
``peer_bench.WarpPeer`` and ``peer_bench.EmbreexPeer``): Warp ``wp.Mesh``
(GPU LBVH) with ``mesh_query_ray``, and embreex on all CPU cores. Neither has
an any-hit query in these versions, so shadow rays are ours only.

Per ray set also: nodes visited (interior and leaves) and triangles tested per
ray, from the counting kernel, next to the tree's SAH cost
(``tree.stats()["sah_cost"]``: expected cost of a ray through the root box,
without early termination) and the cost the counts give,
``K_T * nodes visited + K_I * tests`` (leaves counted as nodes).

Usage::

    PYTHONPATH=. python benchmarks/bench_traversal.py --peers-dir .peers --out benchmarks/results

Writes ``traversal_<gpu>.json`` and ``traversal_<gpu>.md`` under ``--out``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

from _common import (gpu_benchmark_parser, gpu_slug, gpu_time_ms, gpu_time_per_call_ms,
                     md_row, optix_table, run_meshes, start_gpu_benchmark)

DEFAULT_MESHES = ["stanford_bunny", "stanford_armadillo", "happy_buddha_100k", "conference",
                  "sponza_dabrovic"]
LIGHT_HEIGHT = 0.25  # light above the box top, in box diagonals
SHADOW_EPS = 1e-4  # tmin and 1 - tmax of shadow rays, fractions of the light distance


def parse_args(argv=None):
    parser = gpu_benchmark_parser(__doc__, DEFAULT_MESHES, repeats=10, warmup=2)
    parser.add_argument("--embree-repeats", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true", help="time our traversal only")
    parser.add_argument("--builder", choices=["gpu", "cpu"], default="gpu",
                        help="gpu: kdtree_gpu.build; cpu: cpu_reference.build (same tree)")
    return parser.parse_args(argv)


# --- rays ------------------------------------------------------------------------
def make_shadow_rays(vertices, origins, directions, t, tri):
    """Shadow rays from the primary hit points toward a light above the scene.

    Parameters
    ----------
    vertices : (num_vertices, 3) float32
    origins, directions : (num_primary, 3) float32
    t : (num_primary,) float32
    tri : (num_primary,) int32

    Returns
    -------
    shadow_origins, shadow_directions : (num_hits, 3) float32
    shadow_tmin, shadow_tmax : (num_hits,) float32
    light : (3,) float64
    """
    lo, hi = vertices.min(0).astype(np.float64), vertices.max(0).astype(np.float64)
    diag = float(np.linalg.norm(hi - lo))
    light = np.array([0.5 * (lo[0] + hi[0]), hi[1] + LIGHT_HEIGHT * diag, 0.5 * (lo[2] + hi[2])])
    hit = tri >= 0
    points = origins[hit].astype(np.float64) + t[hit, None].astype(np.float64) * directions[hit]
    n = points.shape[0]
    return (points.astype(np.float32), (light - points).astype(np.float32),
            np.full(n, SHADOW_EPS, np.float32), np.full(n, 1.0 - SHADOW_EPS, np.float32), light)


# --- timing ----------------------------------------------------------------------
time_gpu = gpu_time_ms  # median ms between CUDA events, after warm-up
time_queued = gpu_time_per_call_ms  # median ms per call of calls queued back to back
STREAM_CALLS = 20


def time_wall(pb, fn, repeats, warmup):
    """Median seconds of ``fn()`` measured as peer_bench measures every peer."""
    import cupy

    sync = cupy.cuda.get_current_stream().synchronize
    median, _, _ = pb._timed(fn, sync, repeats, warmup)
    return median


def measure_ours(tree, rays, any_hit, args, pb):
    """Mrays/s through the public API and of the kernel alone, and per-ray work counts.

    ``rays`` is ``(origins, directions, tmin, tmax)`` as CuPy arrays and
    numbers. The public API is what README shows: ``tree.intersect`` (or
    ``tree.occluded``) on CuPy arrays,

    * one call at a time, ``check=True`` (the default: one small read after
      the launch) and ``check=False``, each call synchronized: wall clock as
      peer_bench times every peer;
    * queued: ``STREAM_CALLS`` unchecked calls back to back between two CUDA
      events (as a renderer issues its queries);

    the kernel alone is the traversal launch with every argument made in
    advance, queued the same way (GPU time, no host latency in front of it).
    """
    from kdtree_gpu.trace import gpu as rg

    O, D, tmin, tmax = rays
    query = tree.occluded if any_hit else tree.intersect
    n = O.shape[0]
    launch, _ = rg.prepared_launch(tree, O, D, tmin, tmax, any_hit=any_hit)
    kernel_ms, kernel_all = time_queued(launch, STREAM_CALLS, args.repeats, args.warmup)
    queued_ms, _ = time_queued(lambda: query(O, D, tmin, tmax, check=False), STREAM_CALLS,
                               args.repeats, args.warmup)
    api_s = time_wall(pb, lambda: query(O, D, tmin, tmax), args.repeats, args.warmup)
    unchecked_s = time_wall(pb, lambda: query(O, D, tmin, tmax, check=False), args.repeats,
                            args.warmup)
    kernel_wall_s = time_wall(pb, launch, args.repeats, args.warmup)
    counted = rg.trace(tree, O, D, tmin, tmax, any_hit=any_hit, counted=True)
    ray_nodes, ray_tests = counted.ray_nodes.get(), counted.ray_tests.get()
    hit = counted.hit_any if any_hit else counted.hit_tri >= 0
    return {
        "rays": int(n), "kernel_ms_median": kernel_ms, "kernel_ms_all": kernel_all,
        "kernel_mrays_per_s": n / kernel_ms / 1e3,
        "kernel_wall_s_median": kernel_wall_s, "kernel_mrays_per_s_wall": n / kernel_wall_s / 1e6,
        "queued_ms_median": queued_ms, "queued_mrays_per_s": n / queued_ms / 1e3,
        "api_wall_s_median": api_s, "mrays_per_s_wall": n / api_s / 1e6,
        "unchecked_wall_s_median": unchecked_s, "unchecked_mrays_per_s_wall": n / unchecked_s / 1e6,
        "queued_over_kernel": kernel_ms / queued_ms,
        "single_over_kernel": kernel_ms / 1e3 / api_s,
        "nodes_per_ray": float(ray_nodes.mean()), "tests_per_ray": float(ray_tests.mean()),
        "max_nodes": int(ray_nodes.max()), "max_tests": int(ray_tests.max()),
        "hit_fraction": float(np.mean(hit.get())),
    }


def measure_peer(peer, pb, V, F, raysets, reps, warmup):
    """Build ``peer``'s structure and time its closest-hit casts on each ray set."""
    ok, why = peer.available()
    if not ok:
        return {"skipped": why}
    record = {"info": peer.info()}
    if isinstance(peer, pb.WarpPeer):
        peer.upload_mesh(V, F)
        peer.sync()
    build_s, _, handle = pb._timed(lambda: peer.build(V, F), peer.sync, reps, warmup)
    record["build_s_median"] = build_s
    for name, (O, D) in raysets.items():
        rays = peer.prepare(O, D)
        peer.sync()
        cast_s, _, res = pb._timed(lambda: peer.cast(handle, rays), peer.sync, reps, warmup)
        t, ids = peer.fetch(res)
        record[name] = {"rays": int(len(O)), "cast_s_median": cast_s,
                        "mrays_per_s": len(O) / cast_s / 1e6, "t": t, "id": ids}
        res = rays = None
    return record


# --- one mesh -----------------------------------------------------------------------
def build_tree(V, F, builder):
    if builder == "cpu":
        from cpu_reference import build

        return build(V, F)
    import kdtree_gpu as kd

    import cupy

    return kd.build(cupy.asarray(V), cupy.asarray(F))


def bench_mesh(name, args, pb):
    import cupy

    mesh_name, V, F = pb.load_mesh(str(Path(args.mesh_dir) / f"{name}.ply"))
    t0 = time.perf_counter()
    tree = build_tree(V, F, args.builder)
    build_s = time.perf_counter() - t0
    stats = tree.stats()
    cfg = tree.config
    record = {"mesh": mesh_name, "triangles": int(len(F)), "builder": args.builder,
              "build_s": build_s, "tree": stats}

    O, D = pb.make_primary_rays(V, args.width, args.height)
    O2, D2 = pb.make_diffuse_rays(V, F, args.width * args.height, seed=1234)
    primary = (cupy.asarray(O), cupy.asarray(D), 0.0, np.inf)
    diffuse = (cupy.asarray(O2), cupy.asarray(D2), 0.0, np.inf)
    t_primary, tri_primary, _, _ = (x.get() for x in tree.intersect(*primary))
    t_diffuse, tri_diffuse, _, _ = (x.get() for x in tree.intersect(*diffuse))
    SO, SD, smin, smax, light = make_shadow_rays(V, O, D, t_primary, tri_primary)
    shadow = (cupy.asarray(SO), cupy.asarray(SD), float(smin[0]), float(smax[0]))
    record["light"] = light.tolist()

    ours = {"primary": measure_ours(tree, primary, False, args, pb),
            "diffuse": measure_ours(tree, diffuse, False, args, pb),
            "shadow": measure_ours(tree, shadow, True, args, pb)}
    for r in ours.values():
        # K_T per node visited (leaves too) and K_I per test: the SAH cost's terms
        r["measured_cost"] = cfg.k_traversal * r["nodes_per_ray"] + cfg.k_intersect * r["tests_per_ray"]
    record["ours"] = ours
    del primary, diffuse, shadow

    if not args.no_peers:
        our_hits = {"primary": {"idx": None, "t": t_primary, "id": tri_primary},
                    "diffuse": {"idx": None, "t": t_diffuse, "id": tri_diffuse}}
        raysets = {"primary": (O, D), "diffuse": (O2, D2)}
        diag = float(np.linalg.norm(V.max(0) - V.min(0)))
        peers = {"warp": pb.WarpPeer("lbvh", "cuda:0", "cubin"),
                 "embree": pb.EmbreexPeer(os.cpu_count() or 1)}
        record["peers"] = {}
        for key, peer in peers.items():
            reps = args.repeats if key == "warp" else args.embree_repeats
            try:
                res = measure_peer(peer, pb, V, F, raysets, reps, 1)
            except Exception as exc:  # a peer failing must not lose our numbers
                res = {"error": f"{type(exc).__name__}: {exc}"}
            for rs in raysets:
                if rs in res:
                    peer_hits = {"idx": None, "t": res[rs].pop("t"), "id": res[rs].pop("id")}
                    res[rs]["vs_ours"] = pb.compare(peer_hits, our_hits[rs], diag, 1e-4)
                    res[rs]["ratio_ours_over_peer"] = (ours[rs]["mrays_per_s_wall"]
                                                       / res[rs]["mrays_per_s"])
            record["peers"][key] = res
    return record


# --- report --------------------------------------------------------------------------
def markdown_table(result):
    optix = result.get("optix", {})
    lines = [f"# GPU kd-tree traversal, {result['device']}",
             "",
             f"commit `{result['commit']}`, {result['date']}, {result['width']}x{result['height']} "
             "rays per set (peer_bench rays), Mrays/s. Ours through the public API, "
             "`tree.intersect` / `tree.occluded` on CuPy arrays: *queued* = "
             f"{STREAM_CALLS} unchecked calls back to back between CUDA events (GPU time per "
             "call, as a renderer issues queries); *single* = one call with `check=True`, "
             "synchronized, wall clock as peer_bench times every peer (unchecked in "
             "parentheses). Kernel alone: the traversal launch with its arguments made in "
             "advance, queued the same way. Warp = wp.Mesh LBVH + mesh_query_ray, same run, "
             "wall clock; Embree = embreex on all CPU cores, same run; OptiX 9.0 on the same "
             "H200 model (software traversal; h200_optix.md: one optixLaunch per ray set, CUDA "
             "events). Shadow rays: any hit, ours only.",
             "",
             "| mesh | rays | API queued | kernel alone | queued/kernel | API single (unchecked) "
             "| single/kernel | OptiX | queued/OptiX | single/OptiX | Warp | Embree | nodes/ray "
             "| tris/ray |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def fmt(x, spec=",.0f"):
        return "-" if x is None else format(x, spec)

    for r in result["meshes"]:
        if "error" in r:
            lines.append(f"| {r['mesh']} | ERROR: {r['error']} |")
            continue
        for rs, ours in r["ours"].items():
            warp = r.get("peers", {}).get("warp", {}).get(rs, {}).get("mrays_per_s")
            embree = r.get("peers", {}).get("embree", {}).get(rs, {}).get("mrays_per_s")
            o = optix.get(r["mesh"], {}).get(f"{rs}_mrays") if rs != "shadow" else None
            queued, single = ours["queued_mrays_per_s"], ours["mrays_per_s_wall"]
            lines.append(md_row(
                r["mesh"], f"{rs} ({ours['rays']:,})", f"{queued:,.0f}",
                f"{ours['kernel_mrays_per_s']:,.0f}", f"{ours['queued_over_kernel']:.2f}",
                f"{single:,.0f} ({ours['unchecked_mrays_per_s_wall']:,.0f})",
                f"{ours['single_over_kernel']:.2f}", fmt(o), fmt(queued / o if o else None, ".2f"),
                fmt(single / o if o else None, ".2f"), fmt(warp), fmt(embree),
                f"{ours['nodes_per_ray']:.1f}", f"{ours['tests_per_ray']:.1f}"))
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    pb, device, result = start_gpu_benchmark("bench_traversal.py", args.peers_dir)
    result.update(optix=optix_table(args.peers_dir), width=args.width, height=args.height,
                  repeats=args.repeats, warmup=args.warmup, light_height_diagonals=LIGHT_HEIGHT,
                  shadow_eps=SHADOW_EPS, cpu_count=os.cpu_count())
    return run_meshes(result, args.meshes, lambda name: bench_mesh(name, args, pb),
                      markdown_table, args.out, f"traversal_{gpu_slug(device)}")

if __name__ == "__main__":
    sys.exit(main())
