"""Blocks a multiprocessor, kernel by kernel: each variant is a copy of the package with
one or more kernels' ``__launch_bounds__`` minimum-blocks argument changed, run against
the package as it is in alternating fresh processes (``probe_build_ab.py`` with its
profile rows), and the profile rows that moved are printed side by side::

    python benchmarks/probe_launch_bounds.py --meshes stanford_armadillo@sub2 \\
        --variant costs8=cost_candidates.cu:kd_split_costs_candidates:8 \\
        --variant reflr8=build.cu:kd_ref_lr_tiles:8 --rounds 2 --out /tmp/bounds

A variant may change several kernels (``name=FILE:KERNEL:N,FILE:KERNEL:N``); N = 0 drops
the minimum (``__launch_bounds__(BLOCK)``). The copies are made under ``--out`` (kept, so
that a variant that wins can be tested as it ran: put its folder first on PYTHONPATH).
A kernel's registers and spills at each setting: ``nvcc -Xptxas -v`` on the copy's file.
The kernels' results do not depend on their launch bounds; the trees are still the tests'
business.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def set_min_blocks(source: str, kernel: str, blocks: int) -> str:
    """``source`` with ``kernel``'s ``__launch_bounds__(BLOCK[, N])`` made
    ``(BLOCK, blocks)`` (``(BLOCK)`` where ``blocks`` is 0)."""
    pattern = re.compile(r"__launch_bounds__\(([^()]*)\)(\s*)" + re.escape(kernel) + r"\(")
    found = pattern.findall(source)
    if len(found) != 1:
        raise SystemExit(f"{kernel}: {len(found)} __launch_bounds__ declarations found, not one")

    def bounds(m):
        block = m.group(1).split(",")[0].strip()
        args = f"{block}, {blocks}" if blocks else block
        return f"__launch_bounds__({args}){m.group(2)}{kernel}("

    return pattern.sub(bounds, source)


def parse_variant(text: str) -> tuple:
    name, _, changes = text.partition("=")
    if not name or not changes:
        raise SystemExit(f"--variant {text!r}: expected NAME=FILE:KERNEL:N[,FILE:KERNEL:N]")
    parsed = []
    for change in changes.split(","):
        file, kernel, blocks = change.split(":")
        parsed.append((file, kernel, int(blocks)))
    return name, parsed


def make_package(out: Path, name: str, changes) -> Path:
    """A copy of the package under ``out/name`` with ``changes`` made."""
    root = out / name
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(ROOT / "kdtree_gpu", root / "kdtree_gpu",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for file, kernel, blocks in changes:
        path = root / "kdtree_gpu" / "cuda" / file
        path.write_text(set_min_blocks(path.read_text(), kernel, blocks))
    return root


def run_one(root: Path, mesh: str, reps: int) -> dict:
    env = dict(os.environ, AB_ROWS="1", REPS=str(reps),
               PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_build_ab.py"), mesh],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"{root.name} {mesh}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--meshes", nargs="+", required=True)
    ap.add_argument("--variant", action="append", default=[], required=True,
                    help="NAME=FILE:KERNEL:N[,FILE:KERNEL:N]")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True, help="folder for the copies and JSON")
    ap.add_argument("--min-ms", type=float, default=0.2,
                    help="rows shorter than this in the base are not printed")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    variants = dict(parse_variant(v) for v in args.variant)
    packages = {"base": make_package(args.out, "base", [])}
    packages.update({name: make_package(args.out, name, changes)
                     for name, changes in variants.items()})
    results = []
    for r in range(args.rounds):
        for mesh in args.meshes:
            # (alternating: the order turns each round)
            names = list(packages)
            names = names[r % len(names):] + names[:r % len(names)]
            for name in names:
                row = run_one(packages[name], mesh, args.reps)
                row.update(variant=name, round=r)
                results.append(row)
                print(f"round {r} {mesh} {name}: {row['ms']} ms, kernels {row['kernels_ms']} ms",
                      flush=True)
    (args.out / "launch_bounds.json").write_text(json.dumps(
        {"variants": {k: [list(c) for c in v] for k, v in variants.items()}, "rows": results},
        indent=1))
    by = defaultdict(list)
    for row in results:
        by[(row["mesh"], row["variant"])].append(row)
    for mesh in args.meshes:
        base = by[(mesh, "base")]
        keys = sorted({k for row in base for k, v in row["rows"].items() if v >= args.min_ms})
        moved = [k for k in keys if any(
            abs(min(r["rows"].get(k, 0) for r in by[(mesh, n)]) - min(r["rows"][k] for r in base))
            > 0.03 * min(r["rows"][k] for r in base) for n in variants)]
        names = list(packages)
        print(f"\n{mesh}: ms per build (each round), rows that moved by more than 3%")
        print("| row | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for k in ["ms", "kernels_ms"] + moved:
            def cell(n):
                vals = [r[k] if k in ("ms", "kernels_ms") else r["rows"].get(k, 0)
                        for r in by[(mesh, n)]]
                return ", ".join(f"{v:.2f}" for v in vals)
            print(f"| {k} | " + " | ".join(cell(n) for n in names) + " |")


if __name__ == "__main__":
    main()
