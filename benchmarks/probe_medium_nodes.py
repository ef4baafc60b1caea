"""The subtree stage's medium nodes (a block each) against the level loop: where the time goes.

For each mesh (``bench_build.load`` names: ``stanford_armadillo@sub1`` is subdivided once) and
each ``--small-refs`` (the loop defers nodes of up to that many references; those of more than
``encoding.SMALL_MAX_REFS`` take a block each, the others a warp), one JSON line: warm
``kd.build`` ms on CuPy arrays (CUDA events, median of ``--repeats`` after two builds), the
subtree stage's runs that found their room full, and from one profiled build the GPU ms of the
level loop and of each subtree-stage kernel (rows: total ms, launches, longest launch ms)::

    PYTHONPATH=. python benchmarks/probe_medium_nodes.py --small-refs 64 256 conference

With ``--levels``, one build per mesh instead, level by level: the subtree level's medium
nodes, records and references, and the GPU ms of its medium-node and warp launches. Writes
``--out/medium_nodes.json`` when ``--out`` is given. Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from _common import ROOT, git_commit, gpu_time_ms, utc_now


def sweep(kd, mesh, V, F, small_refs, repeats):
    from kdtree_gpu.builder import GpuSettings

    settings = GpuSettings(small_refs=small_refs)
    ms, _ = gpu_time_ms(lambda: kd.build(V, F, settings=settings), repeats, 2)
    tree = kd.build(V, F, settings=settings, profile=True)
    info = tree.build_info
    rows = {name: [round(v["total_ms"], 3), v["launches"], round(v["max_ms"], 3)]
            for name, v in info["profile"].items() if "small" in name or "grid" in name}
    return {"mesh": mesh, "small_refs": small_refs, "ms": round(ms, 2),
            "medium_subtrees": info["medium_subtrees"], "runs_full": info["small_runs_full"],
            "rows": rows}


def levels(kd, mesh, V, F, small_refs):
    from kdtree_gpu.builder import GpuSettings
    from kdtree_gpu.launch import Profiler

    # (a launch per level, whose times the profile keeps: in one cooperative
    # launch the levels have no time of their own)
    settings = GpuSettings(small_refs=small_refs, small_grid=False)
    for _ in range(2):
        kd.build(V, F, settings=settings)
    with Profiler() as profiler:
        tree = kd.build(V, F, settings=settings)
    times = profiler.times()
    medium = times.get("small subtrees: medium level", [])
    warp = times.get("small subtrees: level", [])
    info = tree.build_info
    out = []
    for level, (nodes, (records, refs)) in enumerate(zip(info["medium_level_sizes"],
                                                          info["small_level_sizes"])):
        out.append({"level": level, "medium": nodes, "records": records, "refs": refs,
                    "medium_ms": round(medium[level], 3) if level < len(medium) else None,
                    "warp_ms": round(warp[level], 3) if level < len(warp) else None})
    return {"mesh": mesh, "small_refs": small_refs, "runs_full": info["small_runs_full"],
            "levels": out, "medium_launches": len(medium),
            "medium_ms_after": round(sum(medium[len(out):]), 3)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("meshes", nargs="+")
    parser.add_argument("--small-refs", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--levels", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mesh-dir", default=os.environ.get("KDTREE_GPU_MESH_DIR",
                                                             str(ROOT / ".meshes")))
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    import cupy

    import kdtree_gpu as kd
    from bench_build import load

    results = []
    for mesh in args.meshes:
        V, F = load(mesh, args.mesh_dir)
        V, F = cupy.asarray(V), cupy.asarray(F)
        for small_refs in args.small_refs:
            record = (levels(kd, mesh, V, F, small_refs) if args.levels
                      else sweep(kd, mesh, V, F, small_refs, args.repeats))
            results.append(record)
            print(json.dumps(record), flush=True)
    if args.out:
        device = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
        path = Path(args.out) / "medium_nodes.json"
        path.write_text(json.dumps({"device": device, "commit": git_commit(), "date": utc_now(),
                                    "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
