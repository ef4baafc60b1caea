"""CPU closest-hit ray casting beside Embree, on the same rays, in the same run.

For each mesh, a tree from the CPU reference builder (``cpu_reference.build``)
and an Embree scene (embreex) are cast the same 1M rays, made by the peers'
generators (``peer_bench.make_primary_rays`` and ``make_diffuse_rays`` from
``--peers-dir``, not copied here): a 1000 x 1000 pinhole camera outside the
mesh (coherent) and 1M diffuse rays leaving the surface (incoherent).

Three columns, every core each:

* ``ours``: ``tree.intersect(origins, directions, device="cpu")``, the public
  call with its ray checks;
* ``kernel``: ``kdtree_gpu.trace.cpu.intersect_cpu``, the traversal alone;
* ``embree``: ``scene.run(origins, directions, output=1)`` over chunks of
  16384 rays on a thread pool of ``os.cpu_count()`` threads (``run``
  releases the GIL; one call would use one core);
* with ``--baseline COMMIT``, ``before``: ``intersect_cpu`` of
  ``kdtree_gpu/trace/cpu.py`` as it was at that commit (the files of
  ``kdtree_gpu/trace/`` read with ``git show`` and imported beside the
  current ones; same tree).

Every column is warmed up first (numba compiles or loads its cache, Embree
commits its scene). The timed calls go round-robin (ours, kernel, Embree,
ours, ...) so that a background load hits every column alike. The machine
may be shared: during each call the script measures the CPU time other
processes took (``/proc/stat`` less this process's ``os.times()``); a round
is *clean* when they kept fewer than 0.15 cores busy. Rounds go on (at most
``4 * repeats``) until ``repeats`` are clean. A column's rate is the median
over the clean rounds (all rounds when fewer than three are clean); a ratio
is the median over those rounds of the ratio of two calls of one round.

Agreement with Embree (another float32 ray-triangle test, so rays through
an edge may go either way): the share of rays with the same hit or miss,
and of the rays both hit, the share on the same triangle or at the same
``t`` within ``1e-4 * t + 1e-6 * diagonal`` (a tie: a shared edge).

Writes ``<out>/cpu_rays.json`` (one JSON object per line: mesh, rays, rates,
ratios, agreement, machine, commit, date) and ``<out>/cpu_rays.md``.

Usage::

    python benchmarks/bench_cpu_rays.py [--meshes stanford_bunny conference] [--repeats 7]
        [--peers-dir ../shared/peers] [--baseline fd05895] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import git_commit, md_row, utc_now  # noqa: E402

EMBREE_CHUNK = 16384
CLEAN_LIMIT = 0.15  # cores other processes may keep busy during a clean round
T_RTOL = 1e-4
T_ATOL_DIAGONALS = 1e-6


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--meshes", nargs="+", default=["stanford_bunny", "conference"])
    p.add_argument("--mesh-dir", default=str(ROOT.parent / "shared" / "meshes"))
    p.add_argument("--peers-dir", default=str(ROOT.parent / "shared" / "peers"))
    p.add_argument("--width", type=int, default=1000)
    p.add_argument("--height", type=int, default=1000)
    p.add_argument("--diffuse", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--baseline", default=None,
                   help="a commit whose trace/cpu.py is timed beside (the kernel before)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    return p.parse_args(argv)


def load_baseline(commit):
    """``kdtree_gpu.trace.cpu`` as it was at ``commit``, as a module of its own.

    The files of ``kdtree_gpu/trace/`` at that commit are written once to a
    folder named after it (so that numba's cache of them survives between
    runs) and imported as the package ``kdtree_gpu._baseline_<sha>``, whose
    ``cpu`` module and its siblings import one another as they did then.
    """
    import importlib.util
    import subprocess
    import tempfile

    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout

    sha = git("rev-parse", commit).strip()
    folder = Path(tempfile.gettempdir()) / f"kdtree_gpu_baseline_{sha[:12]}" / "trace"
    if not folder.is_dir():
        part = folder.with_name("trace.part")
        part.mkdir(parents=True, exist_ok=True)
        for path in git("ls-tree", "--name-only", sha, "kdtree_gpu/trace/").split():
            if path.endswith(".py"):
                (part / Path(path).name).write_text(git("show", f"{sha}:{path}"))
        part.rename(folder)
    name = f"kdtree_gpu._baseline_{sha[:12]}"
    # the package without running its __init__ (which imports the API of then)
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    sys.modules[name] = importlib.util.module_from_spec(spec)
    return importlib.import_module(f"{name}.cpu")


# --- timing on a shared machine --------------------------------------------------
def busy_cpu_seconds():
    """CPU seconds the whole machine has spent (all processes); None without /proc."""
    try:
        values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(values[:8]) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def timed(fn):
    """Wall seconds of ``fn()`` and the cores other processes kept busy meanwhile."""
    busy0, own0 = busy_cpu_seconds(), os.times()
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    busy1, own1 = busy_cpu_seconds(), os.times()
    if busy0 is None:
        return seconds, None
    own = (own1.user - own0.user) + (own1.system - own0.system)
    return seconds, max(0.0, (busy1 - busy0) - own) / seconds


def time_round_robin(calls, repeats, warmup):
    """Seconds of each call per round, rounds taken until ``repeats`` are clean.

    Returns the rounds used (the clean ones, or all when fewer than three are
    clean), each a list of seconds in the order of ``calls``, and the count
    of clean and of all rounds.
    """
    for _ in range(warmup):
        for fn in calls:
            fn()
    clean, every = [], []
    while len(clean) < repeats and len(every) < 4 * repeats:
        samples = [timed(fn) for fn in calls]
        seconds = [s for s, _ in samples]
        every.append(seconds)
        if all(o is None or o < CLEAN_LIMIT for _, o in samples):
            clean.append(seconds)
        else:
            time.sleep(1.0)  # let the other work pass
    return (clean if len(clean) >= 3 else every), len(clean), len(every)


# --- the contenders ----------------------------------------------------------------
class Embree:
    """An Embree scene cast from a thread pool over chunks of rays (every core)."""

    def __init__(self, V, F, threads):
        from embreex import rtcore_scene
        from embreex.mesh_construction import TriangleMesh

        self.scene = rtcore_scene.EmbreeScene()
        TriangleMesh(self.scene, V[F])
        self.pool = ThreadPoolExecutor(threads)

    def intersect(self, O, D):
        chunks = [slice(a, min(len(O), a + EMBREE_CHUNK)) for a in range(0, len(O), EMBREE_CHUNK)]
        parts = list(self.pool.map(lambda s: self.scene.run(O[s], D[s], output=1), chunks))
        tri = np.concatenate([p["primID"] for p in parts]).astype(np.int32)
        t = np.concatenate([p["tfar"] for p in parts]).astype(np.float32)
        return np.where(tri >= 0, t, np.float32(np.inf)), tri


def agreement(t, tri, t_ref, tri_ref, diagonal):
    """Shares of rays with Embree's hit or miss, and of common hits on its triangle or t."""
    hit, hit_ref = tri >= 0, tri_ref >= 0
    both = hit & hit_ref
    dt = np.abs(t[both].astype(np.float64) - t_ref[both])
    tie = dt <= T_RTOL * np.abs(t_ref[both]) + T_ATOL_DIAGONALS * diagonal
    same = (tri[both] == tri_ref[both]) | tie
    return {"same_hit_or_miss": float(np.mean(hit == hit_ref)),
            "hits_only_ours": int(np.sum(hit & ~hit_ref)),
            "hits_only_embree": int(np.sum(~hit & hit_ref)),
            "same_triangle_or_t": float(np.mean(same)) if both.any() else 1.0,
            "other_triangle": int(np.sum(~same)),
            "hit_share": float(np.mean(hit))}


# --- one mesh ---------------------------------------------------------------------
def bench_mesh(name, args, pb, machine, baseline):
    import cpu_reference
    from kdtree_gpu.mesh import load_mesh
    from kdtree_gpu.trace.cpu import intersect_cpu

    V, F = load_mesh(Path(args.mesh_dir) / f"{name}.ply")
    start = time.perf_counter()
    tree = cpu_reference.build(V, F)
    build_s = time.perf_counter() - start
    embree = Embree(V, F, os.cpu_count() or 1)
    diagonal = float(np.linalg.norm(V.max(axis=0) - V.min(axis=0)))
    rays = {"primary": pb.make_primary_rays(V, args.width, args.height),
            "diffuse": pb.make_diffuse_rays(V, F, args.diffuse, seed=args.seed)}
    records = []
    for kind, (O, D) in rays.items():
        n = len(O)
        t0, t1 = np.zeros(n, np.float32), np.full(n, np.inf, np.float32)
        calls = [lambda: tree.intersect(O, D, device="cpu"),
                 lambda: intersect_cpu(tree, O, D, t0, t1),
                 lambda: embree.intersect(O, D)]
        if baseline is not None:
            calls.append(lambda: baseline.intersect_cpu(tree, O, D, t0, t1))
        rounds, clean, total = time_round_robin(calls, args.repeats, args.warmup)
        ours_s, kernel_s, embree_s = (statistics.median(r[k] for r in rounds) for k in range(3))
        t, tri, _, _ = tree.intersect(O, D, device="cpu")
        t_ref, tri_ref = embree.intersect(O, D)
        record = {
            "mesh": name, "triangles": int(len(F)), "rays": kind, "num_rays": int(n),
            "ours_mrays_per_s": n / ours_s / 1e6,
            "kernel_mrays_per_s": n / kernel_s / 1e6,
            "embree_mrays_per_s": n / embree_s / 1e6,
            "ours_over_embree": statistics.median(r[2] / r[0] for r in rounds),
            "kernel_over_embree": statistics.median(r[2] / r[1] for r in rounds),
            "seconds": {"ours": [r[0] for r in rounds], "kernel": [r[1] for r in rounds],
                        "embree": [r[2] for r in rounds]},
            **({} if baseline is None else {
                "baseline_commit": args.baseline,
                "before_mrays_per_s": n / statistics.median(r[3] for r in rounds) / 1e6,
                "before_over_embree": statistics.median(r[2] / r[3] for r in rounds),
                "kernel_over_before": statistics.median(r[3] / r[1] for r in rounds)}),
            "clean_rounds": clean, "rounds": total,
            "agreement": agreement(t, tri, t_ref, tri_ref, diagonal),
            "tree": {"nodes": int(tree.num_nodes), "references": int(tree.num_refs),
                     "build_s": build_s},
            **machine}
        records.append(record)
        print(json.dumps({k: v for k, v in record.items() if k != "seconds"}), flush=True)
    return records


def markdown_table(records):
    first = records[0] if records else {}
    lines = [
        "# CPU closest-hit ray casting beside Embree",
        "",
        f"{first.get('cpu', '?')}, {first.get('cpu_count', '?')} cores; commit "
        f"{first.get('commit', '?')}, {first.get('date', '?')}. "
        "`python benchmarks/bench_cpu_rays.py` (rays from `peer_bench.py`: a 1000 x 1000 "
        "camera and 1M diffuse rays; every column on every core; medians of clean rounds, "
        "ratios per round).",
        "",
        md_row("mesh", "rays", "ours Mrays/s", "kernel Mrays/s", "Embree Mrays/s",
               "ours / Embree", "kernel / Embree", "before Mrays/s", "kernel / before",
               "same hit/miss", "same triangle or t", "clean rounds"),
        md_row(*["---"] * 2, *["---:"] * 10),
    ]
    for r in records:
        a = r["agreement"]
        before = r.get("before_mrays_per_s")
        lines.append(md_row(
            f"{r['mesh']} ({r['triangles']:,} tris)", r["rays"], f"{r['ours_mrays_per_s']:.2f}",
            f"{r['kernel_mrays_per_s']:.2f}", f"{r['embree_mrays_per_s']:.2f}",
            f"{r['ours_over_embree']:.2f}", f"{r['kernel_over_embree']:.2f}",
            "-" if before is None else f"{before:.2f}",
            "-" if before is None else f"{r['kernel_over_before']:.2f}",
            f"{100 * a['same_hit_or_miss']:.3f}%", f"{100 * a['same_triangle_or_t']:.3f}%",
            f"{r['clean_rounds']}/{r['rounds']}"))
    lines += [
        "",
        "ours: `tree.intersect(O, D, device=\"cpu\")` (ray checks included); kernel: "
        "`trace.cpu.intersect_cpu` alone; Embree: embreex `scene.run` over chunks of "
        f"{EMBREE_CHUNK} rays on a thread pool (all cores); before: `intersect_cpu` of "
        f"`trace/cpu.py` at commit {first.get('baseline_commit', '-')} (`--baseline`). Same "
        "hit/miss: share of rays; same triangle or t: share of the rays both hit (another "
        "triangle at the same t is a tie at a shared edge).",
    ]
    return "\n".join(lines) + "\n"


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None):
    args = parse_args(argv)
    import numba

    sys.path.insert(0, str(Path(args.peers_dir).resolve()))
    pb = importlib.import_module("peer_bench")
    machine = {"cpu": cpu_name(), "cpu_count": os.cpu_count(),
               "numba_threads": numba.get_num_threads(), "commit": git_commit(),
               "date": utc_now(), "python": platform.python_version(),
               "numba": numba.__version__}
    baseline = load_baseline(args.baseline) if args.baseline else None
    records = []
    for name in args.meshes:
        print(f"# {name}", file=sys.stderr, flush=True)
        records += bench_mesh(name, args, pb, machine, baseline)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu_rays.json").write_text("".join(json.dumps(r) + "\n" for r in records))
    table = markdown_table(records)
    (out / "cpu_rays.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
