#!/usr/bin/env python3
"""The subtree stage's levels as the grid runs them, and as blocks would run their own
roots' levels, from the reference tree (CPU only).

The subtree stage (``cuda/build_small_grid.cu``) runs every level of every deferred
subtree in one cooperative launch, with a grid barrier between levels: a level costs the
barrier and the latency of its nodes' work even when it holds a few nodes. A block-local
stage would give each block a set of deferred roots and let it run their levels alone,
with block barriers; its levels would cost the block's own nodes' latency, and the stage
would last as long as its busiest block. This script counts what each way runs, from
``cpu_reference.build``'s tree (identical to the GPU's), so that the idea can be judged
with the per-level costs ``benchmarks/probe_subtree_phases.py`` measures:

* the stage's nodes are those at and below the nodes the builder defers
  (``subtree_sizes.phases``, the builder's defaults), with at least one reference;
* a node of at most ``SMALL_TINY_REFS`` references takes a thread (32 to a warp step), a
  larger one a warp step;
* grid: per level, the warp steps over the resident warps (``--blocks`` blocks of
  ``SMALL_BLOCK`` threads; an H200 runs 132 x 4), rounded up: ``grid_rounds`` summed over
  the ``levels``;
* blocks: the deferred roots dealt to the blocks largest first, each to the block with the
  least work so far (work: its subtree's warp steps); per block and level its warp steps
  over its four warps, rounded up; ``block_rounds``: the busiest block's sum over its
  levels, ``block_levels``: its levels; ``mean_block_rounds``: the blocks' mean;
* the wide nodes by references (9-16, 17-32, 33-64), and the grid's rounds if a node of
  9-16 references took half a warp (``grid_rounds_half_warp_to_16``).

A model to rank, not a measurement: with a grid level costing ``F`` plus ``s`` a round and a
block level ``f`` plus ``s`` a round, the grid takes ``levels * F + grid_rounds * s`` and the
blocks about ``block_levels * f + block_rounds * s``::

    python benchmarks/subtree_blocks.py --mesh-dir DIR [--meshes NAME ...] [--blocks 528]
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MESHES = ["stanford_bunny", "conference", "stanford_armadillo", "stanford_armadillo@sub1"]


def subtree_rounds(spec, mesh_dir, blocks=528, small_refs=64, small_min_refs=32768,
                   max_events=1 << 23):
    from probe_warp_candidates import stage_model
    from subtree_sizes import tree_levels

    from kdtree_gpu import encoding as enc

    row, s = stage_model(spec, mesh_dir, small_refs, small_min_refs, max_events)
    if s is None:
        return {**row, "stage_nodes": 0}
    parent, depth = tree_levels(s.tree.node_axis, s.tree.node_child, s.leaf)
    live = s.in_stage & (s.refs >= 1)
    # each stage node's deferred root, parents before children
    root = np.full(s.n, -1, np.int64)
    for i in np.argsort(depth, kind="stable"):
        if not s.in_stage[i]:
            continue
        p = parent[i]
        root[i] = root[p] if p >= 0 and s.in_stage[p] else i
    nodes = np.flatnonzero(live)
    level = depth[nodes] - depth[root[nodes]]
    tiny = s.refs[nodes] <= enc.SMALL_TINY_REFS
    warps = enc.SMALL_BLOCK // 32
    num_levels = int(level.max()) + 1
    # grid: per level, warp steps over the resident warps
    tiny_l = np.bincount(level, weights=tiny, minlength=num_levels)
    wide_l = np.bincount(level, weights=~tiny, minlength=num_levels)
    steps_l = np.ceil(tiny_l / 32) + wide_l
    grid_rounds = int(np.ceil(steps_l / (blocks * warps)).sum())
    # the wide nodes by references, and the grid's rounds if a node of at most 16 took
    # half a warp (two to a step)
    r = s.refs[nodes]
    half = (r > enc.SMALL_TINY_REFS) & (r <= 16)
    half_l = np.bincount(level, weights=half, minlength=num_levels)
    steps_half = np.ceil(tiny_l / 32) + np.ceil(half_l / 2) + (wide_l - half_l)
    half_rounds = int(np.ceil(steps_half / (blocks * warps)).sum())
    wide_refs = [int(((r > lo) & (r <= hi)).sum()) for lo, hi in ((8, 16), (16, 32), (32, 64))]
    # blocks: roots dealt largest first to the least loaded block
    roots, root_index = np.unique(root[nodes], return_inverse=True)
    work = np.bincount(root_index, weights=np.where(tiny, 1 / 32, 1.0))
    owner = np.empty(roots.shape[0], np.int64)
    heap = [(0.0, b) for b in range(blocks)]
    for r in np.argsort(-work, kind="stable"):
        load, b = heapq.heappop(heap)
        owner[r] = b
        heapq.heappush(heap, (load + work[r], b))
    block = owner[root_index]
    key = block * num_levels + level
    tiny_bl = np.bincount(key, weights=tiny, minlength=blocks * num_levels)
    wide_bl = np.bincount(key, weights=~tiny, minlength=blocks * num_levels)
    steps_bl = (np.ceil(tiny_bl / 32) + wide_bl).reshape(blocks, num_levels)
    rounds_b = np.ceil(steps_bl / warps).sum(axis=1)
    levels_b = (steps_bl > 0).sum(axis=1)
    busiest = int(np.argmax(rounds_b))
    return {**row, "stage_nodes": int(nodes.shape[0]), "deferred_roots": int(roots.shape[0]),
            "tiny_share": round(float(tiny.mean()), 3), "levels": num_levels,
            "grid_rounds": grid_rounds,
            # of the levels' warp steps, those of wide nodes
            "wide_step_share": round(float(wide_l.sum() / steps_l.sum()), 3),
            "wide_nodes_9_16_17_32_33_64": wide_refs, "grid_rounds_half_warp_to_16": half_rounds,
            "nodes_per_level": [int(x) for x in np.bincount(level, minlength=num_levels)],
            "blocks": blocks, "block_rounds": int(rounds_b[busiest]),
            "block_levels": int(levels_b[busiest]), "max_block_levels": int(levels_b.max()),
            "mean_block_rounds": round(float(rounds_b.mean()), 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mesh-dir", required=True)
    parser.add_argument("--meshes", nargs="*", default=MESHES)
    parser.add_argument("--blocks", type=int, default=528,
                        help="resident blocks of the subtree kernel (H200: 132 x 4)")
    parser.add_argument("--out", help="folder for subtree_blocks.json")
    args = parser.parse_args(argv)
    rows = []
    for spec in args.meshes:
        rows.append(subtree_rounds(spec, args.mesh_dir, args.blocks))
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        Path(args.out, "subtree_blocks.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
