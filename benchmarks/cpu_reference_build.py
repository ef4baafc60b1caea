"""Build times and tree statistics of the CPU reference builder (Wald & Havran).

For each mesh and ``clip`` setting: one first call (in a fresh process it
includes loading or compiling the numba code), then a warm-up build, then the
median of ``--repeats`` timed builds. Tree statistics come from
``KdTree.stats()``. The CPU times that the GAPT part 11 post reports for its
Wald-style builder on an i7-4770 are listed beside the nearest mesh.

Writes ``benchmarks/results/cpu_reference_build.json`` (one object per case)
and ``benchmarks/results/cpu_reference_build.md``.

Usage::

    python benchmarks/cpu_reference_build.py [--meshes suzanne stanford_bunny ...]
        [--repeats 3] [--no-subdivided] [--out benchmarks/results]
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

import numba  # noqa: E402

from cpu_reference import wald_havran  # noqa: E402
from kdtree_gpu import SAHConfig  # noqa: E402

DEFAULT_MESHES = ["suzanne", "stanford_bunny", "stanford_dragon_res2", "stanford_armadillo",
                  "happy_buddha_100k", "conference"]
SUBDIVIDED = "stanford_armadillo_subdiv4x"

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


def read_mesh(path: Path):
    """Vertices and faces of a mesh file."""
    from kdtree_gpu.mesh import load_mesh

    return load_mesh(path)


def subdivide_mesh(vertices, faces):
    """One 4x midpoint subdivision (each triangle into four), with trimesh."""
    import trimesh.remesh

    V, F = trimesh.remesh.subdivide(vertices.astype(np.float64), faces)
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
    sys.path.insert(0, str(REPO / "benchmarks"))
    from _common import git_commit

    commit = git_commit()
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def time_build(V, F, config, repeats):
    """First-call time, then the median of ``repeats`` builds after a warm-up."""
    start = time.perf_counter()
    wald_havran.build(V, F, config)
    first = time.perf_counter() - start
    wald_havran.build(V, F, config)  # warm-up
    times = []
    tree = None
    for _ in range(repeats):
        start = time.perf_counter()
        tree = wald_havran.build(V, F, config)
        times.append(time.perf_counter() - start)
    return tree, first, times


def run_case(name, V, F, clip, repeats, info, note):
    config = SAHConfig(clip=clip)
    tree, first, times = time_build(V, F, config, repeats)
    stats = tree.stats()
    gapt = GAPT_CPU.get(name)
    row = {
        "mesh": name,
        "note": note,
        "triangles": int(F.shape[0]),
        "clip": clip,
        "config": config.to_dict(),
        "first_call_s": first,
        "build_s_median": statistics.median(times),
        "build_s_all": times,
        "repeats": repeats,
        "nodes": stats["nodes"],
        "leaves": stats["leaves"],
        "empty_leaves": stats["empty_leaves"],
        "refs_per_tri": stats["refs_per_tri"],
        "max_depth": stats["max_depth"],
        "max_depth_limit": tree.build_info["max_depth"],
        "sah_cost": stats["sah_cost"],
        "degenerate": stats["degenerate"],
        "gapt_cpu_i7_4770": ({"model": gapt[0], "triangles": gapt[1], "seconds": gapt[2]}
                             if gapt else None),
        "machine": info,
    }
    print(f"{name:28s} clip={str(clip):5s} tris={row['triangles']:>9,d} "
          f"first={first:7.3f}s median={row['build_s_median']:7.3f}s nodes={row['nodes']:>9,d} "
          f"refs/tri={row['refs_per_tri']:.3f} depth={row['max_depth']} "
          f"sah={row['sah_cost']:.2f}", flush=True)
    return row


def write_markdown(rows, info, path: Path):
    lines = [
        "# CPU reference builder (Wald & Havran 2006, numba)",
        "",
        f"Machine: {info['cpu']} ({info['cpu_count']} logical CPUs, shared), "
        f"Python {info['python']}, NumPy {info['numpy']}, numba {info['numba']}. "
        f"Commit `{info['commit']}`, {info['date']}.",
        "",
        "Default settings (K_T = 15, K_I = 20, lambda = 0.8, leaf_size = 0, "
        "max_depth = round(8 + 1.3 log2 N), all axes). Build time: median of "
        f"{rows[0]['repeats'] if rows else 3} builds after a warm-up build, mesh validation "
        "included; 'first call' is the first build in the process (numba code loaded from "
        "its cache, or compiled when there is none). SAH cost from `KdTree.stats()` "
        "(no empty bonus, relative to the root's area).",
        "",
        "| Mesh | Triangles | Clip | Build (s) | First call (s) | Nodes | Leaves | Refs/tri "
        "| Max depth | SAH cost | GAPT CPU, i7-4770 |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        g = r["gapt_cpu_i7_4770"]
        gapt = f"{g['model']} {g['triangles']:,} tris: {g['seconds']} s" if g else ""
        lines.append(
            f"| {r['mesh']} | {r['triangles']:,} | {'on' if r['clip'] else 'off'} "
            f"| {r['build_s_median']:.3f} | {r['first_call_s']:.3f} | {r['nodes']:,} "
            f"| {r['leaves']:,} | {r['refs_per_tri']:.3f} | {r['max_depth']} "
            f"| {r['sah_cost']:.2f} | {gapt} |")
    lines += [
        "",
        "Notes:",
        "",
        "- `stanford_dragon_res2` is Stanford's decimation of the dragon (202,520 triangles), "
        "close in size to GAPT's 201,031-triangle dragon.",
        "- `happy_buddha_100k` is a 100,000-triangle decimation, not the 1,087,716-triangle "
        "Buddha of GAPT; the GAPT Buddha time is repeated beside "
        f"`{SUBDIVIDED}`, the nearest mesh in size here.",
        f"- `{SUBDIVIDED}`: stanford_armadillo after one 4x midpoint subdivision "
        "(`trimesh.remesh.subdivide`), 1,383,776 triangles; made in the script, not a "
        "scanned mesh.",
        "- The GAPT times are from another machine and another implementation; they are "
        "listed for scale, not as a like-for-like comparison.",
        "",
    ]
    path.write_text("\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--meshes", nargs="*", default=DEFAULT_MESHES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-subdivided", action="store_true",
                        help=f"skip {SUBDIVIDED} (1.38M triangles)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)

    info = machine_info()
    folder = mesh_dir()
    rows = []
    cases = [(name, folder / f"{name}.ply") for name in args.meshes]
    if not args.no_subdivided:
        cases.append((SUBDIVIDED, folder / "stanford_armadillo.ply"))
    for name, path in cases:
        V, F = read_mesh(path)
        note = ""
        if name == SUBDIVIDED:
            V, F = subdivide_mesh(V, F)
            note = "stanford_armadillo after one 4x midpoint subdivision (trimesh)"
        for clip in (False, True):
            rows.append(run_case(name, V, F, clip, args.repeats, info, note))

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "cpu_reference_build.json", "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")
    write_markdown(rows, info, args.out / "cpu_reference_build.md")
    print(f"wrote {args.out / 'cpu_reference_build.json'} and .md")


if __name__ == "__main__":
    main()
