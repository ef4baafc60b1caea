#!/usr/bin/env python3
"""How busy the subtree stage's thread-per-node lanes are, from the reference tree (CPU only).

The subtree stage gives each node of at most ``SMALL_TINY_REFS`` (8)
references a thread (``cuda/small_split.cuh``, ``kd_tiny_best_split``): on
each axis the thread marks its candidate planes (its references' bounds
strictly inside the node's box, a planar reference's one event) and visits
them two an iteration, each candidate counted over all 8 reference slots
and costed in float64. A warp's 32 threads run the axis loop together, so a
warp takes, on each axis, as many iterations as its busiest thread. Its
nodes are the level's records in the order their parents wrote them (slots
taken by atomics: no order by size). This script says, from
``cpu_reference.build``'s tree (identical to the GPU's), how many of those
warp iterations do a thread's work, and how many would with the level's
records ordered by their iterations (what binning the tiny records by size
would give), so that the idea can be judged before it is written:

* a node's references are the distinct triangles of its subtree's leaves,
  its box follows from the root's box and the splits above it (as
  ``probe_warp_candidates.py``);
* the tiny nodes are the subtree stage's nodes (below the deferred ones,
  ``subtree_sizes.phases``, the builder's defaults) of 1 to 8 references;
  each evaluates its candidates whether it then splits or not (leaf_size 0;
  the depth limit is not modelled);
* per level: warps of 32 nodes in a random order (seed 0) and in the order
  of their iterations; lane utilisation = the nodes' iterations over 32
  times the warps'; also ordered by their references alone (what a parent
  knows of a child when it writes the record). Also the share of the tiny
  nodes' candidate visits made by nodes of at most 4 references (whose count
  needs 4 slots, not 8).

    python benchmarks/probe_tiny_nodes.py --mesh-dir DIR [--meshes NAME ...] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MESHES = ["stanford_bunny", "conference", "stanford_armadillo", "stanford_armadillo@sub1"]


def warp_iterations(iters, rng=None):
    """Warp iterations for lanes with per-axis iterations ``iters`` ((k, axes)), in
    groups of 32 in the given order (``rng``: shuffled first): the sum over
    warps and axes of the busiest lane's."""
    if rng is not None:
        iters = iters[rng.permutation(iters.shape[0])]
    pad = (-iters.shape[0]) % 32
    padded = np.concatenate([iters, np.zeros((pad, iters.shape[1]), iters.dtype)])
    return int(padded.reshape(-1, 32, iters.shape[1]).max(axis=1).sum())


def tiny_lanes(spec, mesh_dir, small_refs=64, small_min_refs=32768, max_events=1 << 23):
    from probe_warp_candidates import node_boxes, stage_model

    from kdtree_gpu import encoding as enc

    row, s = stage_model(spec, mesh_dir, small_refs, small_min_refs, max_events)
    if s is None:
        return {**row, "tiny_nodes": 0}
    node, tri = s.node, s.tri
    tiny = s.in_stage & (s.refs >= 1) & (s.refs <= enc.SMALL_TINY_REFS)
    keep = tiny[node]
    node, tri = node[keep], tri[keep]
    box_lo, box_hi = node_boxes(s.tree, s.depth, s.leaf)
    cands = np.zeros((s.n, 3), np.int64)
    for a in range(3):
        lo, hi = s.tri_lo[tri, a], s.tri_hi[tri, a]
        nlo, nhi = box_lo[node, a], box_hi[node, a]
        is_lo = (lo > nlo) & (lo < nhi)
        is_hi = (hi != lo) & (hi > nlo) & (hi < nhi)
        cands[:, a] = np.bincount(node, weights=is_lo.astype(np.int64) + is_hi, minlength=s.n)
    iters = -(-cands // 2)  # two candidates an iteration
    rng = np.random.default_rng(0)
    work = now = binned = by_refs = 0
    ids = np.flatnonzero(tiny)
    for d in np.unique(s.depth[ids]):
        level = ids[s.depth[ids] == d]
        it = iters[level]
        work += int(it.sum())
        now += warp_iterations(it, rng)
        order = np.lexsort((it[:, 2], it[:, 1], it[:, 0], it.sum(axis=1)))
        binned += warp_iterations(it[order])
        # (by references only: what a parent knows of a child when it writes its record)
        by_refs += warp_iterations(it[np.argsort(s.refs[level], kind="stable")])
    # One thread per tiny subtree, depth first (a thread builds a tiny root's
    # whole subtree, its nodes one after another): a lane's work is its
    # subtree's iterations over every node and axis, a warp's the busiest
    # lane's; roots in a random order, by their subtree's work, by their references.
    from subtree_sizes import tree_levels

    parent, _ = tree_levels(s.tree.node_axis, s.tree.node_child, s.leaf)
    root_of = np.full(s.n, -1, np.int64)
    for i in ids[np.argsort(s.depth[ids], kind="stable")]:
        p = parent[i]
        root_of[i] = root_of[p] if p >= 0 and tiny[p] else i
    roots = np.flatnonzero(root_of == np.arange(s.n))
    subtree_work = np.bincount(root_of[ids], weights=iters[ids].sum(axis=1), minlength=s.n)
    # (one column: a lane's whole subtree, every axis)
    lane_work = subtree_work[roots].astype(np.int64)[:, None]
    dfs_now = warp_iterations(lane_work, rng)
    dfs_sorted = warp_iterations(np.sort(lane_work, axis=0))
    dfs_by_refs = warp_iterations(lane_work[np.argsort(s.refs[roots], kind="stable")])
    r = s.refs[ids]
    visits = cands[ids].sum(axis=1)
    return {**row, "tiny_nodes": int(ids.size), "mean_refs": round(float(r.mean()), 2),
            "refs_histogram": np.bincount(r, minlength=9)[1:].tolist(),
            "candidates_per_node": round(float(visits.mean()), 2),
            "share_of_visits_by_nodes_of_4_or_fewer": round(
                float(visits[r <= 4].sum() / max(visits.sum(), 1)), 3),
            "lane_utilisation_now": round(work / (32 * max(now, 1)), 3),
            "lane_utilisation_binned": round(work / (32 * max(binned, 1)), 3),
            "lane_utilisation_by_refs": round(work / (32 * max(by_refs, 1)), 3),
            "warp_iterations_binned_per_now": round(binned / max(now, 1), 3),
            "tiny_levels": int(np.unique(s.depth[ids]).size), "tiny_roots": int(roots.size),
            "nodes_per_root": round(ids.size / max(roots.size, 1), 2),
            "dfs_lane_utilisation": round(work / (32 * max(dfs_now, 1)), 3),
            "dfs_lane_utilisation_sorted": round(work / (32 * max(dfs_sorted, 1)), 3),
            "dfs_lane_utilisation_by_refs": round(work / (32 * max(dfs_by_refs, 1)), 3),
            "dfs_warp_iterations_per_now": round(dfs_now / max(now, 1), 3)}


def table(rows):
    lines = ["| mesh | triangles | tiny nodes | mean refs | nodes of 1..8 refs | candidates a node "
             "| visits by nodes of <= 4 refs | lanes busy now | lanes busy, binned "
             "| lanes busy, by references | warp iterations binned / now "
             "| tiny levels | tiny roots | nodes a root | subtree a thread: lanes busy "
             "| by subtree work | by root references | warp iterations / now |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
             "|---:|---:|"]
    for r in rows:
        if not r["tiny_nodes"]:
            lines.append(f"| {r['mesh']} | {r['triangles']:,} | (defers nothing) |" + " |" * 15)
            continue
        lines.append(f"| {r['mesh']} | {r['triangles']:,} | {r['tiny_nodes']:,} | "
                     f"{r['mean_refs']} | " + " / ".join(f"{x:,}" for x in r["refs_histogram"])
                     + f" | {r['candidates_per_node']} | "
                     f"{r['share_of_visits_by_nodes_of_4_or_fewer']:.1%} | "
                     f"{r['lane_utilisation_now']:.1%} | {r['lane_utilisation_binned']:.1%} | "
                     f"{r['lane_utilisation_by_refs']:.1%} | "
                     f"{r['warp_iterations_binned_per_now']:.2f} | {r['tiny_levels']} | "
                     f"{r['tiny_roots']:,} | {r['nodes_per_root']} | "
                     f"{r['dfs_lane_utilisation']:.1%} | {r['dfs_lane_utilisation_sorted']:.1%} | "
                     f"{r['dfs_lane_utilisation_by_refs']:.1%} | "
                     f"{r['dfs_warp_iterations_per_now']:.2f} |")
    return "\n".join(lines)


def main():
    from subtree_sizes import tree_model_main

    tree_model_main(__doc__, MESHES, tiny_lanes, table, "tiny_lanes",
                    "The subtree stage's thread-per-node lanes, from the reference tree",
                    "(no GPU: the counts follow from the tree). Tiny nodes: the subtree "
                    "stage's nodes of 1 to 8 references (builder defaults); iterations: "
                    "ceil(candidates / 2) an axis; lanes busy: the nodes' iterations over 32 "
                    "times the warps' (the busiest lane's, per axis), records in a random "
                    "order (now), ordered by their iterations within each level (binned) or by "
                    "their references (by references); subtree a thread: each thread builds a "
                    "tiny root's whole subtree depth first, a warp's work its busiest lane's "
                    "(roots in a random order, by their subtree's work, by their references). "
                    "From `cpu_reference.build`.")


if __name__ == "__main__":
    main()
