#!/usr/bin/env python3
"""The level-loop kernel against one launch per stage: warm build time of
random soups and real meshes with ``kernels="fused"`` (every level in the
cooperative level-loop kernel, ``kd_build_levels_grid``) and
``kernels="stages"`` (one launch per stage, one read per level), on the same
GPU in the same run, with the number of loop launches (one more each time a
level outgrows the loop's buffers).

Usage::

    PYTHONPATH=. python benchmarks/bench_level_loop.py --mesh-dir DIR --out DIR

Writes ``level_loop_<gpu>.json`` and ``level_loop_<gpu>.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import git_commit, gpu_time_ms, utc_now  # noqa: E402

import kdtree_gpu as kd  # noqa: E402

MESHES = ["cornell_box", "suzanne", "spot", "teapot", "stanford_bunny", "sponza_dabrovic",
          "happy_buddha_100k", "stanford_dragon_res2", "stanford_armadillo", "conference"]
SOUPS = [100, 1000, 10000, 100000]


def soup(n, seed=0):
    """n small random triangles in the unit cube (size ~ n^(-1/3), like a mesh)."""
    rng = np.random.default_rng(seed)
    scale = 2.0 * n ** (-1.0 / 3.0)
    V = (rng.random((n, 1, 3)) + scale * rng.random((n, 3, 3))).reshape(-1, 3)
    return V.astype(np.float32), np.arange(3 * n, dtype=np.int32).reshape(n, 3)


def measure(V, F, kernels, repeats):
    ms, times = gpu_time_ms(lambda: kd.build(V, F, device="cuda", kernels=kernels), repeats, 2)
    tree = kd.build(V, F, device="cuda", kernels=kernels)
    info = tree.build_info
    return {"ms": ms, "all_ms": times, "levels": info["levels"],
            "level_loop": info["level_loop"], "loop_launches": info["loop_launches"],
            "nodes": tree.num_nodes, "max_events": max(e for _, _, e in info["level_sizes"]),
            "root_events": info["level_sizes"][0][2]}


def main():
    import cupy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mesh-dir", default=os.environ.get("KDTREE_GPU_MESH_DIR", "meshes"))
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    cases = [(f"soup {n}", soup(n)) for n in SOUPS]
    for name in MESHES:
        path = Path(args.mesh_dir) / f"{name}.ply"
        if path.is_file():
            cases.append((name, kd.load_mesh(str(path))))
    rows = []
    for name, (V, F) in cases:
        row = {"case": name, "triangles": int(F.shape[0])}
        for kernels in ("fused", "stages"):
            row[kernels] = measure(V, F, kernels, args.repeats)
        rows.append(row)
        g, l = row["fused"], row["stages"]
        print(f"{name:20s} {row['triangles']:8d} tris  loop {g['ms']:7.2f} ms "
              f"({g['loop_launches']} launches)  stages {l['ms']:7.2f} ms  "
              f"root {g['root_events']} max {g['max_events']} events", flush=True)
    header = {"gpu": gpu, "commit": git_commit(), "date": utc_now()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = gpu.split()[-1].lower()
    (out / f"level_loop_{tag}.json").write_text(json.dumps({"header": header, "rows": rows},
                                                            indent=1))
    lines = [f"# Level-loop kernel vs one launch per stage, {gpu}", "",
             f"commit `{header['commit']}`, {header['date']}. Warm `kd.build` time (CUDA "
             f"events around the whole build, median of {args.repeats} after 2 warm-up "
             "builds). Loop: `kernels=\"fused\"`, the levels in the cooperative level-loop "
             "kernel (launches: one, plus one each time a level outgrew the buffers); "
             "stages: `kernels=\"stages\"`, one launch per stage and one read per level.",
             "", "| case | triangles | root events | largest level (events) | levels | "
             "loop ms | loop launches | stages ms | stages / loop |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        g, l = r["fused"], r["stages"]
        lines.append(f"| {r['case']} | {r['triangles']:,} | {g['root_events']:,} | "
                     f"{g['max_events']:,} | {g['levels']} | {g['ms']:.2f} | "
                     f"{g['loop_launches']} | {l['ms']:.2f} | {l['ms'] / g['ms']:.1f}x |")
    (out / f"level_loop_{tag}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
