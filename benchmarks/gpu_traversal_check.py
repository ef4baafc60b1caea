"""Check the GPU kd-tree traversal on every mesh of a folder; print PASS/FAIL, write JSON.

Run on a machine with a CUDA GPU::

    PYTHONPATH=. python benchmarks/gpu_traversal_check.py --mesh-dir /path/to/meshes --out OUT

For each mesh (``*.ply`` in ``--mesh-dir``):

1. build a tree with ``cpu_reference.build`` (or load it from ``--tree-cache``);
2. cast ``--rays`` random rays (``kdtree_gpu.testing.random_rays``: in and
   around the box, an eighth with axis-aligned or zero components, a quarter
   with random finite ``[tmin, tmax]``) with the GPU traversal, closest and
   any hit;
3. compare with the GPU brute force (every triangle, the same watertight test)
   on a strided subset sized by ``--brute-work`` ray-triangle tests, and with
   the CPU traversal on ``--cpu-rays`` rays (``kdtree_gpu.testing.compare_hits``:
   a ray matches when both miss, or both hit at t within 1e-5 relative, the
   same triangle or a tie);
4. for meshes that ``manifest.json`` marks watertight, shoot
   ``--watertight-rays`` rays in random directions from points inside the mesh
   (points found by stepping inward from triangle centroids and kept only when
   an odd number of crossings along three directions says they are inside);
   every ray must hit.

The table says PASS when every comparison matches and no ray escapes; the
JSON (``OUT/traversal_check.json``) has the counts and the first mismatches.
The exit status is 1 when any mesh fails.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MAX_REPORTED = 10


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mesh-dir", default=os.environ.get("KDTREE_GPU_MESH_DIR"),
                        help="folder of .ply meshes (default $KDTREE_GPU_MESH_DIR)")
    parser.add_argument("--out", required=True, help="folder for traversal_check.json")
    parser.add_argument("--meshes", default="", help="comma list of mesh names (default: all)")
    parser.add_argument("--rays", type=int, default=1_000_000)
    parser.add_argument("--brute-work", type=float, default=2e11,
                        help="ray-triangle tests for the brute-force subset")
    parser.add_argument("--cpu-rays", type=int, default=200_000)
    parser.add_argument("--watertight-rays", type=int, default=10_000_000)
    parser.add_argument("--tree-cache", default="", help="folder to load/save built trees")
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args(argv)
    if not args.mesh_dir or not Path(args.mesh_dir).is_dir():
        parser.error(f"--mesh-dir must be a folder of meshes, got {args.mesh_dir!r}")
    return args


def describe_mismatches(bad, origins, directions, ray_tmin, ray_tmax, answers):
    """The first mismatching rays with every answer, for the report."""
    rows = []
    for i in bad[:MAX_REPORTED]:
        row = {"ray": int(i), "origin": origins[i].tolist(), "direction": directions[i].tolist(),
               "tmin": float(ray_tmin[i]), "tmax": float(ray_tmax[i])}
        for name, (t, tri) in answers.items():
            row[name] = {"t": float(t[i]), "tri": int(tri[i])}
        rows.append(row)
    return rows


# --- inside points ----------------------------------------------------------------
def count_crossings(tree, points, direction, max_steps=10_000):
    """Number of surface crossings from each point along one direction (GPU).

    Repeated closest-hit queries, each starting just past the previous hit;
    hits at the same t (a shared edge) count once.
    """
    import cupy

    from kdtree_gpu.trace.gpu import intersect_gpu

    n = points.shape[0]
    origins = cupy.asarray(points, dtype=cupy.float32)
    directions = cupy.asarray(np.broadcast_to(direction.astype(np.float32), (n, 3)).copy())
    tmin = cupy.zeros(n, cupy.float32)
    tmax = cupy.full(n, np.inf, cupy.float32)
    crossings = cupy.zeros(n, cupy.int32)
    for _ in range(max_steps):
        t, tri, _, _ = intersect_gpu(tree, origins, directions, tmin, tmax)
        hit = tri >= 0
        if not bool(hit.any()):  # a deliberate sync: the loop ends when every ray is out
            break
        crossings += hit
        tmin = cupy.where(hit, cupy.nextafter(t, cupy.float32(np.inf)), cupy.float32(np.inf))
    return crossings.get()


def find_inside_points(tree, rng, num_candidates=20000):
    """Points inside a closed mesh: centroids stepped inward, checked by parity.

    Returns
    -------
    (k, 3) float32
        Points with an odd number of crossings along three random directions.
    """
    V = tree.vertices.astype(np.float64)
    F = tree.faces
    corners = V[F]
    normal = np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0])
    area = np.linalg.norm(normal, axis=1)
    valid = np.flatnonzero(area > 0)
    pick = rng.choice(valid, size=num_candidates, p=area[valid] / area[valid].sum())
    diag = float(np.linalg.norm(V.max(0) - V.min(0)))
    centroid = corners[pick].mean(1)
    unit = normal[pick] / area[pick, None]
    step = diag * np.where(rng.random(num_candidates) < 0.5, 1e-3, 1e-2)
    # both sides: the orientation of the faces is not trusted; parity decides
    side = np.where(rng.random(num_candidates) < 0.5, -1.0, 1.0)
    candidates = (centroid + side[:, None] * step[:, None] * unit).astype(np.float32)
    centre = (0.5 * (V.min(0) + V.max(0))).astype(np.float32)
    candidates = np.concatenate([centre[None], candidates])
    inside = np.ones(candidates.shape[0], bool)
    for _ in range(3):
        direction = rng.normal(size=3)
        direction /= np.linalg.norm(direction)
        inside &= count_crossings(tree, candidates, direction) % 2 == 1
    return candidates[inside]


# --- one mesh -----------------------------------------------------------------------
def load_or_build_tree(path, tree_cache):
    import kdtree_gpu as kd
    from cpu_reference import build

    cached = Path(tree_cache) / (path.stem + ".kdt") if tree_cache else None
    if cached is not None and cached.is_file():
        return kd.load_tree(cached), 0.0
    vertices, faces = kd.load_mesh(path)
    t0 = time.perf_counter()
    tree = build(vertices, faces)
    seconds = time.perf_counter() - t0
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tree.save(cached)
    return tree, seconds


def check_mesh(path, watertight, args, rng):
    import cupy

    from kdtree_gpu.testing import random_rays
    from kdtree_gpu.trace import gpu as rg

    record = {"mesh": path.stem, "watertight": bool(watertight)}
    tree, build_s = load_or_build_tree(path, args.tree_cache)
    record.update(triangles=tree.num_triangles, nodes=tree.num_nodes, refs=tree.num_refs,
                  build_s=build_s)
    O, D, tmin, tmax = random_rays(tree.bounds, args.rays, rng, special=1 / 8, intervals=1 / 4)
    rays = tuple(cupy.asarray(x) for x in (O, D, tmin, tmax))

    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    rg.intersect_gpu(tree, *rays)  # warm-up: compile and upload
    start.record()
    t, tri, u, v = rg.intersect_gpu(tree, *rays)
    end.record()
    end.synchronize()
    record["gpu_closest_mrays_per_s"] = args.rays / cupy.cuda.get_elapsed_time(start, end) / 1e3
    hit = rg.occluded_gpu(tree, *rays).get()
    t, tri = t.get(), tri.get()
    record["hit_fraction"] = float(np.mean(tri >= 0))
    failures = []

    # any hit agrees with closest hit on every ray
    bad_any = np.flatnonzero(hit != (tri >= 0))
    record["any_vs_closest"] = {"rays": args.rays, "mismatches": int(bad_any.size),
                                "first": bad_any[:MAX_REPORTED].tolist()}
    if bad_any.size:
        failures.append("any hit vs closest hit")

    # GPU brute force on a strided subset
    num_brute = int(min(args.rays, max(1000, args.brute_work // max(tree.num_triangles, 1))))
    sub = np.unique(np.linspace(0, args.rays - 1, num_brute).astype(np.int64))
    sub_rays = tuple(cupy.asarray(np.ascontiguousarray(x[sub])) for x in (O, D, tmin, tmax))
    t0 = time.perf_counter()
    bt, btri, _, _ = (x.get() for x in rg.brute_intersect_gpu(tree.vertices, tree.faces, *sub_rays))
    bhit = rg.brute_occluded_gpu(tree.vertices, tree.faces, *sub_rays).get()
    record["brute_s"] = time.perf_counter() - t0
    record["vs_brute"] = _subset_agreement("brute", sub, (bt, btri), bhit, (t, tri), hit,
                                           (O, D, tmin, tmax))
    if record["vs_brute"]["mismatches"] or record["vs_brute"]["any_hit_mismatches"]:
        failures.append("vs GPU brute force")

    # CPU traversal on a strided subset
    num_cpu = min(args.rays, args.cpu_rays)
    sub = np.unique(np.linspace(0, args.rays - 1, num_cpu).astype(np.int64))
    t0 = time.perf_counter()
    ct, ctri, _, _ = (np.asarray(x) for x in tree.intersect(O[sub], D[sub], tmin[sub], tmax[sub],
                                                               device="cpu"))
    chit = np.asarray(tree.occluded(O[sub], D[sub], tmin[sub], tmax[sub], device="cpu"))
    record["cpu_s"] = time.perf_counter() - t0
    record["vs_cpu"] = _subset_agreement("cpu", sub, (ct, ctri), chit, (t, tri), hit,
                                         (O, D, tmin, tmax))
    if record["vs_cpu"]["mismatches"] or record["vs_cpu"]["any_hit_mismatches"]:
        failures.append("vs CPU traversal")

    # watertightness: rays from inside a closed mesh always hit
    if watertight and args.watertight_rays > 0:
        inside = find_inside_points(tree, rng)
        record["inside_points"] = int(inside.shape[0])
        escapes, escaped = 0, []
        chunk = 2_000_000
        for first in range(0, args.watertight_rays, chunk):
            n = min(chunk, args.watertight_rays - first)
            origins = inside[rng.integers(0, inside.shape[0], n)]
            directions = rng.normal(size=(n, 3)).astype(np.float32)
            wt_rays = (cupy.asarray(origins), cupy.asarray(directions),
                       cupy.zeros(n, cupy.float32), cupy.full(n, np.inf, cupy.float32))
            wtri = rg.intersect_gpu(tree, *wt_rays)[1].get()
            miss = np.flatnonzero(wtri < 0)
            escapes += int(miss.size)
            for i in miss[:MAX_REPORTED - len(escaped)]:
                escaped.append({"origin": origins[i].tolist(), "direction": directions[i].tolist()})
        record["watertight_check"] = {"rays": args.watertight_rays, "escapes": escapes,
                                      "first": escaped}
        if inside.shape[0] == 0:
            failures.append("no inside point found")
        if escapes:
            failures.append("rays escaped")
    record["failures"] = failures
    record["status"] = "FAIL" if failures else "PASS"
    return record


def _scatter(values, index, n):
    full = np.full(n, -1 if values.dtype.kind == "i" else np.nan, dtype=values.dtype)
    full[index] = values
    return full


def _subset_agreement(name, sub, other, other_hit, gpu, gpu_hit, rays):
    """How the GPU's answers for the rays ``sub`` agree with ``other`` (closest and any hit)."""
    from kdtree_gpu.testing import compare_hits

    (t, tri), (ot, otri) = gpu, other
    n = t.size
    bad = np.flatnonzero(compare_hits((t[sub], tri[sub]), (ot, otri)).bad)
    bad_any = np.flatnonzero(other_hit != gpu_hit[sub])
    return {"rays": int(sub.size), "mismatches": int(bad.size), "any_hit_mismatches": int(bad_any.size),
            "same_triangle": float(np.mean(tri[sub] == otri)),
            "first": describe_mismatches(sub[bad], *rays,
                                         {"gpu": (t, tri),
                                          name: (_scatter(ot, sub, n), _scatter(otri, sub, n))})}


def read_watertight(mesh_dir):
    """``{stem: bool}`` from manifest.json's watertight field (empty when absent)."""
    manifest = Path(mesh_dir) / "manifest.json"
    if not manifest.is_file():
        return {}
    data = json.loads(manifest.read_text())
    return {Path(m["file"]).stem: bool(m.get("watertight_after_merging_coincident_vertices", False))
            for m in data.get("meshes", [])}


def device_name():
    """Name of the current CUDA device, e.g. ``"NVIDIA H200"``."""
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import git_commit  # noqa: E402  (re-exported for bench_traversal)


def print_table(records):
    header = (f"{'mesh':<22} {'tris':>8} {'nodes':>9} {'rays':>8} {'brute rays':>10} {'bad':>5} "
              f"{'cpu rays':>8} {'bad':>5} {'any bad':>7} {'wt rays':>9} {'escapes':>7} "
              f"{'Mrays/s':>8}  status")
    print(header)
    print("-" * len(header))
    for r in records:
        if "error" in r:
            print(f"{r['mesh']:<22} ERROR {r['error']}")
            continue
        wt = r.get("watertight_check", {})
        print(f"{r['mesh']:<22} {r['triangles']:>8} {r['nodes']:>9} {r['any_vs_closest']['rays']:>8} "
              f"{r['vs_brute']['rays']:>10} {r['vs_brute']['mismatches']:>5} "
              f"{r['vs_cpu']['rays']:>8} {r['vs_cpu']['mismatches']:>5} "
              f"{r['any_vs_closest']['mismatches']:>7} {wt.get('rays', '-'):>9} "
              f"{wt.get('escapes', '-'):>7} {r['gpu_closest_mrays_per_s']:>8.0f}  {r['status']}"
              + (f" ({', '.join(r['failures'])})" if r["failures"] else ""))


def main(argv=None):
    args = parse_args(argv)
    from kdtree_gpu.device import require_gpu

    require_gpu("gpu_traversal_check.py")
    rng = np.random.default_rng(args.seed)
    watertight = read_watertight(args.mesh_dir)
    paths = sorted(Path(args.mesh_dir).glob("*.ply"))
    if args.meshes:
        wanted = set(args.meshes.split(","))
        paths = [p for p in paths if p.stem in wanted]
    records = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        print(f"# {path.stem}", file=sys.stderr, flush=True)
        try:
            record = check_mesh(path, watertight.get(path.stem, False), args, rng)
        except Exception as exc:  # one broken mesh must not hide the others
            record = {"mesh": path.stem, "status": "FAIL", "error": f"{type(exc).__name__}: {exc}"}
        records.append(record)
        result = {"device": device_name(), "commit": git_commit(),
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "args": vars(args), "meshes": records}
        (out / "traversal_check.json").write_text(json.dumps(result, indent=1))
    print_table(records)
    failed = [r["mesh"] for r in records if r["status"] != "PASS"]
    print("ALL PASS" if not failed else f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
