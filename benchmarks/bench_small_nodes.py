#!/usr/bin/env python3
"""The small-node stage against the level loop alone: warm build time per small_refs.

For each mesh, ``kd.build`` on CuPy arrays with ``GpuSettings(small_refs=s,
small_min_refs=0)`` for each ``s`` (0: every level in the level-loop kernel;
the default is 64 for builds of at least ``small_min_refs`` references), CUDA
events around the call, median of ``--repeats`` after a warm-up; beside it the
number of deferred subtrees, the level-loop levels left, the launches of the
loop (more than one: its buffers were outgrown), the build's peak device
memory per triangle (``build_info["peak_device_bytes"]``, the default loop
buffers for that ``s``), and, from one profiled build at the largest ``s``,
the time of the level loop and of the subtree kernels. Every tree is
compared node by node with the ``small_refs=0`` tree of the same mesh
(meshes under ``--compare-max`` triangles).

Writes ``small_nodes_<gpu>.json`` and ``.md`` under ``--out``.
"""

from __future__ import annotations

from _common import (gpu_benchmark_parser, gpu_slug, gpu_time_ms, md_head, md_row, run_meshes,
                     start_gpu_benchmark)

MESHES = ["cornell_box", "suzanne", "spot", "stanford_bunny", "happy_buddha_100k",
          "stanford_dragon_res2", "stanford_armadillo", "conference", "stanford_armadillo@sub1"]
SETTINGS = [0, 16, 32, 64]


def bench_mesh(spec, args):
    import cupy

    import kdtree_gpu as kd
    from bench_build import load
    from kdtree_gpu.builder import GpuSettings

    V, F = load(spec, args.mesh_dir)
    V, F = cupy.asarray(V), cupy.asarray(F)
    record = {"mesh": spec, "triangles": int(F.shape[0]), "runs": []}
    base = None
    for small in args.small_refs:
        settings = GpuSettings(small_refs=small, small_min_refs=0)
        ms, times = gpu_time_ms(lambda: kd.build(V, F, settings=settings), args.repeats, 3)
        tree = kd.build(V, F, settings=settings)
        info = tree.build_info
        run = {"small_refs": small, "ms": ms, "ms_all": times, "levels": info["levels"],
               "small_subtrees": info["small_subtrees"],
               "medium_subtrees": info.get("medium_subtrees", 0), "nodes": tree.num_nodes,
               "refs": tree.num_refs, "loop_launches": info["loop_launches"],
               "subtree_runs_full": info["small_runs_full"],
               "peak_bytes_per_triangle": info["peak_device_bytes"] / int(F.shape[0])}
        if base is None:
            base = tree
        elif F.shape[0] <= args.compare_max:
            run["same_tree"] = base.compare(tree) is None
        record["runs"].append(run)
    profiled = kd.build(V, F, settings=GpuSettings(small_refs=max(args.small_refs),
                                                   small_min_refs=0), profile=True)
    prof = profiled.build_info["profile"]
    record["profile_ms"] = {name: prof[name]["total_ms"] for name in
                            ("build_levels_grid", "small subtrees") if name in prof}
    record["subtree_stage_runs"] = prof.get("small subtrees", {}).get("launches", 0)
    return record


def markdown(result):
    lines = [f"# Small-node stage on {result['device']}", "",
             f"commit `{result['commit']}`, {result['date']}. `kd.build` on CuPy arrays, CUDA "
             "events, median of repeats after a warm-up; `small_refs=0`: every level in the "
             "level-loop kernel; the default is 64 for builds of 32,768 references or more "
             "(`small_min_refs`; here every build defers). Peak: `build_info` "
             "`peak_device_bytes` per triangle. Loop / subtrees ms: one profiled build at the "
             "largest setting (a subtree stage that finds a buffer full runs again).", ""]
    first = result["meshes"][0]["runs"][0]["small_refs"] if result["meshes"] and \
        "runs" in result["meshes"][0] else 0
    # the ratio is to the first setting measured (the default, 0, unless told otherwise)
    lines += md_head("mesh", "triangles", "small_refs", "build ms", f"vs {first}",
                     "peak B/tri", "loop levels", "loop launches", "subtrees", "of them medium",
                     "same tree")
    for r in result["meshes"]:
        if "error" in r:
            lines.append(md_row(r["mesh"], "-", "-", r["error"], "", "", "", "", "", "", ""))
            continue
        base = r["runs"][0]["ms"]
        for run in r["runs"]:
            same = {True: "yes", False: "NO"}.get(run.get("same_tree"), "-")
            lines.append(md_row(r["mesh"], f"{r['triangles']:,}", run["small_refs"],
                                f"{run['ms']:.2f}", f"{run['ms'] / base:.2f}x",
                                f"{run['peak_bytes_per_triangle']:,.0f}", run["levels"],
                                run["loop_launches"], f"{run['small_subtrees']:,}",
                                f"{run.get('medium_subtrees', 0):,}", same))
    lines += ["", "Profiled build at the largest setting (ms):", ""]
    lines += md_head("mesh", "level loop", "subtree stage", "subtree stage runs")
    for r in result["meshes"]:
        p = r.get("profile_ms", {})
        lines.append(md_row(r["mesh"], *(f"{p[k]:.2f}" if k in p else "-"
                                         for k in ("build_levels_grid", "small subtrees")),
                            r.get("subtree_stage_runs", "-")))
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = gpu_benchmark_parser(__doc__, MESHES, repeats=9)
    parser.add_argument("--small-refs", type=int, nargs="+", default=SETTINGS)
    parser.add_argument("--compare-max", type=int, default=400_000)
    args = parser.parse_args(argv)
    _, device, result = start_gpu_benchmark(__file__, args.peers_dir)
    return run_meshes(result, args.meshes, lambda m: bench_mesh(m, args), markdown, args.out,
                      f"small_nodes_{gpu_slug(device)}")


if __name__ == "__main__":
    raise SystemExit(main())
