#!/usr/bin/env python3
"""What a block-per-subtree stage for medium nodes would take from the level loop (CPU only).

The level loop's time is about a floor per level plus a cost per event of the
level (``results/loop_scans_h100.md``: on an H100 about 50 us and 85 ps,
fitted to conference's first and last levels).
Every level of conference holds 2-2.7M events, so its levels cost alike
whatever their nodes' sizes, and most of them are nodes of a few hundred to a
few thousand references. A stage that builds each such node's whole subtree
inside one thread block (the loop's rules, block barriers instead of grid
barriers, the node's events in shared memory) would take those events out of
the loop. From the reference tree (identical to the GPU's), for each
threshold T this script finds the nodes such a stage would start from (split
nodes of the loop's levels with more than ``small_refs`` and at most T
references whose parent holds more than T), and prints:

* how many, their largest references and events;
* the event-levels (a node's events, summed over the nodes of the loop's
  levels) the loop keeps and the stage takes, and the levels the loop keeps;
* the levels of the deepest such subtree above the subtree stage's nodes of
  at most ``small_refs`` references, and the most events one of its levels
  holds (a subtree's references grow as straddling triangles go to both
  children), and the bytes a block needs for such a level and the next at 7
  bytes an event (position, kind and a 16-bit reference);
* the loop's time by the model above (``--floor-us``, ``--event-ps``: a
  model, to rank thresholds, not a measurement) for the loop as it is and
  for what it keeps.

    python benchmarks/medium_subtrees.py --mesh-dir DIR [--meshes NAME ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from subtree_sizes import node_references, phases, tree_levels  # noqa: E402

MESHES = ["stanford_bunny", "conference", "stanford_armadillo", "happy_buddha_100k"]
THRESHOLDS = (256, 512, 1024, 2048, 4096)
EVENT_BYTES = 7


def medium(spec, mesh_dir, thresholds=THRESHOLDS, small_refs=64, small_min_refs=32768,
           max_events=1 << 23, floor_us=50.0, event_ps=85.0):
    import cpu_reference
    from bench_build import load
    from kdtree_gpu import encoding as enc
    from kdtree_gpu.mesh import triangle_bounds

    V, F = load(spec, mesh_dir)
    tree = cpu_reference.build(V, F)
    leaf = enc.AXIS_LEAF
    axis, child = tree.node_axis, tree.node_child
    parent, depth = tree_levels(axis, child, leaf)
    lo, hi = triangle_bounds(V, F)
    refs, events = node_references(tree, parent, depth, leaf,
                                   np.where(lo == hi, 1, 2).sum(axis=1).astype(np.int64))
    deferred, runs, stage_levels = phases(tree, depth, refs, events, leaf, small_refs,
                                          small_min_refs, max_events)
    split = axis != leaf
    # the loop's nodes: those of its levels that no deferred node is above
    order = np.argsort(depth, kind="stable")  # parents before their children
    below_deferred = np.zeros(refs.size, dtype=bool)
    for i in order:
        p = parent[i]
        if p >= 0 and (deferred[p] or below_deferred[p]):
            below_deferred[i] = True
    in_loop_level = np.zeros(refs.size, dtype=bool)
    for first, last in runs:
        in_loop_level |= (depth >= first) & (depth <= last)
    loop_nodes = in_loop_level & ~below_deferred
    row = {"mesh": spec, "triangles": int(F.shape[0]), "loop_runs": runs,
           "stage_levels": stage_levels,
           "loop_levels": int(len(np.unique(depth[loop_nodes]))),
           "loop_event_levels": int(events[loop_nodes].sum())}
    row["loop_model_ms"] = round((row["loop_levels"] * floor_us
                                  + row["loop_event_levels"] * event_ps * 1e-6) / 1000, 3)
    row["thresholds"] = []
    up = np.where(parent >= 0, refs[np.maximum(parent, 0)], np.iinfo(np.int64).max)
    for t in thresholds:
        roots = loop_nodes & split & ~deferred & (refs > small_refs) & (refs <= t) & (up > t)
        # a root's subtree down to (not into) the nodes the loop would defer, of the
        # loop's nodes; each member's depth below its root and its root
        reach = roots.copy()
        in_block = roots & loop_nodes
        rel = np.full(refs.size, -1, dtype=np.int64)
        root_of = np.full(refs.size, -1, dtype=np.int64)
        for i in order:
            p = parent[i]
            if p >= 0 and reach[p] and split[p] and not deferred[p]:
                reach[i] = True
                in_block[i] = loop_nodes[i]
            if roots[i]:
                rel[i], root_of[i] = 0, i
            elif in_block[i]:
                rel[i], root_of[i] = rel[p] + 1, root_of[p]
        kept = loop_nodes & ~in_block
        # a subtree's widest level (its events summed over the nodes at one depth below
        # its root): what a block holds if it runs its subtree level by level
        member = np.flatnonzero(in_block)
        widest = 0
        if member.size:
            key = root_of[member] * 64 + rel[member]
            uniq, inverse = np.unique(key, return_inverse=True)
            widest = int(np.bincount(inverse, weights=events[member]).max())
        kept_levels = int(len(np.unique(depth[kept])))
        kept_events = int(events[kept].sum())
        row["thresholds"].append({
            "T": t, "roots": int(roots.sum()),
            "root_refs_max": int(refs[roots].max()) if roots.any() else 0,
            "root_refs_mean": round(float(refs[roots].mean()), 1) if roots.any() else 0,
            "root_events_max": int(events[roots].max()) if roots.any() else 0,
            "block_event_levels": int(events[in_block].sum()),
            "block_levels_max": int(rel.max()) + 1 if roots.any() else 0,
            "widest_level_events_max": widest,
            # a level and its children's level in shared memory
            "block_bytes": 2 * EVENT_BYTES * widest,
            "loop_levels": kept_levels, "loop_event_levels": kept_events,
            "loop_model_ms": round((kept_levels * floor_us + kept_events * event_ps * 1e-6)
                                   / 1000, 3)})
    return row


def table(rows) -> str:
    out = ["| mesh | T | subtree roots | refs max / mean | events max | block levels max | "
           "widest subtree level: events | a block's bytes (7 B an event, two levels) | "
           "event-levels: block | loop keeps | loop levels | loop model ms (now) |",
           "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        for t in r["thresholds"]:
            out.append(f"| {r['mesh']} | {t['T']} | {t['roots']:,} | {t['root_refs_max']:,} / "
                       f"{t['root_refs_mean']:,} | {t['root_events_max']:,} | "
                       f"{t['block_levels_max']} | {t['widest_level_events_max']:,} | "
                       f"{t['block_bytes']:,} | "
                       f"{t['block_event_levels'] / 1e6:.1f}M | "
                       f"{t['loop_event_levels'] / 1e6:.1f}M | {t['loop_levels']} | "
                       f"{t['loop_model_ms']} ({r['loop_model_ms']}) |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mesh-dir", default=os.environ.get("KDTREE_GPU_MESH_DIR"))
    parser.add_argument("--meshes", nargs="+", default=MESHES)
    parser.add_argument("--floor-us", type=float, default=50.0)
    parser.add_argument("--event-ps", type=float, default=85.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rows = [medium(m, args.mesh_dir, floor_us=args.floor_us, event_ps=args.event_ps)
            for m in args.meshes]
    print(table(rows))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "medium_subtrees.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
