#!/usr/bin/env python3
"""How many of a warp node's bounds are candidate planes, from the reference tree (CPU only).

The subtree stage gives each node of 9 to 64 references a warp
(``cuda/small_split.cuh``, ``kd_small_best_split``): lane l holds references l
and l + 32, and counts and costs the planes at its references' two bounds on
each axis, 2 NQ slots a lane (NQ = 1 up to 32 references, else 2), whether a
bound is a candidate or not. A candidate is a bound strictly inside the
node's box (a planar reference's one event). Listing the warp's candidates
first and giving each lane ``ceil(candidates / 32)`` of them would take
fewer slots; this script says how many, from ``cpu_reference.build``'s tree
(identical to the GPU's), so that the idea can be judged before it is
written:

* a node's references are the distinct triangles of its subtree's leaves
  (without perfect splits a reference is a triangle), its box follows from
  the root's box and the splits above it;
* the subtree stage's nodes are those below the nodes the loop defers
  (``subtree_sizes.phases``, the builder's defaults);
* for each warp node and axis: the bounds strictly inside the box, and the
  lane slots a list would take (``ceil(candidates / 32)``) against ``2 NQ``.

    python benchmarks/probe_warp_candidates.py --mesh-dir DIR [--meshes NAME ...] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MESHES = ["stanford_bunny", "happy_buddha_100k", "conference", "stanford_armadillo"]


def node_boxes(tree, depth, leaf):
    """Every node's box: the root's, cut by the splits above it."""
    axis, child, split = tree.node_axis, tree.node_child, tree.node_split
    lo = np.zeros((axis.shape[0], 3), np.float32)
    hi = np.zeros((axis.shape[0], 3), np.float32)
    lo[0], hi[0] = np.asarray(tree.bounds, dtype=np.float32)
    for i in np.argsort(depth, kind="stable"):
        a = axis[i]
        if a == leaf:
            continue
        c = child[i]
        lo[c], hi[c] = lo[i], hi[i]
        hi[c, a] = split[i]
        lo[c + 1], hi[c + 1] = lo[i], hi[i]
        lo[c + 1, a] = split[i]
    return lo, hi


def stage_model(spec, mesh_dir, small_refs=64, small_min_refs=32768, max_events=1 << 23):
    """The subtree stage's nodes of a mesh's reference tree (builder defaults).

    Returns
    -------
    (row, model) : row ``{"mesh", "triangles"}``; model None where the build
        defers nothing, else a namespace: tree, depth, leaf (the leaf axis code),
        node and tri (every (node, triangle) reference pair), refs (each node's
        references), in_stage (the nodes the subtree stage builds), tri_lo and
        tri_hi (the triangles' boxes), n (nodes).
    """
    import cpu_reference
    from bench_build import load
    from subtree_sizes import level_pairs, phases, tree_levels

    from kdtree_gpu import encoding as enc
    from kdtree_gpu.mesh import triangle_bounds

    V, F = load(spec, mesh_dir)
    tree = cpu_reference.build(V, F)
    leaf = enc.AXIS_LEAF
    parent, depth = tree_levels(tree.node_axis, tree.node_child, leaf)
    tri_lo, tri_hi = triangle_bounds(V, F)
    levels = list(level_pairs(tree, parent, depth, leaf))
    m = levels[0][1]
    pairs = np.concatenate([here for here, _ in levels])
    n = tree.node_axis.shape[0]
    node, tri = pairs // m, pairs % m
    refs = np.bincount(node, minlength=n)
    events = np.bincount(node, weights=np.where(tri_lo == tri_hi, 1, 2).sum(axis=1)[tri],
                         minlength=n).astype(np.int64)
    row = {"mesh": spec, "triangles": int(F.shape[0])}
    if refs[0] < small_min_refs:
        return row, None
    deferred, _, _ = phases(tree, depth, refs, events, leaf, small_refs, small_min_refs,
                            max_events)
    in_stage = np.zeros(n, bool)
    for i in np.argsort(depth, kind="stable"):
        p = parent[i]
        in_stage[i] = deferred[i] or (p >= 0 and in_stage[p])
    return row, SimpleNamespace(tree=tree, depth=depth, leaf=leaf, node=node, tri=tri, refs=refs,
                                in_stage=in_stage, tri_lo=tri_lo, tri_hi=tri_hi, n=n)


def candidates(spec, mesh_dir, small_refs=64, small_min_refs=32768, max_events=1 << 23):
    from kdtree_gpu import encoding as enc

    row, s = stage_model(spec, mesh_dir, small_refs, small_min_refs, max_events)
    if s is None:
        return {**row, "warp_nodes": 0}
    node, tri = s.node, s.tri
    # the warp path evaluates every such node (the leaf test comes after its best plane)
    warp = s.in_stage & (s.refs > enc.SMALL_TINY_REFS) & (s.refs <= enc.SMALL_MAX_REFS)
    keep = warp[node]
    node, tri = node[keep], tri[keep]
    box_lo, box_hi = node_boxes(s.tree, s.depth, s.leaf)
    nq = np.where(s.refs[warp] > 32, 2, 1)
    bounds = inside = slots_now = slots_listed = 0
    by_k = np.zeros(5, np.int64)  # node axes by ceil(candidates / 32)
    for a in range(3):
        lo, hi = s.tri_lo[tri, a], s.tri_hi[tri, a]
        nlo, nhi = box_lo[node, a], box_hi[node, a]
        is_lo = (lo > nlo) & (lo < nhi)
        is_hi = (hi != lo) & (hi > nlo) & (hi < nhi)
        per_node = np.bincount(node, weights=is_lo.astype(np.int64) + is_hi, minlength=s.n)[warp]
        k = np.ceil(per_node / 32).astype(np.int64)
        by_k += np.bincount(k, minlength=5)[:5]
        bounds += 2 * int(s.refs[warp].sum())
        inside += int(per_node.sum())
        slots_now += int((2 * nq).sum())
        slots_listed += int(k.sum())
    r = s.refs[warp]
    return {**row, "warp_nodes": int(warp.sum()), "mean_refs": round(float(r.mean()), 1),
            "over_32_refs": round(float((r > 32).mean()), 3),
            "candidates_per_bound": round(inside / bounds, 3),
            "lane_slots_now": slots_now, "lane_slots_listed": slots_listed,
            "listed_per_now": round(slots_listed / slots_now, 3),
            "node_axes_by_lane_slots": by_k.tolist()}


def table(rows):
    lines = ["| mesh | triangles | warp nodes | mean refs | share over 32 | candidates / bounds "
             "| lane slots now | listed | listed / now | node axes with 0 / 1 / 2 / 3 / 4 listed "
             "slots |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if not r["warp_nodes"]:
            lines.append(f"| {r['mesh']} | {r['triangles']:,} | (defers nothing) |" + " |" * 7)
            continue
        lines.append(f"| {r['mesh']} | {r['triangles']:,} | {r['warp_nodes']:,} | "
                     f"{r['mean_refs']} | {r['over_32_refs']:.1%} | "
                     f"{r['candidates_per_bound']:.2f} | {r['lane_slots_now']:,} | "
                     f"{r['lane_slots_listed']:,} | {r['listed_per_now']:.2f} | "
                     + " / ".join(f"{x:,}" for x in r["node_axes_by_lane_slots"]) + " |")
    return "\n".join(lines)


def main():
    from subtree_sizes import tree_model_main

    tree_model_main(__doc__, MESHES, candidates, table, "warp_candidates",
                    "Candidate planes of the subtree stage's warp nodes",
                    "(no GPU: the counts follow from the reference tree, `cpu_reference.build`, "
                    "the builder's default settings).")


if __name__ == "__main__":
    main()
