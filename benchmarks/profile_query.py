#!/usr/bin/env python3
"""A CUDA activity profile of ``kd.build`` and the first ``tree.intersect``: copies and waits.

What the GPU and the driver did, recorded by CUPTI through PyTorch's
profiler (which records every CUDA activity of the process, CuPy's
included), in four windows per mesh, each on a fresh tree built on CuPy
arrays (1920x1080 primary rays from ``peer_bench.make_primary_rays``):

* ``nothing``: the caller's synchronization alone (what the profiler itself
  shows in every window);
* ``build``: ``kd.build(V, F)`` and a synchronization;
* ``query, check=False``: the first ``tree.intersect`` of the new tree and
  the caller's synchronization; nothing of the query may copy to the host
  or wait for the GPU;
* ``query, check=True``: the same with the bad-ray check: one read of the
  16-byte record, its one wait.

For each window: kernels launched, memory copies by direction (count and
bytes) and the synchronizing calls seen (``cudaStreamSynchronize``,
``cudaDeviceSynchronize``, blocking ``cudaMemcpy``). The script fails when the
profiler saw no traversal kernel (a profile that records nothing proves
nothing).

Usage::

    PYTHONPATH=. python benchmarks/profile_query.py --peers-dir .peers --out benchmarks/results

Writes ``query_profile_<gpu>.json`` and ``.md``. Needs PyTorch with CUDA.
"""

from __future__ import annotations

import re
import sys

from _common import gpu_benchmark_parser, gpu_slug, md_head, md_row, run_meshes, start_gpu_benchmark
from bench_first_hit import load

DEFAULT_MESHES = ["stanford_bunny", "conference"]
# CUPTI's names of copies (PyTorch prints "Memcpy DtoH (Device -> Pinned)")
_COPY = re.compile(r"^Memcpy (HtoD|DtoH|DtoD|HtoH|PtoP)")
_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cuStreamSynchronize",
          "cuCtxSynchronize", "cudaEventSynchronize", "cuMemcpyDtoH_v2", "cuMemcpy")


def parse_args(argv=None):
    return gpu_benchmark_parser(__doc__, DEFAULT_MESHES, repeats=1).parse_args(argv)


def window(run):
    """Profile ``run()`` (which synchronizes at its end); a summary of its CUDA activity."""
    import json
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/trace.json"
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    summary = {"kernels": {}, "copies": {}, "waits": {}}
    for event in events:
        category, name = event.get("cat", ""), event.get("name", "")
        if category == "gpu_memcpy":
            copy = _COPY.match(name)
            entry = summary["copies"].setdefault(copy.group(1) if copy else name,
                                                 {"count": 0, "bytes": 0})
            entry["count"] += 1
            entry["bytes"] += int(event.get("args", {}).get("bytes", 0))
        elif category == "kernel":
            kernel = name.split("(")[0]
            summary["kernels"][kernel] = summary["kernels"].get(kernel, 0) + 1
        elif category in ("cuda_runtime", "cuda_driver") and name in _WAITS:
            summary["waits"][name] = summary["waits"].get(name, 0) + 1
    return summary


def bench_mesh(spec, args, pb):
    import cupy

    import kdtree_gpu as kd

    sync = cupy.cuda.get_current_stream().synchronize
    _, V, F = load(pb, args.mesh_dir, spec)
    O, D = pb.make_primary_rays(V, args.width, args.height)
    Vd, Fd, Od, Dd = (cupy.asarray(a) for a in (V, F, O, D))
    tree = kd.build(Vd, Fd)  # warm-up: compiles, loads modules
    tree.intersect(Od, Dd)
    record = {"mesh": spec, "triangles": int(F.shape[0]), "windows": {}}
    trees = []

    def build():
        trees.append(kd.build(Vd, Fd))
        sync()

    # what the profiler itself adds to a window: the caller's synchronization alone
    record["windows"]["nothing (profiler only)"] = window(sync)
    record["windows"]["build"] = window(build)
    for check in (False, True):
        build()
        tree = trees[-1]
        record["windows"][f"query, check={check}"] = window(
            lambda: (tree.intersect(Od, Dd, check=check), sync()))
    traced = sum(n for name, n in record["windows"]["query, check=False"]["kernels"].items()
                 if "kd_trace" in name)
    if traced != 1:
        raise RuntimeError(f"{spec}: the profile shows {traced} traversal kernels, expected 1 "
                           f"(CUPTI may not see this process's CuPy launches)")
    return record


def markdown(result):
    lines = [f"# CUDA activity of a build and its first query, {result['device']}", "",
             f"commit `{result['commit']}`, {result['date']}. CUPTI activity through PyTorch's "
             "profiler; each window on a fresh tree built on CuPy arrays; queries of "
             f"{result['width']}x{result['height']} primary rays, each window ending with the "
             "caller's synchronization (the `cudaStreamSynchronize` of a `check=False` window "
             "is that one).", ""]
    lines += md_head("mesh", "window", "kernels", "device-to-host copies", "bytes",
                     "host-to-device copies", "waits", left=("mesh", "window"))
    for rec in result["meshes"]:
        if "error" in rec:
            lines.append(md_row(rec["mesh"], rec["error"], "", "", "", "", ""))
            continue
        for label, w in rec["windows"].items():
            d2h = w["copies"].get("DtoH", {"count": 0, "bytes": 0})
            h2d = w["copies"].get("HtoD", {"count": 0, "bytes": 0})
            waits = ", ".join(f"{k} x{v}" for k, v in sorted(w["waits"].items())) or "none"
            kernels = sum(w["kernels"].values())
            lines.append(md_row(rec["mesh"], label, kernels, d2h["count"], f"{d2h['bytes']:,}",
                                h2d["count"], waits))
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    pb, device, result = start_gpu_benchmark("profile_query.py", args.peers_dir)
    result.update(width=args.width, height=args.height)
    return run_meshes(result, args.meshes, lambda spec: bench_mesh(spec, args, pb), markdown,
                      args.out, f"query_profile_{gpu_slug(device)}")


if __name__ == "__main__":
    sys.exit(main())
