#!/usr/bin/env python3
"""What the GPU build's phases write, computed from the reference tree (CPU only).

The GPU builder sizes the level loop's share of the tree and the subtree
stage's buffers before it knows what they will hold (a buffer that turns out
too small costs a relaunch or a second run of the stage; one too large is
device memory held at the peak). The tree is identical to
``cpu_reference.build``'s, and which nodes the loop defers follows from it:
a node is deferred when it holds at most ``small_refs`` references, its
parent more, and it is split. So this script, from the reference tree alone:

* counts each node's references (the distinct triangles of its subtree's
  leaves: without perfect splits a reference is a triangle);
* finds the deferred nodes and their references D;
* counts what the subtree stage writes (tree nodes and leaf entries) and
  holds (the records and references of each of its levels), per D;
* counts what the loop writes, per reference of the level it starts from
  (the root, or, when the first levels have more than ``loop_max_events``
  events and run by stages, which defer nothing, the first level that fits);

and prints them beside the sizes the builder reserves
(``builder/gpu/small.py``, ``builder/settings.default_loop_capacity``).
The deferred nodes, D and the subtree stage's widest levels agree exactly
with what GPU builds report (``build_info`` small_subtrees and
small_level_sizes, printed by ``trace_build_memory.py``; H100, bunny,
conference and the armadillo subdivided once, whose first levels run by
stages).
Meshes below ``small_min_refs`` references defer nothing and are skipped.

    python benchmarks/subtree_sizes.py --mesh-dir DIR [--meshes NAME ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MESHES = ["stanford_bunny", "sponza_dabrovic", "happy_buddha_100k", "lucy_100k",
          "stanford_dragon_res2", "conference", "stanford_armadillo", "stanford_armadillo@sub1"]

# what the builder reserves, per deferred reference D (small.py) and per reference
# of the loop's start level (settings.default_loop_capacity, small_refs >= 48)
# (the stage's nodes: its first room, before the nodes the build's peak leaves
# free, small.room_under_peak, are added)
RESERVED = {"stage nodes": 4.5, "stage leaf entries": 4.5, "widest records": 0.65,
            "widest refs": 2.4, "loop nodes": 1, "loop leaf entries": 4}
# rooms for the subtree stage's tree nodes, per D, whose running out is reported:
# the level of the stage that would find it full, the share of the stage's work
# (references its levels process) that level holds (what a run that goes on from
# the full level does twice: the levels after it return at once in the run that
# found it full), and the share from that level on (what a second run of every
# level from there does again)
ROOMS = (2, 3, 4, 4.5)


def tree_levels(node_axis, node_child, leaf):
    """(parent, depth) of every node of a tree stored with children side by side."""
    n = node_axis.shape[0]
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    inner = np.flatnonzero(node_axis != leaf)
    parent[node_child[inner]] = inner
    parent[node_child[inner] + 1] = inner
    frontier = np.array([0])
    d = 0
    while frontier.size:
        depth[frontier] = d
        frontier = frontier[node_axis[frontier] != leaf]
        frontier = np.concatenate([node_child[frontier], node_child[frontier] + 1])
        d += 1
    return parent, depth


def level_pairs(tree, parent, depth, leaf):
    """The references of the nodes of each depth, deepest first: ``(pairs, m)`` with
    ``pairs = node * m + triangle``, the distinct triangles among each node's
    subtree's leaf entries (without perfect splits a reference is a triangle)."""
    axis, child, count = tree.node_axis, tree.node_child, tree.node_count
    leaves = np.flatnonzero((axis == leaf) & (count > 0))
    owner = np.repeat(leaves, count[leaves])
    starts = np.repeat(child[leaves] - np.cumsum(count[leaves]) + count[leaves], count[leaves])
    tris = tree.leaf_tris[starts + np.arange(owner.size)].astype(np.int64)
    m = int(tris.max()) + 1 if tris.size else 1
    pending = owner * m + tris  # (node, triangle) pairs, deepest level first
    pair_depth = depth[owner]
    carried = np.zeros(0, dtype=np.int64)
    for d in range(int(depth.max()), -1, -1):
        here = np.unique(np.concatenate([pending[pair_depth == d], carried]))
        yield here, m
        up = parent[here // m]
        keep = up >= 0
        carried = up[keep] * m + here[keep] % m


def node_references(tree, parent, depth, leaf, weight):
    """References of every node (:func:`level_pairs`), and the sum of
    ``weight[triangle]`` over them."""
    refs = np.zeros(tree.node_axis.shape[0], dtype=np.int64)
    weighted = np.zeros(tree.node_axis.shape[0], dtype=np.int64)
    for here, m in level_pairs(tree, parent, depth, leaf):
        nodes = here // m
        refs += np.bincount(nodes, minlength=refs.size)
        weighted += np.bincount(nodes, weights=weight[here % m],
                                minlength=refs.size).astype(np.int64)
    return refs, weighted


def phases(tree, depth, refs, events, leaf, small_refs, small_min_refs, max_events,
           stay_events=None):
    """Which phase runs each level, and which nodes are deferred.

    Level by level, as the driver goes (``builder/gpu/__init__.py``,
    ``level_loop.loop_plan``): a level of at most ``max_events`` events starts
    the loop if its children fit in ``stay_events`` (``GpuSettings.loop_stay_bound``,
    1.5 ``max_events`` by default), and the loop keeps going while they do;
    a launch defers its split nodes of at most ``small_refs`` references when
    its start level holds at least ``small_min_refs`` references. Every other
    level runs by stages, which defer the same nodes when the root holds at
    least ``small_min_refs`` references (``LoopState.small_refs``). A deferred
    node's subtree is the subtree stage's.

    Returns
    -------
    deferred : (num_nodes,) bool
    runs : list of (first, last) levels run in the loop, one per launch
    stage_levels : int
        Levels run by stages.
    """
    axis, child = tree.node_axis, tree.node_child
    stay = 3 * max_events // 2 if stay_events is None else stay_events
    deferred = np.zeros(axis.shape[0], dtype=bool)
    stage_small = small_refs if refs[0] >= small_min_refs else 0
    level = np.array([0])
    runs, d, in_loop, stage_levels, loop_small = [], 0, False, 0, 0
    while level.size:
        split = level[axis[level] != leaf]
        small = loop_small if in_loop else (
            small_refs if refs[level].sum() >= small_min_refs else 0)
        defer = split[refs[split] <= small]
        kept = np.setdiff1d(split, defer)
        need = events[child[kept]].sum() + events[child[kept] + 1].sum()
        loop = need <= stay and (in_loop or events[level].sum() <= max_events)
        if loop:
            if not in_loop:
                runs.append([d, d])
                loop_small = small
            runs[-1][1] = d
        else:
            defer = split[refs[split] <= stage_small]
            kept = np.setdiff1d(split, defer)
            stage_levels += 1
        deferred[defer] = True
        in_loop = loop
        level = np.concatenate([child[kept], child[kept] + 1])
        d += 1
    return deferred, runs, stage_levels


def sizes(spec, mesh_dir, small_refs=64, small_min_refs=32768, max_events=1 << 23):
    import cpu_reference
    from bench_build import load
    from kdtree_gpu import encoding as enc
    from kdtree_gpu.mesh import triangle_bounds

    V, F = load(spec, mesh_dir)
    t0 = time.perf_counter()
    tree = cpu_reference.build(V, F)
    seconds = time.perf_counter() - t0
    leaf = enc.AXIS_LEAF
    parent, depth = tree_levels(tree.node_axis, tree.node_child, leaf)
    # a triangle's events: one per axis where its box is flat, else two
    lo, hi = triangle_bounds(V, F)
    refs, events = node_references(tree, parent, depth, leaf,
                                   np.where(lo == hi, 1, 2).sum(axis=1).astype(np.int64))
    num_root = int(refs[0])
    row = {"mesh": spec, "triangles": int(F.shape[0]), "root_refs": num_root,
           "nodes": int(tree.num_nodes), "leaf_entries": int(tree.num_refs),
           "reference_build_s": round(seconds, 2)}
    if num_root < small_min_refs:
        row["deferred"] = 0
        return row
    split = tree.node_axis != leaf
    deferred, runs, stage_levels = phases(tree, depth, refs, events, leaf, small_refs,
                                          small_min_refs, max_events)
    # every node below a deferred node is the subtree stage's
    in_stage = np.zeros(refs.size, dtype=bool)
    rel = np.full(refs.size, -1, dtype=np.int64)  # depth below its deferred root
    order = np.argsort(depth, kind="stable")
    for i in order:
        p = parent[i]
        if p >= 0 and (deferred[p] or in_stage[p]):
            in_stage[i] = True
            rel[i] = rel[p] + 1
        if deferred[i]:
            rel[i] = 0
    D = int(refs[deferred].sum())
    if D == 0:  # (nothing deferred: e.g. small_refs 0)
        row.update({"loop_levels": runs, "stage_levels": stage_levels, "deferred": 0})
        return row
    stage_nodes = int(in_stage.sum())
    stage_leaves = in_stage & ~split
    stage_entries = int(refs[stage_leaves].sum())
    live = in_stage & (refs > 0)
    levels = []
    for k in range(1, int(rel.max()) + 1):
        at = live & (rel == k)
        levels.append((int(at.sum()), int(refs[at].sum())))
    # level L of the stage processes the nodes at L below their deferred roots
    # (its references: the work) and writes the nodes at L + 1
    depth_rel = int(rel.max()) + 1
    work = np.array([int(refs[live & (rel == k)].sum()) for k in range(depth_rel)])
    written = np.array([int((in_stage & (rel == k + 1)).sum()) for k in range(depth_rel)])
    runs_out = {}
    for room in ROOMS:
        full = np.flatnonzero(np.cumsum(written) > room * refs[deferred].sum())
        if full.size:
            level = int(full[0])
            runs_out[f"{room} D"] = [level, round(float(work[level] / work.sum()), 3),
                                     round(float(work[level:].sum() / work.sum()), 3)]
        else:
            runs_out[f"{room} D"] = None
    # what each launch of the loop writes (its levels' nodes, their leaf entries
    # and the deferred nodes' entries, later holes), per reference of its first level
    loop_nodes = loop_entries = 0.0
    for first, last in runs:
        at = ~in_stage & (depth >= first) & (depth <= last)
        start_refs = refs[at & (depth == first)].sum()
        loop_nodes = max(loop_nodes, at.sum() / start_refs)
        written = refs[at & (~split | deferred)].sum()
        loop_entries = max(loop_entries, written / start_refs)
    row.update({
        "loop_levels": runs, "stage_levels": stage_levels,
        "deferred": int(deferred.sum()), "D": D, "D_per_triangle": round(D / F.shape[0], 3),
        "stage nodes": round(stage_nodes / D, 3), "stage leaf entries": round(stage_entries / D, 3),
        "widest records": round(max(r for r, _ in levels) / D, 3),
        "widest refs": round(max(f for _, f in levels) / D, 3),
        "subtree levels": len(levels),
        "loop nodes": round(float(loop_nodes), 3),
        "loop leaf entries": round(float(loop_entries), 3),
        "stage level work": work.tolist(), "stage level nodes": written.tolist(),
        "node room runs out": runs_out,
    })
    return row


def table(rows):
    keys = list(RESERVED)
    head = ["mesh", "triangles", "loop levels", "deferred", "D / tri"]
    head += [f"{k} (reserved {RESERVED[k]})" for k in keys]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if not r.get("deferred"):
            lines.append(f"| {r['mesh']} | {r['triangles']:,} | below small_min_refs |"
                         + " |" * (len(head) - 3))
            continue
        runs = ", ".join(f"{a}-{b}" for a, b in r["loop_levels"])
        cells = [r["mesh"], f"{r['triangles']:,}", runs, f"{r['deferred']:,}",
                 f"{r['D_per_triangle']:.2f}"]
        cells += [f"{r[k]:.2f}" + (" **over**" if r[k] > RESERVED[k] else "") for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Where a room of R D tree nodes would run out in the subtree stage: the "
              "level that finds it full, the share of the stage's work (references its "
              "levels process) in that level, and from that level on.", "",
              "| mesh | levels | " + " | ".join(f"{room} D" for room in ROOMS) + " |",
              "|" + "---|" * (2 + len(ROOMS))]
    for r in rows:
        if not r.get("deferred"):
            continue
        out = r["node room runs out"]
        cells = [f"level {out[k][0]}: {100 * out[k][1]:.0f}%, {100 * out[k][2]:.0f}% on"
                 if out[k] else "fits"
                 for k in (f"{room} D" for room in ROOMS)]
        lines.append(f"| {r['mesh']} | {r['subtree levels']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tree_model_main(doc, meshes, model, table, stem, title, what, extra=None):
    """The command line of a script that models the GPU build from the reference tree:
    ``model(spec, mesh_dir)`` gives each mesh's row (printed as JSON), ``table(rows)``
    the Markdown table, printed after a line naming the commit, the date and ``what``
    the rows are; ``--out DIR`` writes ``<stem>.md`` (under ``title``) and
    ``<stem>.json`` (the rows, beside ``extra``)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--mesh-dir", default=os.environ.get("KDTREE_GPU_MESH_DIR", ".meshes"))
    parser.add_argument("--meshes", nargs="+", default=meshes)
    parser.add_argument("--out", help=f"write {stem}.md/.json here")
    args = parser.parse_args()
    rows = []
    for spec in args.meshes:
        rows.append(model(spec, args.mesh_dir))
        print(json.dumps(rows[-1]), flush=True)
    import platform

    from _common import git_commit, utc_now

    commit, date = git_commit(), utc_now()
    text = f"commit `{commit}`, {date}, {platform.machine()} CPU {what}\n\n" + table(rows)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        record = {"commit": commit, "date": date, **(extra or {}), "meshes": rows}
        (out / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
        (out / f"{stem}.md").write_text(f"# {title}\n\n" + text + "\n")


def main():
    tree_model_main(__doc__, MESHES, sizes, table, "subtree_sizes",
                    "What the GPU build's phases write",
                    "(no GPU: the sizes follow from the tree). Stage nodes and leaf entries, "
                    "widest records and refs: per deferred reference D; loop nodes and leaf "
                    "entries: per reference of the loop's start level. From "
                    "`cpu_reference.build` (small_refs 64).", {"reserved": RESERVED})


if __name__ == "__main__":
    main()
