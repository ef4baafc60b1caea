"""Build times of the CPU reference builder (Wald & Havran) by thread count, beside Embree.

For each mesh and ``clip`` setting, ``cpu_reference.build`` runs with
``threads=1``, ``threads=2`` and the default (every core), warm: after
``cpu_reference.warm_up()`` and one untimed build per setting. The timed
builds go round-robin (1, 2, default, ``kd.build``, Embree, 1, 2, ...) so
that a background load hits every column alike; each column is the median
of ``--repeats`` wall-clock times of the whole call (mesh checks included,
compilation not). The three trees are checked to be equal array for array.

The machine may be shared. Before each round the script waits (up to
``--wait-idle`` seconds) for idle CPUs, and during each timed call it
measures the CPU time that other processes took (``/proc/stat`` less this
process's ``os.times()``). A sample is *clean* when other processes kept
fewer than 0.1 cores busy; rounds go on (at most ``3 * repeats``) until every
column has ``repeats`` clean samples. A column's seconds are the median of
its ``repeats`` samples with the least other work; a speedup is the median,
over the clean rounds (all rounds when fewer than three), of the ratio of two
samples of the same round, which ran seconds apart under the same
conditions.

When ``embreex`` is importable, its BVH build is timed in the same run:
scene construction plus one single-ray query, which commits the scene (the
build happens there), with Embree's own threads (all cores).

The CPU times that the GAPT part 11 post reports for its Wald-style builder
on an i7-4770 (single-threaded, no clipping) are listed beside the nearest
mesh, for scale only.

Writes ``benchmarks/results/cpu_build.json`` (one JSON object per line: one
per mesh, clip and thread setting, one per mesh for Embree) and
``benchmarks/results/cpu_build.md``.

Usage::

    python benchmarks/cpu_build.py [--meshes suzanne stanford_bunny conference stanford_armadillo]
        [--clip off on] [--repeats 5] [--subdivided] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numba  # noqa: E402

import cpu_reference  # noqa: E402
from cpu_reference.wald_havran import resolve_threads  # noqa: E402
from kdtree_gpu import SAHConfig  # noqa: E402
from _common import busy_cpu_seconds, git_commit  # noqa: E402

DEFAULT_MESHES = ["suzanne", "stanford_bunny", "conference", "stanford_armadillo"]
SUBDIVIDED = "stanford_armadillo_subdiv4x"
THREAD_SETTINGS = [1, 2, None]  # None: the default, every core
# a sample is clean when other processes kept fewer cores than this busy during it
CLEAN_LIMIT = 0.1
ARRAYS = ("node_axis", "node_split", "node_child", "node_count", "leaf_tris")

# GAPT part 11, CPU Wald-style builder on an i7-4770: (model, triangles, seconds)
GAPT_CPU = {
    "suzanne": ("Suzanne", 968, 0.016),
    "stanford_bunny": ("Bunny", 69_451, 1.442),
    "stanford_dragon_res2": ("Dragon", 201_031, 3.705),
    "happy_buddha_100k": ("Buddha", 1_087_716, 13.903),
    SUBDIVIDED: ("Buddha", 1_087_716, 13.903),
}


def mesh_dir() -> Path:
    value = os.environ.get("KDTREE_GPU_MESH_DIR", str(REPO.parent / "shared" / "meshes"))
    path = Path(value)
    if not path.is_dir():
        raise SystemExit(f"mesh folder {path} not found (set KDTREE_GPU_MESH_DIR)")
    return path


def read_mesh(folder: Path, name: str):
    """Vertices and faces of a mesh of the mesh folder (or the subdivided armadillo)."""
    from kdtree_gpu.mesh import load_mesh

    if name != SUBDIVIDED:
        return load_mesh(folder / f"{name}.ply")
    import trimesh.remesh

    V, F = load_mesh(folder / "stanford_armadillo.ply")
    V, F = trimesh.remesh.subdivide(V.astype(np.float64), F)
    return V.astype(np.float32), F.astype(np.int32)


def machine_info() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "default_threads": resolve_threads(None),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "embreex": embree_version(),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def embree_version():
    try:
        from importlib.metadata import version

        import embreex  # noqa: F401

        return version("embreex")
    except Exception:
        return None


def embree_build(vertices, faces):
    """Build Embree's BVH: scene, mesh, and one ray query that commits the scene."""
    from embreex import rtcore_scene as rtcs
    from embreex.mesh_construction import TriangleMesh

    scene = rtcs.EmbreeScene()
    TriangleMesh(scene, vertices[faces])
    origin = vertices[faces[:1, 0]].astype(np.float32) - np.float32(1.0)
    scene.run(origin, np.ones((1, 3), dtype=np.float32))
    return scene


def idle_fraction(seconds=0.5):
    """Share of CPU time idle over ``seconds`` (from /proc/stat; None elsewhere)."""
    def read():
        values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return values[3] + values[4], sum(values)  # idle + iowait, total

    try:
        idle0, total0 = read()
        time.sleep(seconds)
        idle1, total1 = read()
    except (OSError, ValueError, IndexError):
        return None
    return (idle1 - idle0) / max(1, total1 - total0)


def wait_until_idle(max_wait, threshold=0.9):
    """Wait (at most ``max_wait`` s) for the CPUs to be idle; return the last idle share.

    The machine may be shared: a round timed while another process computes
    says little about the builder.
    """
    deadline = time.monotonic() + max_wait
    idle = idle_fraction()
    while idle is not None and idle < threshold and time.monotonic() < deadline:
        idle = idle_fraction()
    return idle


def timed(fn):
    """Wall seconds of ``fn()``, its result, and the cores other processes kept busy meanwhile.

    The last is the machine's busy CPU time less this process's (all its
    threads), over the wall time: about 0 on an otherwise idle machine, about
    1 when another process held a core throughout.
    """
    busy0, own0 = busy_cpu_seconds(), os.times()
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    busy1, own1 = busy_cpu_seconds(), os.times()
    other = None
    if busy0 is not None:
        own = (own1.user - own0.user) + (own1.system - own0.system)
        other = max(0.0, (busy1 - busy0) - own) / seconds
    return seconds, out, other


def quiet_median(samples, others, count):
    """Median of the ``count`` samples taken while other processes used the least CPU.

    Returns the median and the most cores other processes kept busy during
    the samples used (None where /proc/stat is missing: then all samples).
    """
    if any(o is None for o in others):
        return statistics.median(samples), None
    order = sorted(range(len(samples)), key=lambda i: (others[i], i))[:count]
    return statistics.median(samples[i] for i in order), max(others[i] for i in order)


def paired_ratio(samples, base, others, others_base, limit):
    """Median over rounds of ``samples[r] / base[r]`` (taken seconds apart, alike).

    Rounds where either sample shared the CPUs with over ``limit`` cores of
    other work are left out, unless fewer than three rounds remain.
    """
    pairs = [(s / b, max(o or 0.0, ob or 0.0))
             for s, b, o, ob in zip(samples, base, others, others_base)]
    quiet = [r for r, o in pairs if o < limit]
    return statistics.median(quiet if len(quiet) >= 3 else [r for r, _ in pairs])


def kd_build_cpu(vertices, faces, config):
    """The package's front door on the CPU, ``kd.build(..., device="cpu")``."""
    import kdtree_gpu

    return kdtree_gpu.build(vertices, faces, config, device="cpu")


def kd_build_available() -> bool:
    """Whether ``kd.build(device="cpu")`` runs here (and uses this builder)."""
    try:
        rng = np.random.default_rng(0)
        V = rng.random((30, 3)).astype(np.float32)
        tree = kd_build_cpu(V, np.arange(30).reshape(10, 3), SAHConfig())
        return "subtrees" in tree.build_info
    except Exception as exc:  # the front door is being reworked elsewhere: leave it out
        print(f"kd.build(device='cpu') left out: {exc!r}", flush=True)
        return False


def run_mesh(name, V, F, clips, repeats, info, with_embree, with_kd, max_wait):
    """Rows for one mesh: every clip and thread setting, then Embree."""
    configs = {clip: SAHConfig(clip=clip) for clip in clips}
    jobs = {}
    for clip in clips:
        for threads in THREAD_SETTINGS:
            jobs[(clip, threads)] = (lambda c=configs[clip], t=threads:
                                     cpu_reference.build(V, F, c, threads=t))
        if with_kd:
            jobs[(clip, "kd")] = lambda c=configs[clip]: kd_build_cpu(V, F, c)
    if with_embree:
        jobs["embree"] = lambda: embree_build(V, F)
    results = {key: fn() for key, fn in jobs.items()}  # one untimed run each
    times = {key: [] for key in jobs}
    others = {key: [] for key in jobs}
    load = []
    idle = []
    # round-robin until every job has `repeats` clean samples (or 3 x repeats rounds)
    for _ in range(3 * repeats):
        idle.append(wait_until_idle(max_wait) if max_wait > 0 else idle_fraction(0.1))
        load.append(os.getloadavg()[0])
        for key, fn in jobs.items():
            seconds, out, other = timed(fn)
            times[key].append(seconds)
            others[key].append(other)
            if key != "embree":
                results[key] = out
        if all(sum(o is not None and o < CLEAN_LIMIT for o in others[key]) >= repeats
               or (others[key][0] is None and len(times[key]) >= repeats) for key in jobs):
            break
    median = {key: quiet_median(times[key], others[key], repeats) for key in jobs}

    def ratio(key, base):
        return paired_ratio(times[key], times[base], others[key], others[base], CLEAN_LIMIT)
    rows = []
    for clip in clips:
        one = results[(clip, 1)]
        stats = one.stats()
        for threads in THREAD_SETTINGS:
            tree = results[(clip, threads)]
            same = all(np.array_equal(getattr(tree, a), getattr(one, a)) for a in ARRAYS)
            med, other = median[(clip, threads)]
            gapt = GAPT_CPU.get(name)
            rows.append({
                "builder": "cpu_reference", "mesh": name, "triangles": int(F.shape[0]),
                "clip": clip, "threads_arg": threads, "threads": tree.build_info["threads"],
                "seconds_median": med, "max_other_cores_in_median": other,
                "seconds_all": times[(clip, threads)],
                "other_cores_busy": others[(clip, threads)], "repeats": repeats,
                "speedup_vs_threads_1": 1.0 / ratio((clip, threads), (clip, 1)),
                "build_info_seconds": tree.build_info["seconds"],
                "subtrees": tree.build_info["subtrees"], "same_tree_as_threads_1": same,
                "nodes": stats["nodes"], "leaves": stats["leaves"],
                "refs_per_tri": stats["refs_per_tri"], "max_depth": stats["max_depth"],
                "sah_cost": stats["sah_cost"],
                "gapt_cpu_i7_4770": ({"model": gapt[0], "triangles": gapt[1], "seconds": gapt[2]}
                                     if gapt else None),
                "load_avg_1min": load, "idle_before_round": idle, "machine": info,
            })
            print(f"{name:28s} clip={str(clip):5s} threads={str(threads):4s} "
                  f"median={med:7.3f}s  x{rows[-1]['speedup_vs_threads_1']:.2f}  "
                  f"subtrees={rows[-1]['subtrees']}  same={same}", flush=True)
    if with_kd:
        for clip in clips:
            med, other = median[(clip, "kd")]
            rows.append({"builder": "kd.build(device='cpu')", "mesh": name,
                         "triangles": int(F.shape[0]), "clip": clip, "seconds_median": med,
                         "max_other_cores_in_median": other,
                         "seconds_all": times[(clip, "kd")],
                         "other_cores_busy": others[(clip, "kd")], "repeats": repeats,
                         "ratio_to_threads_1": ratio((clip, "kd"), (clip, 1)),
                         "same_tree_as_threads_1": results[(clip, "kd")].compare(
                             results[(clip, 1)]) is None,
                         "load_avg_1min": load, "idle_before_round": idle, "machine": info})
            print(f"{name:28s} clip={str(clip):5s} kd.build(device='cpu') median={med:7.3f}s "
                  f"ratio to threads=1: {rows[-1]['ratio_to_threads_1']:.2f}", flush=True)
    if with_embree:
        med, other = median["embree"]
        rows.append({"builder": "embreex", "mesh": name, "triangles": int(F.shape[0]),
                     "seconds_median": med, "max_other_cores_in_median": other,
                     "seconds_all": times["embree"], "other_cores_busy": others["embree"],
                     "repeats": repeats,
                     "load_avg_1min": load, "idle_before_round": idle, "machine": info})
        print(f"{name:28s} embree median={med:7.3f}s", flush=True)
    return rows


def fmt(seconds):
    return f"{seconds:.3f}" if seconds is not None else ""


def write_markdown(rows, info, warm, path: Path):
    cpu = [r for r in rows if r["builder"] == "cpu_reference"]
    embree = {r["mesh"]: r["seconds_median"] for r in rows if r["builder"] == "embreex"}
    kd = {(r["mesh"], r["clip"]): r for r in rows if r["builder"].startswith("kd.build")}
    default = info["default_threads"]
    repeats = cpu[0]["repeats"] if cpu else 0
    lines = [
        "# CPU reference builder by thread count (Wald & Havran 2006, numba)",
        "",
        f"Machine: {info['cpu']} ({info['cpu_count']} logical CPUs, {default} usable; "
        "shared with other work), "
        f"Python {info['python']}, NumPy {info['numpy']}, numba {info['numba']}, "
        f"embreex {info['embreex'] or 'not installed'}. "
        f"Commit `{info['commit']}`, {info['date']}.",
        "",
        f"`cpu_reference.build(V, F, SAHConfig(clip=...), threads=...)`, default settings "
        "otherwise. Seconds: median of "
        f"the {repeats} wall-clock times of the whole call (mesh checks included) during "
        "which other processes used the least CPU, warm: after "
        f"`cpu_reference.warm_up()` ({warm.seconds:.1f} s here, "
        f"{'compiled' if warm.compiled else 'loaded from the numba cache'}) and one untimed "
        "build per setting; the settings run round-robin. 'Default' is `threads=None` "
        f"({default} threads here). Every thread count gives the same arrays "
        "(checked). Embree: `embreex` scene construction plus one ray query (which "
        "commits the scene and builds its BVH), all cores, no clipping; the same for both "
        "clip rows. 'kd.build cpu': `kdtree_gpu.build(V, F, config, device=\"cpu\")`, the "
        "package's front door (which calls this builder with its default threads), and its "
        "time over the `threads=1` time.",
        "",
        "| Mesh | Triangles | Clip | threads=1 (s) | threads=2 (s) | default (s) "
        "| 1 -> 2 speedup | kd.build cpu (s) | kd.build / threads=1 | Subtrees | Nodes "
        "| Refs/tri "
        "| Embree (s) | GAPT CPU, i7-4770 |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    by_case = {}
    for r in cpu:
        by_case.setdefault((r["mesh"], r["clip"]), {})[r["threads_arg"]] = r
    for (mesh, clip), case in by_case.items():
        one, two, dflt = case[1], case[2], case[None]
        g = one["gapt_cpu_i7_4770"]
        gapt = f"{g['model']} {g['triangles']:,} tris: {g['seconds']} s" if g and not clip else ""
        k = kd.get((mesh, clip))
        kd_seconds = fmt(k["seconds_median"]) if k else ""
        kd_ratio = f"{k['ratio_to_threads_1']:.2f}" if k else ""
        lines.append(
            f"| {mesh} | {one['triangles']:,} | {'on' if clip else 'off'} "
            f"| {fmt(one['seconds_median'])} | {fmt(two['seconds_median'])} "
            f"| {fmt(dflt['seconds_median'])} | {two['speedup_vs_threads_1']:.2f}x "
            f"| {kd_seconds} | {kd_ratio} "
            f"| {one['subtrees']} | {one['nodes']:,} | {one['refs_per_tri']:.3f} "
            f"| {fmt(embree.get(mesh))} | {gapt} |")
    loads = [x for r in cpu for x in r["load_avg_1min"]]
    idle = [x for r in cpu for x in r["idle_before_round"] if x is not None]
    others = [r["max_other_cores_in_median"] for r in rows]
    max_other = ("unknown" if any(o is None for o in others)
                 else f"{max(others, default=0):.2f}")
    lines += [
        "",
        "Before each round the script waits (up to `--wait-idle` s) for the CPUs to be "
        f"idle: the idle share measured then was {min(idle, default=0):.0%} to "
        f"{max(idle, default=0):.0%}; the 1-minute load average {min(loads):.2f} to "
        f"{max(loads):.2f}. Most cores other processes kept busy during a sample that "
        f"entered a median: {max_other}. Speedups and the kd.build ratio are medians of "
        "ratios within a round. Every sample, with the cores other processes used during "
        "it, is in the JSON file.",
        "",
        "Command: `python benchmarks/cpu_build.py "
        + " ".join(sys.argv[1:]) + "`" if len(sys.argv) > 1
        else "Command: `python benchmarks/cpu_build.py`",
        "",
    ]
    path.write_text("\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--meshes", nargs="*", default=DEFAULT_MESHES)
    parser.add_argument("--clip", nargs="*", choices=["off", "on"], default=["off", "on"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--subdivided", action="store_true",
                        help=f"add {SUBDIVIDED} (1.38M triangles)")
    parser.add_argument("--no-embree", action="store_true", help="leave Embree out")
    parser.add_argument("--no-kd", action="store_true", help="leave kd.build(device='cpu') out")
    parser.add_argument("--wait-idle", type=float, default=60.0,
                        help="before each round, wait up to this many seconds for idle CPUs "
                             "(0: do not wait)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)

    warm = cpu_reference.warm_up()
    info = machine_info()
    info["warm_up"] = {"seconds": warm.seconds, "compiled": warm.compiled}
    with_embree = info["embreex"] is not None and not args.no_embree
    with_kd = not args.no_kd and kd_build_available()
    folder = mesh_dir()
    clips = [c == "on" for c in args.clip]
    names = list(args.meshes) + ([SUBDIVIDED] if args.subdivided else [])
    rows = []
    for name in names:
        V, F = read_mesh(folder, name)
        rows += run_mesh(name, V, F, clips, args.repeats, info, with_embree, with_kd,
                         args.wait_idle)

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "cpu_build.json", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    write_markdown(rows, info, warm, args.out / "cpu_build.md")
    print(f"wrote {args.out / 'cpu_build.json'} and .md")


if __name__ == "__main__":
    main()
