"""``kdtree-gpu info``: what a tree file holds."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .common import (EXIT_FAILURE, EXIT_OK, EXIT_USAGE, TREE_SUFFIX, CliError, format_summary,
                     print_error, print_json, summarize_tree)

# statistics printed on the summary line, not again below it
_SUMMARY_KEYS = ("triangles", "nodes", "leaves", "refs_per_tri", "sah_cost")


EXAMPLES = """examples:
  kdtree-gpu info bunny.kdt
  kdtree-gpu info bunny.kdt --json
  kdtree-gpu info bunny.kdt --check               # also check the invariants"""


def run(args) -> int:
    """Print a tree file's facts.

    The file is read by :func:`kdtree_gpu.tree.load_tree`, so ``info``
    reports exactly the problem loading it reports (truncation, checksum,
    trailing bytes, ...). A file that does not load still has its header
    shown (settings, build facts, array shapes) when that reads, with the
    problem, and the exit status is 2; ``--check`` finding a broken
    invariant is exit status 1.
    """
    from ..tree import load_tree, read_header
    from ..tree.io import FORMAT_VERSION, TreeFileError

    path = Path(args.tree)
    if not path.exists():
        raise CliError(f"no such file: {path}")
    if path.is_dir():
        raise CliError(f"{path} is a directory, not a tree file")
    # a header that reads means the version is one this package reads
    header = read_header(path)
    record = {"path": str(path), "file_bytes": path.stat().st_size,
              "format_version": FORMAT_VERSION}
    try:
        tree = load_tree(path)
    except TreeFileError as exc:
        record.update({"checksum": "not verified", "error": str(exc),
                       "config": header.get("config"), "build_info": header.get("build_info"),
                       "arrays": {a.get("name"): a.get("shape") for a in header["arrays"]}})
        _print(args, record, summary=None)
        print_error(str(exc))
        return EXIT_USAGE
    record.update({"checksum": "ok", "config": tree.config.to_dict(),
                   "build_info": tree.build_info})
    summary = summarize_tree(tree)
    problem = None
    if args.check:
        try:
            tree.check()
        except ValueError as exc:  # names the broken invariant
            problem = str(exc)
        record["invariants"] = "ok" if problem is None else problem
    _print(args, record, summary)
    if problem is not None:
        print_error(f"{path}: broken invariant: {problem}")
        return EXIT_FAILURE
    return EXIT_OK


def _print(args, record: dict, summary: Optional[dict]) -> None:
    if args.json:
        print_json({**record, **(summary or {})})
        return
    print(f"file:           {record['path']} ({record['file_bytes']} bytes)")
    print(f"format version: {record['format_version']}")
    if "error" in record:
        print(f"error:          {record['error']}")
    else:
        print(f"checksum:       {record['checksum']}")
    if "invariants" in record:
        print(f"invariants:     {record['invariants']}")
    if summary is not None:
        print(format_summary("tree", summary))
        for key, value in summary.items():
            if key not in _SUMMARY_KEYS:
                print(f"  {key}: {_format_value(value)}")
    else:
        print("arrays (from the header):")
        for name, shape in record["arrays"].items():
            print(f"  {name}: {shape}")
    print("settings:")
    for key, value in (record["config"] or {}).items():
        print(f"  {key}: {value}")
    if record["build_info"]:
        print("build:")
        for key, value in record["build_info"].items():
            if key not in ("profile", "profile_table"):
                print(f"  {key}: {_format_value(value)}")


def _format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)) and len(value) > 6:
        # per-level lists of deep trees: the ends tell the story
        head = ", ".join(str(v) for v in value[:3])
        tail = ", ".join(str(v) for v in value[-2:])
        return f"[{head}, ..., {tail}] ({len(value)} entries)"
    return str(value)


def add_parser(commands, shared) -> None:
    """Declare ``kdtree-gpu info``: its help, examples and options."""
    p = shared.add(commands, "info", "statistics and settings of a saved tree",
                   "Print the statistics, build settings, format version and file size of a tree file, "
                   "after the checks that loading it makes (a file that does not load is an input "
                   "error, exit status 2, with its header shown when that reads).", EXAMPLES, [shared.json])
    p.add_argument("tree", metavar="TREE", help=f"a tree file written by 'build' ({TREE_SUFFIX})")
    p.add_argument("--check", action="store_true",
                   help="also check the tree's invariants (kdtree_gpu.KdTree.check); "
                        "a broken one is exit status 1")
    p.set_defaults(handler=run)
