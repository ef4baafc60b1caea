#!/usr/bin/env python3
"""Many meshes on several GPUs: ``kd.build_many`` on a local Dask cluster, 1 GPU against 2.

1. Makes a collection (deterministic, cached in ``--work``): the meshes of
   ``$KDTREE_GPU_MESH_DIR`` (``--mesh-dir``), each copy under a random
   rotation, anisotropic scale and translation, subdivided
   (``trimesh.remesh.subdivide``) to a size drawn log-uniformly between 1k and
   2M triangles; 200 meshes (``--count``).
2. For each worker count (``--gpus 1 2``): a local cluster with one worker per
   GPU (``kdtree_gpu.batch.local_client``, what ``kdtree-gpu build --workers N``
   starts), every worker warmed up (CUDA context, kernels) before the clock
   starts, then ``kd.build_many(..., client=client, force=True)`` into a folder
   of its own, timed from submission to the last tree on disk (loading,
   hashing, building, saving included; tree statistics with ``--stats``):
   meshes per second and triangles per second, and each worker's busy share
   of the wall time (Dask's task stream). With ``--rounds R`` every worker
   count runs R times, the order alternating between rounds; meshes per
   second is the median over rounds.
3. Checks the last round's trees of each worker count against those of one
   worker (single GPU): the same arrays (node order included, which implies
   ``tree.compare(other) is None``) and the same ``num_degenerate``; trees
   whose arrays differ are compared node by node with ``KdTree.compare``.
4. Writes ``batch_<gpu>.json`` and ``batch_<gpu>.md`` under ``--out``: the
   collection, each run (meshes/s, the GPU of each worker), the scaling (median
   meshes/s with the most GPUs over median meshes/s with one) and the comparison.

Usage (a machine with two GPUs; Dask, distributed and trimesh importable)::

    KDTREE_GPU_MESH_DIR=DIR PYTHONPATH=. python3 benchmarks/bench_batch.py --rounds 2 \\
        --out benchmarks/results

On a CPU (the whole pipeline, small)::

    PYTHONPATH=. python3 benchmarks/bench_batch.py --quick --device cpu --out /tmp/batch

Exit status: 0 when every mesh built and every tree equals the single-worker
build, else 1.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import git_commit, gpu_slug, utc_now  # noqa: E402

import kdtree_gpu as kd  # noqa: E402
from kdtree_gpu import batch  # noqa: E402

MIN_TRIANGLES = 1_000
MAX_TRIANGLES = 2_000_000
SCALING_GOAL = 1.8


# --- the collection ----------------------------------------------------------------------------

def write_ply(path: Path, vertices, faces) -> None:
    """Binary little-endian PLY: float32 vertices, int32 triangles (the shared meshes' layout)."""
    vertices = np.ascontiguousarray(vertices, dtype="<f4")
    records = np.empty(len(faces), dtype=[("n", "u1"), ("i", "<i4", 3)])
    records["n"] = 3
    records["i"] = faces
    header = ("ply\nformat binary_little_endian 1.0\n"
              f"element vertex {len(vertices)}\nproperty float x\nproperty float y\n"
              f"property float z\nelement face {len(faces)}\n"
              "property list uchar int vertex_indices\nend_header\n").encode("ascii")
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(vertices.tobytes())
        f.write(records.tobytes())
    os.replace(tmp, path)


def random_rotation(rng) -> np.ndarray:
    """(3, 3) rotation from a uniformly random unit quaternion."""
    q = rng.normal(size=4)
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def subdivision_levels(num_triangles: int, target: float, max_triangles: int) -> int:
    """Subdivision levels k (4^k triangles each) that come nearest ``target`` in the range."""
    k = 0
    while num_triangles * 4 ** k < MIN_TRIANGLES:
        k += 1
    while (num_triangles * 4 ** (k + 1) <= max_triangles
           and abs(math.log(num_triangles * 4 ** (k + 1) / target))
           < abs(math.log(num_triangles * 4 ** k / target))):
        k += 1
    return k


def make_mesh(task) -> dict:
    """One mesh of the collection (runs in a worker process); returns its description."""
    import trimesh

    index, base_path, out_path, seed, max_triangles = task
    rng = np.random.default_rng([seed, index])
    target = math.exp(rng.uniform(math.log(MIN_TRIANGLES), math.log(max_triangles)))
    vertices, faces = kd.load_mesh(base_path)
    levels = subdivision_levels(len(faces), target, max_triangles)
    rotation = random_rotation(rng)
    scale = np.exp(rng.uniform(math.log(0.25), math.log(4.0), size=3))
    vertices = np.asarray(vertices, np.float64)
    extent = float(np.ptp(vertices, axis=0).max()) or 1.0
    vertices = (vertices @ rotation.T) * scale + rng.normal(scale=10 * extent, size=3)
    for _ in range(levels):
        vertices, faces = trimesh.remesh.subdivide(vertices, faces)
    if not Path(out_path).is_file():
        write_ply(Path(out_path), vertices, faces)
    return {"mesh": Path(out_path).name, "base": Path(base_path).stem, "levels": levels,
            "triangles": int(len(faces))}


def make_collection(mesh_dir: Path, folder: Path, count: int, seed: int, max_triangles: int,
                    processes: int) -> list:
    """The collection's files (made once; kept in ``folder`` with a manifest)."""
    # the meshes that fit the size range as they are or subdivided
    bases = sorted(p for p in mesh_dir.glob("*.ply")
                   if len(kd.load_mesh(p)[1]) <= max_triangles)
    if not bases:
        raise SystemExit(f"no .ply meshes of at most {max_triangles} triangles in {mesh_dir} "
                         "(set --mesh-dir or KDTREE_GPU_MESH_DIR)")
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / "manifest.json"
    key = {"count": count, "seed": seed, "max_triangles": max_triangles,
           "bases": [p.name for p in bases]}
    if manifest.is_file():
        saved = json.loads(manifest.read_text())
        if saved.get("key") == key and all((folder / m["mesh"]).is_file()
                                           for m in saved["meshes"]):
            return saved["meshes"]
    tasks = [(i, str(bases[i % len(bases)]),
              str(folder / f"{i:03d}_{bases[i % len(bases)].stem}.ply"), seed, max_triangles)
             for i in range(count)]
    start = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(processes) as pool:
        meshes = list(pool.map(make_mesh, tasks))
    manifest.write_text(json.dumps({"key": key, "meshes": meshes}, indent=1))
    print(f"# made {count} meshes in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return meshes


# --- the runs ----------------------------------------------------------------------------------

def warm_up(device):
    """Run on every worker before the clock starts: CUDA context, kernels, numba's cache."""
    import kdtree_gpu

    vertices, faces = kdtree_gpu.scenes.cornell_box().arrays()
    tree = kdtree_gpu.build(vertices, faces, device=device)
    return tree.build_info.get("device")


def run_batch(paths, out: Path, workers: int, gpus, device: str, stats: bool) -> dict:
    """One timed ``build_many`` on a fresh local cluster of ``workers`` workers."""
    from distributed import get_task_stream

    shutil.rmtree(out, ignore_errors=True)
    with batch.local_client(workers, device=device, gpus=gpus, dashboard=False) as client:
        warmed = client.run(warm_up, device)
        with get_task_stream(client) as stream:
            start = time.perf_counter()
            report = kd.build_many(paths, out, client=client, device=device, force=True,
                                   stats=stats)
            seconds = time.perf_counter() - start
        layout = client.cluster.kdtree_gpu_layout
    built = report.built
    triangles = sum(r.triangles or 0 for r in built)
    per_gpu = {}  # meshes built by each GPU (by each worker on CPUs)
    for r in built:
        per_gpu[r.gpu or r.worker] = per_gpu.get(r.gpu or r.worker, 0) + 1
    return {
        "workers": workers, "gpus": gpus, "layout": layout, "warm_devices": sorted(warmed.values()),
        "seconds": seconds, "meshes": len(report), "built": len(built),
        "failed": [{"mesh": r.input, "error": r.error} for r in report.failed],
        "meshes_per_s": len(built) / seconds, "triangles_per_s": triangles / seconds,
        "meshes_per_gpu": per_gpu,
        "build_seconds_median": statistics.median(r.seconds for r in built) if built else None,
        "retries": sum(r.retries or 0 for r in report),
        "workers_busy": worker_busy(stream.data, seconds),
        "records": [{"mesh": Path(r.input).name, "triangles": r.triangles,
                     "build_ms": None if r.seconds is None else 1e3 * r.seconds,
                     "worker": r.worker, "gpu": r.gpu, "device": r.device}
                    for r in report],
    }


def worker_busy(stream, seconds) -> dict:
    """Per worker, from Dask's task stream: tasks, seconds computing, and the share of the
    batch's wall time spent computing (what is left is waiting for the scheduler or idle)."""
    busy = {}
    for task in stream:
        for part in task.get("startstops", ()):
            if part.get("action") == "compute":
                entry = busy.setdefault(task["worker"], {"tasks": 0, "compute_s": 0.0})
                entry["tasks"] += 1
                entry["compute_s"] += part["stop"] - part["start"]
    for entry in busy.values():
        entry["busy"] = entry["compute_s"] / seconds
    return busy


def same_tree(path_a: Path, path_b: Path):
    """None when the two tree files hold the same tree, else what differs."""
    from kdtree_gpu.tree.io import read_tree_file

    try:
        header_a, arrays_a = read_tree_file(path_a)
        header_b, arrays_b = read_tree_file(path_b)
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if header_a["num_degenerate"] != header_b["num_degenerate"]:
        return f"num_degenerate {header_a['num_degenerate']} vs {header_b['num_degenerate']}"
    if all(np.array_equal(arrays_a[k], arrays_b[k]) for k in arrays_a):
        return None
    # another node order: compare from the root down
    return kd.load_tree(path_a).compare(kd.load_tree(path_b))


def compare_runs(reference: Path, other: Path, names, threads: int) -> dict:
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(lambda n: same_tree(reference / n, other / n), names))
    differences = [{"tree": n, "difference": d} for n, d in zip(names, results) if d is not None]
    return {"trees": len(names), "identical": len(names) - len(differences),
            "differences": differences[:20]}


# --- the record ----------------------------------------------------------------------------------

def markdown(result) -> str:
    c = result["collection"]
    lines = [f"# Many meshes on {result['device_label']}: kd.build_many on a local Dask cluster",
             "",
             f"{result['date']}, commit {result['commit']}, Dask {result['dask']}, "
             f"Python {result['python']}.",
             "",
             f"Collection: {c['meshes']} meshes from {len(c['bases'])} shared meshes under random "
             f"transforms and subdivisions (seed {c['seed']}), {c['triangles_min']:,} to "
             f"{c['triangles_max']:,} triangles (median {c['triangles_median']:,}, total "
             f"{c['triangles_total']:,}). Timed from submission to the last tree saved "
             "(load, sha256, build, save" + (", tree statistics" if result["stats"] else "")
             + "); workers warmed up first.",
             "",
             "| round | workers | layout | seconds | meshes/s | Mtriangles/s | "
             "meshes per worker | workers busy | failed | retries |",
             "|---:|---:|---|---:|---:|---:|---|---|---:|---:|"]
    for run in result["runs"]:
        per = ", ".join(f"{k}: {v}" for k, v in sorted(run["meshes_per_gpu"].items()))
        busy = ", ".join(f"{100 * b['busy']:.0f}%" for b in run["workers_busy"].values())
        lines.append(f"| {run.get('round', 1)} | {run['workers']} | {run['layout']} | "
                     f"{run['seconds']:.2f} | "
                     f"{run['meshes_per_s']:.2f} | {run['triangles_per_s'] / 1e6:.2f} | {per} | "
                     f"{busy} | {len(run['failed'])} | {run['retries']} |")
    counts = sorted(result["median_meshes_per_s"], key=int)
    rounds = max(run.get("round", 1) for run in result["runs"])
    lines += ["",
              f"Scaling, {counts[-1]} workers over {counts[0]}: "
              f"**{result['scaling']:.2f}x** meshes/s"
              + (f" (medians of {rounds} rounds in alternating order)" if rounds > 1 else "")
              + f" (goal {SCALING_GOAL}x). Workers busy: the share of the batch's wall time each "
              "worker spent in its tasks (Dask's task stream); the rest is scheduling, waiting "
              "and the last task's tail.",
              ""]
    for check in result["comparisons"]:
        lines.append(f"Trees of {check['workers']} workers equal to the 1-worker build: "
                     f"{check['identical']} of {check['trees']}"
                     + ("" if not check["differences"] else
                        f" (first differences: {check['differences'][:3]})") + ".")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mesh-dir", type=Path,
                        default=os.environ.get("KDTREE_GPU_MESH_DIR") or ROOT / ".meshes")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--work", type=Path, default=Path("/tmp/kdtree-gpu-batch"),
                        help="the collection and the trees (kept for reruns)")
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--max-triangles", type=int, default=MAX_TRIANGLES)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2],
                        help="worker counts to run, one GPU each (default: 1 2)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of each worker count, in alternating order; meshes/s is "
                             "the median over rounds (default 1)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--quick", action="store_true",
                        help="a small collection (12 meshes of 1k to 20k triangles)")
    parser.add_argument("--keep-trees", action="store_true")
    parser.add_argument("--stats", action="store_true",
                        help="tree statistics in every record, as the command line prints them "
                             "(host work of one to two seconds per million triangles)")
    args = parser.parse_args(argv)
    if args.quick:
        args.count, args.max_triangles = min(args.count, 12), min(args.max_triangles, 20_000)
    processes = os.cpu_count() or 1

    meshes = make_collection(Path(args.mesh_dir), args.work / f"meshes_{args.count}_"
                             f"{args.max_triangles}_{args.seed}", args.count, args.seed,
                             args.max_triangles, processes)
    folder = args.work / f"meshes_{args.count}_{args.max_triangles}_{args.seed}"
    paths = [folder / m["mesh"] for m in meshes]
    triangles = [m["triangles"] for m in meshes]

    gpu_ids = []
    if args.device != "cpu":
        gpu_ids = batch.visible_gpus()
        if len(gpu_ids) < max(args.gpus):
            raise SystemExit(f"{max(args.gpus)} GPUs asked for, {len(gpu_ids)} visible")
        from kdtree_gpu.device import device_name

        label = device_name("cuda")
    else:
        label = "CPU"
    import dask

    result = {"date": utc_now(), "commit": git_commit(), "device_label": label,
              "device": args.device, "host": platform.node(), "python": platform.python_version(),
              "dask": dask.__version__, "cpu_count": processes,
              "collection": {"meshes": len(meshes), "seed": args.seed,
                             "bases": sorted({m["base"] for m in meshes}),
                             "triangles_min": min(triangles), "triangles_max": max(triangles),
                             "triangles_median": int(statistics.median(triangles)),
                             "triangles_total": sum(triangles), "files": meshes},
              "stats": args.stats, "runs": [], "comparisons": []}
    counts = sorted(set(args.gpus))
    for round_ in range(args.rounds):
        # rounds alternate the order, so that neither worker count always runs first
        for workers in (counts if round_ % 2 == 0 else counts[::-1]):
            gpus = gpu_ids[:workers] if gpu_ids else None
            print(f"# round {round_ + 1}: {workers} worker(s) {gpus or ''}", file=sys.stderr,
                  flush=True)
            run = run_batch(paths, args.work / f"trees_{workers}", workers, gpus, args.device,
                            args.stats)
            run["round"] = round_ + 1
            print(f"#   {run['seconds']:.2f} s, {run['meshes_per_s']:.2f} meshes/s, "
                  f"per worker {run['meshes_per_gpu']}", file=sys.stderr, flush=True)
            result["runs"].append(run)
    rate = {w: statistics.median(r["meshes_per_s"] for r in result["runs"] if r["workers"] == w)
            for w in counts}
    result["median_meshes_per_s"] = rate
    result["scaling"] = rate[counts[-1]] / rate[counts[0]]
    names = sorted(p.stem + ".kdt" for p in paths)
    for workers in counts[1:]:  # the last round's trees of each worker count
        check = compare_runs(args.work / f"trees_{counts[0]}",
                             args.work / f"trees_{workers}", names, processes)
        result["comparisons"].append({"workers": workers, **check})
    if not args.keep_trees:
        for workers in counts:
            shutil.rmtree(args.work / f"trees_{workers}", ignore_errors=True)

    stem = f"batch_{gpu_slug(label) if args.device != 'cpu' else 'cpu'}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    table = markdown(result)
    (args.out / f"{stem}.md").write_text(table)
    print(table)
    ok = (all(not run["failed"] for run in result["runs"])
          and all(not c["differences"] for c in result["comparisons"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
