#!/usr/bin/env python3
"""Where the one-block level loop pays: warm build time of small and mid-size
meshes with every level in one block (``kd_build_levels_block``) against
one launch per stage, on the same GPU in the same run.

The builder picks the one-block loop for roots of at most
``builder.BLOCK_LOOP_ROOT_EVENTS`` events, with level buffers of
``builder.BLOCK_LOOP_EVENTS`` events; this sweep is what those two numbers
are read from.

Usage::

    PYTHONPATH=. python benchmarks/bench_block_loop.py --mesh-dir DIR --out DIR

Writes ``block_loop_<gpu>.json`` and ``block_loop_<gpu>.md`` under ``--out``.
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
from kdtree_gpu import builder  # noqa: E402

MESHES = ["cornell_box", "suzanne", "spot", "teapot", "sponza_dabrovic"]
SOUPS = [100, 300, 1000, 3000, 10000, 30000]


def soup(n, seed=0):
    """n small random triangles in the unit cube (size ~ n^(-1/3), like a mesh)."""
    rng = np.random.default_rng(seed)
    scale = 2.0 * n ** (-1.0 / 3.0)
    V = (rng.random((n, 1, 3)) + scale * rng.random((n, 3, 3))).reshape(-1, 3)
    return V.astype(np.float32), np.arange(3 * n, dtype=np.int32).reshape(n, 3)


def measure(V, F, loop, repeats):
    saved = builder.BLOCK_LOOP_ROOT_EVENTS, builder.BLOCK_LOOP_EVENTS
    try:
        if loop == "block":
            builder.BLOCK_LOOP_ROOT_EVENTS = 1 << 30
            builder.BLOCK_LOOP_EVENTS = 1 << 22
        else:
            builder.BLOCK_LOOP_ROOT_EVENTS = 0
        ms, times = gpu_time_ms(lambda: kd.build(V, F, device="cuda"), repeats, 2)
        tree = kd.build(V, F, device="cuda")
    finally:
        builder.BLOCK_LOOP_ROOT_EVENTS, builder.BLOCK_LOOP_EVENTS = saved
    info = tree.build_info
    return {"ms": ms, "all_ms": times, "levels": info["levels"],
            "block_levels": info["block_levels"], "nodes": tree.num_nodes,
            "max_events": max(e for _, _, e in info["level_sizes"]),
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
        for loop in ("block", "launch"):
            row[loop] = measure(V, F, loop, args.repeats)
        rows.append(row)
        b, l = row["block"], row["launch"]
        print(f"{name:18s} {row['triangles']:7d} tris  block {b['ms']:7.2f} ms "
              f"({b['block_levels']}/{b['levels']} levels)  launch {l['ms']:7.2f} ms  "
              f"root {b['root_events']} max {b['max_events']} events", flush=True)
    header = {"gpu": gpu, "commit": git_commit(), "date": utc_now(),
              "defaults": {"BLOCK_LOOP_ROOT_EVENTS": builder.BLOCK_LOOP_ROOT_EVENTS,
                           "BLOCK_LOOP_EVENTS": builder.BLOCK_LOOP_EVENTS}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = gpu.split()[-1].lower()
    (out / f"block_loop_{tag}.json").write_text(json.dumps({"header": header, "rows": rows},
                                                            indent=1))
    lines = [f"# One-block level loop vs one launch per stage, {gpu}", "",
             f"commit `{header['commit']}`, {header['date']}. Warm `kd.build` time (CUDA "
             f"events, median of {args.repeats} after 2 warm-up builds). Block: every level "
             "that fits in one launch of one block (buffers of 2^22 events for this sweep); "
             "launch: one launch per stage, one read per level. Defaults: root of at most "
             f"{builder.BLOCK_LOOP_ROOT_EVENTS} events, buffers of {builder.BLOCK_LOOP_EVENTS}.",
             "", "| case | triangles | root events | largest level (events) | levels | "
             "block ms | launch ms | block / launch |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        b, l = r["block"], r["launch"]
        lines.append(f"| {r['case']} | {r['triangles']:,} | {b['root_events']:,} | "
                     f"{b['max_events']:,} | {b['levels']} | {b['ms']:.2f} | {l['ms']:.2f} | "
                     f"{b['ms'] / l['ms']:.2f} |")
    (out / f"block_loop_{tag}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
