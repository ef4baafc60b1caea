#!/usr/bin/env python3
"""Two runs of ``bench_traversal.py`` side by side: kernel and API rays/s, after / before.

For a change to the traversal kernel or its layout: run ``bench_traversal.py
--no-peers`` in each checkout on the same machine, one right after the other,
then::

    python benchmarks/compare_traversal.py BEFORE.json AFTER.json \\
        --before-label 4627c96 --after-label 0b180d9 --out benchmarks/results --stem traversal_layout

Writes ``<stem>_<gpu>.json`` (both runs whole, with the labels) and a table
``<stem>_<gpu>.md`` under ``--out``: per mesh and ray set, the kernel alone and
the API's queued calls in Mrays/s, before and after, and their ratios.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import gpu_slug, md_row, utc_now

COLUMNS = ("kernel_mrays_per_s", "queued_mrays_per_s")


def rows(run: dict) -> dict:
    """``{(mesh, ray set): our record}`` of one bench_traversal run."""
    return {(m["mesh"], name): rec for m in run["meshes"] for name, rec in m["ours"].items()}


def table(before: dict, after: dict, labels: tuple, note: str = "") -> list:
    lines = [f"# Traversal before / after on {after['device']}", "",
             f"before = `{labels[0]}` ({before['date']}), after = `{labels[1]}` ({after['date']}), "
             f"same machine, one run each, {after['width']}x{after['height']} rays per set "
             f"(`bench_traversal.py --no-peers`; closest hit for primary and diffuse rays, any hit "
             f"for shadow rays). Mrays/s: kernel alone (its launch prepared in advance) and the "
             f"API's queued calls (`tree.intersect` / `tree.occluded` on CuPy arrays). Compared "
             f"with `python benchmarks/compare_traversal.py`." + (f" {note}" if note else ""), "",
             "| mesh | rays | kernel before | kernel after | after / before | API before | "
             "API after | after / before | tris tested per ray |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    old = rows(before)
    for key, new in rows(after).items():
        if key not in old:
            continue
        ref = old[key]
        cells = [key[0], f"{key[1]} ({new['rays']:,})"]
        for column in COLUMNS:
            cells += [f"{ref[column]:,.0f}", f"{new[column]:,.0f}",
                      f"{new[column] / ref[column]:.3f}"]
        cells.append(f"{new['tests_per_ray']:.1f}")
        lines.append(md_row(*cells))
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--before-label", required=True)
    parser.add_argument("--after-label", required=True)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--stem", default="traversal_compare")
    parser.add_argument("--note", default="", help="a sentence added to the table's header")
    args = parser.parse_args(argv)
    before = json.loads(Path(args.before).read_text())
    after = json.loads(Path(args.after).read_text())
    if before["device"] != after["device"]:
        raise SystemExit(f"the runs are from different GPUs: {before['device']!r} and "
                         f"{after['device']!r}")
    labels = (args.before_label, args.after_label)
    out = Path(args.out)
    stem = f"{args.stem}_{gpu_slug(after['device'])}"
    (out / f"{stem}.json").write_text(json.dumps(
        {"device": after["device"], "date": utc_now(), "before_label": labels[0],
         "after_label": labels[1], "note": args.note, "before": before, "after": after},
        indent=1) + "\n")
    lines = table(before, after, labels, args.note)
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
