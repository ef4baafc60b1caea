"""Helpers shared by the benchmark scripts.

Importing it puts the repository root first on ``sys.path``: a script run as
``python benchmarks/<script>.py`` finds this module (its folder is on the
path) and then imports ``kdtree_gpu`` and ``cpu_reference`` from the
checkout, with no set-up of its own.
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def git_commit() -> str:
    """Short hash of the code being measured.

    ``$KDTREE_GPU_COMMIT`` wins, then a ``.commit`` file in the checkout (a
    copy of the tree on a remote GPU machine names its commit there: a
    ``.git`` copied with it may be stale), then ``git rev-parse``, else
    ``"unknown"``.
    """
    value = os.environ.get("KDTREE_GPU_COMMIT", "").strip()
    if value:
        return value
    try:
        value = (ROOT / ".commit").read_text().strip()
    except OSError:
        value = ""
    if value:
        return value
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, check=True)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def busy_cpu_seconds():
    """CPU seconds spent so far by the whole machine (all processes; None without /proc)."""
    try:
        values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def gpu_time_per_call_ms(fn, calls, repeats, warmup):
    """Milliseconds per call of ``fn()`` when ``calls`` calls are queued back to back.

    CUDA events around ``calls`` calls (no host synchronization between
    them), divided by ``calls``; median of ``repeats`` after ``warmup``
    batches. When the GPU work of a call takes longer than its host work,
    this is the GPU time of the call: the figure for work that is queued
    (a renderer, a training loop), and for a kernel alone without the host's
    launch latency in front of it.
    """
    import statistics

    import cupy

    stream = cupy.cuda.get_current_stream()
    times = []
    for k in range(warmup + repeats):
        stream.synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        if k >= warmup:
            times.append(cupy.cuda.get_elapsed_time(start, end) / calls)
    return statistics.median(times), times


def gpu_time_ms(fn, repeats, warmup):
    """Milliseconds of ``fn()`` between two CUDA events, after ``warmup`` calls.

    Returns
    -------
    median : float
    times : list of float
        Every repeat, in order.
    """
    import statistics

    import cupy

    for _ in range(warmup):
        fn()
    cupy.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(repeats):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times), times


def run_fresh(package_root, module, function, *args, timeout=600):
    """``module.function(*args)`` in a fresh Python process that imports the
    package at ``package_root`` (this checkout or an earlier one); returns the
    JSON record the function prints last.

    ``kdtree_gpu`` is imported first, from ``package_root``: importing this
    module would otherwise put this checkout first on the path.

    Raises
    ------
    RuntimeError
        The process failed (its last line of stderr).
    """
    import json

    code = ("import sys; sys.path[:0] = [%r, %r]; import kdtree_gpu; import %s; %s.%s(*%r)"
            % (str(package_root), str(ROOT / "benchmarks"), module, module, function, args))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit {out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def optix_table(peers_dir):
    """{mesh: {"build_ms", "compact_ms", "primary_mrays", ...}} from h200_optix.md."""
    path = Path(peers_dir) / "results" / "h200_optix.md"
    table = {}
    if not path.is_file():
        return table
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8 or not re.match(r"^[\d,]+$", cells[1]):
            continue
        num = [float(c.replace(",", "")) for c in cells[1:]]
        # mesh | triangles | FT build | compaction | FB build | GAS MB | primary | diffuse | any hit
        table[cells[0]] = {"triangles": int(num[0]), "build_ms": num[1], "compact_ms": num[2],
                           "fast_build_ms": num[3], "gas_mb": num[4], "primary_mrays": num[5],
                           "diffuse_mrays": num[6], "occlusion_mrays": num[7]}
    return table


def gpu_benchmark_parser(doc, meshes, repeats, warmup=None, mesh_dir=str(ROOT / ".meshes")):
    """The options of the GPU benchmarks that read ``peer_bench``'s meshes and rays.

    ``--meshes``, ``--mesh-dir`` (``$KDTREE_GPU_MESH_DIR``, else ``mesh_dir``),
    ``--peers-dir``, ``--out``, ``--repeats``, ``--warmup`` (only when a
    default is given), ``--width`` and ``--height``; the caller adds its own.
    The description is the first line of ``doc``.
    """
    import argparse

    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--meshes", nargs="+", default=meshes)
    parser.add_argument("--mesh-dir", default=os.environ.get("KDTREE_GPU_MESH_DIR", mesh_dir))
    parser.add_argument("--peers-dir", default=str(ROOT / ".peers"),
                        help="folder holding peer_bench.py")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--repeats", type=int, default=repeats)
    if warmup is not None:
        parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    return parser


def start_gpu_benchmark(script, peers_dir):
    """What every GPU benchmark does first: require a GPU, import the peers' script.

    Returns
    -------
    peer_bench : module
        ``peers_dir/peer_bench.py`` (its rays, mesh loader and peers).
    device : str
        The GPU's name, e.g. ``"NVIDIA H200"``.
    result : dict
        The record every result file starts with: device, commit, date.
    """
    import importlib
    import sys

    from kdtree_gpu.device import device_name, require_gpu

    require_gpu(script)
    sys.path.insert(0, str(Path(peers_dir).resolve()))
    device = device_name("cuda")
    return (importlib.import_module("peer_bench"), device,
            {"device": device, "commit": git_commit(), "date": utc_now()})


def gpu_slug(name):
    """``"NVIDIA H200"`` -> ``"h200"``: the file-name label of a device."""
    words = [w for w in re.split(r"[^0-9a-zA-Z]+", name.lower()) if w and w != "nvidia"]
    return words[0] if words else "gpu"


def run_meshes(result, meshes, bench_one, markdown, out, stem):
    """Benchmark each mesh, saving the JSON after each one; write and print the table.

    ``bench_one(mesh)`` returns the mesh's record; a mesh that fails gets an
    ``error`` record and the others go on. Writes ``<out>/<stem>.json`` and
    ``<out>/<stem>.md``.
    """
    import json
    import sys

    import cupy

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result.setdefault("meshes", [])
    for mesh in meshes:
        print(f"# {mesh}", file=sys.stderr, flush=True)
        try:
            record = bench_one(mesh)
        except Exception as exc:  # keep the other meshes' numbers
            record = {"mesh": mesh, "spec": mesh, "error": f"{type(exc).__name__}: {exc}"}
        result["meshes"].append(record)
        (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
        cupy.get_default_memory_pool().free_all_blocks()
    table = markdown(result)
    (out / f"{stem}.md").write_text(table)
    print(table)
    return 0


def kernels_ms(profile: dict) -> float:
    """The GPU time of a profiled build: the sum of its profile's top-level rows
    (``build_info["profile"]``; a nested row ran inside a stage already counted)."""
    return sum(v["total_ms"] for v in profile.values() if not v.get("nested"))


def md_row(*cells) -> str:
    """One Markdown table row from its cells (numbers formatted by the caller)."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_head(*columns, left=("mesh",)) -> list:
    """A Markdown table's header row and rule: the columns in ``left`` align left, others right."""
    return [md_row(*columns), "|" + "".join("---|" if c in left else "---:|" for c in columns)]
