#!/usr/bin/env python3
"""Device memory of a GPU build: the peak, and what the process holds afterwards.

For each mesh, in a fresh process (kernels compiled on a tiny mesh first,
every pool emptied): ``tree = kd.build(V, F)`` on host arrays, as README
shows it, then

* ``peak``: ``build_info["peak_device_bytes"]``, the most device memory the
  build held at once (its workspace pool and the growth of CuPy's pool,
  mesh and tree included);
* ``pool after``: CuPy's default pool ``total_bytes()`` right after the build
  (what the process keeps), and the workspace pool's bytes (0 when the
  build gave its temporaries back);
* ``device after``: the drop of ``cudaMemGetInfo``'s free bytes over the
  build (the process's whole footprint, pools included);
* ``result``: the tree's arrays, its traversal layout and the mesh;
* warm build time (CUDA events around ``kd.build``, median of repeats, the
  same process, after the memory numbers were taken).

``--baseline-root DIR`` runs the same measurement with the package found in
``DIR`` (an earlier commit's tree) in the same run, for a before/after table.
OptiX's compacted BVH size (``h200_optix.md``, GAS MB) is given for scale.

Writes ``build_memory_<gpu>.json`` and ``.md`` under ``--out``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _common import (ROOT, gpu_benchmark_parser, gpu_slug, md_head, md_row, optix_table,
                     run_fresh, run_meshes, start_gpu_benchmark)

MESHES = ["cornell_box", "stanford_bunny", "happy_buddha_100k", "stanford_armadillo",
          "conference", "stanford_armadillo@sub1", "stanford_armadillo@sub2"]


def measure(spec, mesh_dir, repeats):
    """One mesh in this (fresh) process; prints the record as JSON."""
    import cupy
    import numpy as np

    import kdtree_gpu as kd
    from _common import gpu_time_ms
    from bench_build import load

    try:
        from kdtree_gpu.builder.gpu import workspace
    except ImportError:  # a package from before the workspace
        workspace = None
    V, F = load(spec, mesh_dir)
    kd.build(V[:3], np.array([[0, 1, 2]], np.int32), device="cuda")  # compile
    pool = cupy.get_default_memory_pool()
    cupy.cuda.Device().synchronize()
    pool.free_all_blocks()
    free0 = cupy.cuda.runtime.memGetInfo()[0]
    total0 = pool.total_bytes()
    tree = kd.build(V, F, device="cuda")
    cupy.cuda.Device().synchronize()
    n = int(F.shape[0])
    names = ("node_axis", "node_split", "node_child", "node_count", "leaf_tris", "vertices",
             "faces")
    from kdtree_gpu.trace.gpu import traversal_layout

    layout = traversal_layout(tree)
    result = sum(int(tree.device_array(name).nbytes) for name in names) + int(
        layout.nodes.nbytes) + int(layout.tris.nbytes) + int(
        getattr(layout, "refs", layout.nodes[:0]).nbytes)  # older layouts have no refs
    record = {"mesh": spec, "triangles": n,
              "peak_bytes": int(tree.build_info["peak_device_bytes"]),
              "pool_after_bytes": int(pool.total_bytes() - total0),
              "workspace_after_bytes": int(workspace.held_bytes()) if workspace else 0,
              "device_after_bytes": int(free0 - cupy.cuda.runtime.memGetInfo()[0]),
              "result_bytes": result, "nodes": int(tree.num_nodes), "refs": int(tree.num_refs),
              "loop_launches": tree.build_info.get("loop_launches"),
              "stage_levels": len(tree.build_info.get("stage_levels", []))}
    del tree, layout
    ms, times = gpu_time_ms(lambda: kd.build(V, F, device="cuda"), repeats, 2)
    record.update(build_ms=ms, build_ms_all=times,
                  pool_after_repeats_bytes=int(pool.total_bytes() - total0))
    if workspace is not None:
        from kdtree_gpu.builder import GpuSettings

        keep = GpuSettings(keep_workspace=True)
        ms, times = gpu_time_ms(lambda: kd.build(V, F, device="cuda", settings=keep),
                                repeats, 2)
        record.update(keep_build_ms=ms, keep_build_ms_all=times,
                      keep_held_bytes=int(pool.total_bytes() - total0 + workspace.held_bytes()))
        workspace.release_cached()
    print(json.dumps(record))


def markdown(result):
    optix = result.get("optix", {})
    lines = [f"# Build memory on {result['device']}", "",
             f"commit `{result['commit']}`, {result['date']}"
             + (f"; before = `{result['baseline']}`" if result.get("baseline") else "") + ". "
             "Bytes per input triangle. `kd.build(V, F)` on host arrays in a fresh process "
             "(kernels compiled first, pools emptied). Peak: `build_info['peak_device_bytes']` "
             "(the workspace's pools + growth of CuPy's pool + mesh). Pool after: CuPy's default pool "
             "`total_bytes()` right after the build (+ the workspace pool's, 0 when given back). "
             "Device after: drop of `cudaMemGetInfo` free bytes over the build. Result: tree "
             "arrays + traversal layout + mesh. Build ms: CUDA events around `kd.build`, median "
             "of repeats, same process. Kept: the same with `GpuSettings(keep_workspace=True)` (the "
             "workspace stays cached between builds) and what the process then holds. OptiX: "
             "compacted GAS (h200_optix.md).", ""]
    cols = ["mesh", "triangles", "peak", "pool after", "workspace after", "device after",
            "result", "build ms", "loop launches", "kept: build ms", "kept: held"]
    if result.get("baseline"):
        cols += ["before: peak", "before: pool after", "before: device after", "before: result",
                 "before: build ms", "peak before/after"]
    cols += ["OptiX GAS"]
    lines += md_head(*cols)

    def per(rec, key):
        return f"{rec[key] / rec['triangles']:,.0f}"

    for rec in result["meshes"]:
        if "error" in rec:
            lines.append(md_row(rec["mesh"], "error: " + rec["error"]))
            continue
        row = [rec["mesh"], f"{rec['triangles']:,}", per(rec, "peak_bytes"),
               per(rec, "pool_after_bytes"), per(rec, "workspace_after_bytes"),
               per(rec, "device_after_bytes"), per(rec, "result_bytes"),
               f"{rec['build_ms']:.2f}", rec.get("loop_launches"),
               f"{rec['keep_build_ms']:.2f}" if "keep_build_ms" in rec else "-",
               per(rec, "keep_held_bytes") if "keep_held_bytes" in rec else "-"]
        base = rec.get("baseline")
        if result.get("baseline"):
            if base and "error" not in base:
                row += [per(base, "peak_bytes"), per(base, "pool_after_bytes"),
                        per(base, "device_after_bytes"), per(base, "result_bytes"),
                        f"{base['build_ms']:.2f}", f"{base['peak_bytes'] / rec['peak_bytes']:.2f}"]
            else:
                row += ["-"] * 6
        gas = optix.get(rec["mesh"])
        row.append(f"{gas['gas_mb'] * 1e6 / rec['triangles']:,.0f}" if gas else "-")
        lines.append(md_row(*row))
    return "\n".join(lines) + "\n"


def main():
    parser = gpu_benchmark_parser(__doc__, MESHES, repeats=7)
    parser.add_argument("--baseline-root", help="package root of an earlier commit")
    parser.add_argument("--baseline-label", help="its name in the table (default: its commit)")
    parser.add_argument("--timeout", type=int, default=600)
    args = parser.parse_args()
    _, device, result = start_gpu_benchmark(__file__, args.peers_dir)
    result["optix"] = optix_table(args.peers_dir)
    if args.baseline_root:
        result["baseline"] = args.baseline_label or subprocess.run(
            ["git", "-C", args.baseline_root, "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True).stdout.strip() or Path(args.baseline_root).name

    def bench_one(spec):
        record = run_fresh(ROOT, "bench_build_memory", "measure", spec, str(args.mesh_dir),
                           args.repeats, timeout=args.timeout)
        if args.baseline_root:
            try:
                record["baseline"] = run_fresh(
                    Path(args.baseline_root).resolve(), "bench_build_memory", "measure", spec,
                    str(args.mesh_dir), args.repeats, timeout=args.timeout)
            except Exception as exc:
                record["baseline"] = {"error": str(exc)}
        return record

    return run_meshes(result, args.meshes, bench_one, markdown, args.out,
                      f"build_memory_{gpu_slug(device)}")


if __name__ == "__main__":
    sys.exit(main())
