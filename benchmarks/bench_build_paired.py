#!/usr/bin/env python3
"""Warm build time of this checkout and of an earlier one, in alternating fresh processes.

A build of a small mesh takes about a millisecond, nearly all of it host
work, and its time moves by 20-50% from one process (or machine) to the
next: measured one after the other, two versions of the code compare the
processes as much as the code. This benchmark runs each version in a fresh
process per round, alternating which goes first, and reports every round
and the ratio within each round (the two processes of a round ran back to
back on the same machine).

In each process, for each mesh and input kind (``host``: NumPy arrays, as
README shows it; ``device``: CuPy arrays, as a GPU pipeline passes them):
warm-up builds, then ``--builds`` builds of ``kd.build(V, F)``, each timed
from the call to the end of a device synchronization (the time to a usable
tree). Reported: median, 10th and 90th percentile per process; per mesh the
median over rounds of each version and of the per-round ratio.

Writes ``build_paired_<gpu>.json`` and ``.md`` under ``--out``::

    python benchmarks/bench_build_paired.py --baseline-root ../old-checkout --rounds 3
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from _common import ROOT, git_commit, gpu_slug, md_head, md_row, run_fresh, utc_now

MESHES = ["cornell_box", "suzanne", "stanford_bunny", "stanford_armadillo", "conference"]


def measure(mesh_file, builds, warmup, inputs, device, settings=None):
    """This process: every mesh of ``mesh_file`` (an ``.npz`` the parent wrote, the
    same arrays for both versions) and input kind; prints one JSON record.
    ``settings``: ``GpuSettings`` fields for ``kd.build`` (default: none given)."""
    import numpy as np

    import kdtree_gpu as kd

    options = {"settings": kd.GpuSettings(**settings)} if settings else {}

    if device == "cpu":
        def sync():
            pass
        to_device = None
    else:
        import cupy

        sync = cupy.cuda.Device().synchronize
        to_device = cupy.asarray
    import time

    record = {}
    stored = np.load(mesh_file)
    for spec in json.loads(str(stored["specs"])):
        V, F = stored[f"{spec}/V"], stored[f"{spec}/F"]
        for kind in inputs:
            if kind == "device" and to_device is None:
                continue
            args = (V, F) if kind == "host" else (to_device(V), to_device(F))
            for _ in range(warmup):
                kd.build(*args, device=device, **options)
            times = []
            for _ in range(builds):
                sync()
                start = time.perf_counter()
                kd.build(*args, device=device, **options)
                sync()
                times.append(1e3 * (time.perf_counter() - start))
            p10, p50, p90 = np.percentile(times, [10, 50, 90])
            record[f"{spec}/{kind}"] = {"triangles": int(F.shape[0]), "median_ms": float(p50),
                                        "p10_ms": float(p10), "p90_ms": float(p90)}
    print(json.dumps(record))


def summarize(rounds, name="current"):
    """Per mesh/input: the medians per round of version ``name`` and of the
    baseline, and their ratio per round."""
    rows = {}
    for r in rounds:
        for key, now in r[name].items():
            before = r["baseline"].get(key)
            row = rows.setdefault(key, {"triangles": now["triangles"], "current": [],
                                        "baseline": [], "ratio": []})
            row["current"].append(now["median_ms"])
            if before:
                row["baseline"].append(before["median_ms"])
                row["ratio"].append(now["median_ms"] / before["median_ms"])
    for row in rows.values():
        for field in ("current", "baseline", "ratio"):
            row[f"{field}_median"] = statistics.median(row[field]) if row[field] else None
    return rows


def markdown(result):
    lines = [f"# Paired warm builds on {result['device']}", "",
             f"current `{result['commit']}` vs baseline `{result['baseline']}`, {result['date']}. "
             f"{result['rounds']} rounds; each round runs every version in a fresh process, back "
             "to back, rotating which goes first; per process the median of "
             f"{result['builds']} builds after {result['warmup']} warm-up builds, each "
             "`kd.build(V, F)` from the call to the end of a device synchronization. Inputs: "
             "host = NumPy arrays, device = CuPy arrays. Ratio: version / baseline within a "
             "round (below 1: the version is faster)."]
    if result.get("current_settings"):
        lines[-1] += (" current+settings: this checkout with "
                      f"`GpuSettings(**{result['current_settings']})`.")
    lines.append("")
    lines += md_head("mesh", "input", "version", "triangles", "version ms (rounds)",
                     "baseline ms (rounds)", "ratio (rounds)", "version ms", "baseline ms",
                     "ratio", left=("mesh", "input", "version"))

    def listed(values, fmt="{:.3f}"):
        return " / ".join(fmt.format(v) for v in values) or "-"

    for name, summary in result["summary"].items():
        for key, row in summary.items():
            mesh, kind = key.split("/")
            lines.append(md_row(
                mesh, kind, name, f"{row['triangles']:,}", listed(row["current"]),
                listed(row["baseline"]), listed(row["ratio"], "{:.2f}"),
                f"{row['current_median']:.3f}",
                f"{row['baseline_median']:.3f}" if row["baseline_median"] else "-",
                f"{row['ratio_median']:.2f}" if row["ratio_median"] else "-"))
    return "\n".join(lines) + "\n"


def main():
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline-root", required=True, help="package root of an earlier commit")
    parser.add_argument("--baseline-label", help="its name in the table (default: its commit)")
    parser.add_argument("--meshes", nargs="+", default=MESHES)
    parser.add_argument("--mesh-dir", default=os.environ.get("KDTREE_GPU_MESH_DIR",
                                                             str(ROOT / ".meshes")))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--builds", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--inputs", nargs="+", choices=("host", "device"),
                        default=["host", "device"])
    parser.add_argument("--device", default="cuda",
                        help="where kd.build runs (cpu: a check of this script without a GPU)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--current-settings", type=json.loads, default=None,
                        help="also run this checkout with these GpuSettings fields (JSON "
                             "object, e.g. '{\"keep_workspace\": true}') as a third version")
    args = parser.parse_args()
    baseline = Path(args.baseline_root).resolve()
    if args.device == "cpu":
        device_name = "CPU"
    else:
        from kdtree_gpu.device import device_name as name_of, require_gpu

        require_gpu(__file__)
        device_name = name_of("cuda")
    label = args.baseline_label
    if not label:
        commit_file = baseline / ".commit"
        label = commit_file.read_text().strip() if commit_file.is_file() else baseline.name
    result = {"device": device_name, "commit": git_commit(), "baseline": label,
              "date": utc_now(), "rounds": args.rounds, "builds": args.builds,
              "warmup": args.warmup, "meshes": args.meshes,
              "current_settings": args.current_settings, "runs": []}
    from bench_build import load

    with tempfile.TemporaryDirectory() as tmp:
        mesh_file = Path(tmp) / "meshes.npz"
        arrays = {"specs": json.dumps(args.meshes)}
        for spec in args.meshes:
            arrays[f"{spec}/V"], arrays[f"{spec}/F"] = load(spec, args.mesh_dir)
        np.savez(mesh_file, **arrays)
        versions = [("current", ROOT, None), ("baseline", baseline, None)]
        if args.current_settings:
            versions.append(("current+settings", ROOT, args.current_settings))
        for k in range(args.rounds):
            shift = k % len(versions)
            run = {}
            for name, root, settings in versions[shift:] + versions[:shift]:
                print(f"# round {k + 1}: {name}", file=sys.stderr, flush=True)
                run[name] = run_fresh(root, "bench_build_paired", "measure", str(mesh_file),
                                      args.builds, args.warmup, args.inputs, args.device,
                                      settings, timeout=args.timeout)
            result["runs"].append(run)
    result["summary"] = {name: summarize(result["runs"], name)
                         for name, _, _ in versions if name != "baseline"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"build_paired_{'cpu' if args.device == 'cpu' else gpu_slug(device_name)}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (out / f"{stem}.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
