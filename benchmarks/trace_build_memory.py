#!/usr/bin/env python3
"""Where a GPU build's memory peak is: every workspace allocation and footprint sample.

A diagnostic beside ``bench_build_memory.py`` (whose peaks are the committed
numbers): for each mesh, in this process, a warm-up build, every pool
emptied, then one ``kd.build`` with the build's workspace
(``kdtree_gpu.builder.gpu.workspace.Workspace``) instrumented. It prints

* the tree's sizes and ``build_info["peak_device_bytes"]`` per triangle;
* the subtree stage's widest level against the deferred references D (what
  its buffers are sized from);
* the arrays alive at the largest footprint seen at an allocation;
* every allocation of 64 KiB or more and every footprint sample, with the
  three innermost ``kdtree_gpu`` callers, its size and the footprint after
  (workspace pool blocks + growth of the caller's pool), per triangle.

Run each mesh in a fresh process for a fresh-process peak::

    python benchmarks/trace_build_memory.py stanford_bunny --mesh-dir DIR
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _callers() -> str:
    frames = [f for f in traceback.extract_stack()[:-3] if "kdtree_gpu" in f.filename]
    return " < ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in frames[-3:][::-1])


def _holders(obj, depth: int = 2) -> str:
    """Who refers to ``obj``: the functions whose frames hold it, else the types
    (and, ``depth`` > 1, who holds those)."""
    names = []
    for ref in gc.get_referrers(obj):
        if type(ref).__name__ == "frame":
            names.append(f"{ref.f_code.co_name}()")
        elif not isinstance(ref, (list, tuple)):  # (the collector's own lists)
            outer = f"<{_holders(ref, depth - 1)}" if depth > 1 else ""
            names.append(type(ref).__name__ + outer)
    return ",".join(sorted(set(names))[:4])


def _alive(cupy) -> list:
    """(bytes, shape, dtype, holders) of the device arrays of 64 KiB or more alive now,
    largest first."""
    seen = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, cupy.ndarray) and obj.nbytes >= 1 << 16:
                key = obj.data.mem.ptr if hasattr(obj.data.mem, "ptr") else id(obj.data.mem)
                seen.setdefault(key, (obj.data.mem.size, str(obj.shape), str(obj.dtype),
                                      _holders(obj)))
            elif type(obj).__name__ == "LaidOutBlock":
                seen[obj.memory.mem.ptr] = (obj.layout.nbytes, "level-loop block", "", "")
        except Exception:  # objects half torn down while the collector walks
            pass
    return sorted(seen.values(), reverse=True)


def trace(spec: str, mesh_dir: str) -> str:
    import cupy

    import kdtree_gpu as kd
    from bench_build import load
    from kdtree_gpu.builder.gpu import workspace as W

    V, F = load(spec, mesh_dir)
    m = len(F)
    log, best = [], {"footprint": 0}
    malloc, sample = W.Workspace._malloc, W.Workspace.sample

    def traced_malloc(self, size):
        pointer = malloc(self, size)
        footprint = self.footprint()
        log.append((_callers(), size, footprint))
        if footprint > best["footprint"] and size >= 1 << 16:
            best.update(footprint=footprint, at=_callers(), alive=_alive(cupy))
        return pointer

    def traced_sample(self):
        grown = (self.user_pool.total_bytes() - self.user_base) if self.user_pool is not None else 0
        log.append((f"SAMPLE {_callers()} workspace={self.pool.total_bytes() / m:.0f} "
                    f"caller's pool +{grown / m:.0f}", 1 << 20, self.footprint()))
        return sample(self)

    W.Workspace._malloc, W.Workspace.sample = traced_malloc, traced_sample
    try:
        V_d, F_d = cupy.asarray(V), cupy.asarray(F)
        kd.build(V_d, F_d)  # compile, warm up
        log.clear()
        best.update(footprint=0)
        cupy.get_default_memory_pool().free_all_blocks()
        W.release_cached()
        tree = kd.build(V_d, F_d)
    finally:
        W.Workspace._malloc, W.Workspace.sample = malloc, sample
    info = tree.build_info
    lines = [f"== {spec}: {m} triangles, {tree.num_nodes / m:.2f} nodes and "
             f"{tree.num_refs / m:.2f} references per triangle; peak "
             f"{info['peak_device_bytes'] / m:.0f} B per triangle; {info.get('small_subtrees')} "
             f"deferred nodes; {info.get('loop_launches')} level-loop launches"]
    levels = info.get("small_level_sizes") or []
    if len(levels) > 1:
        deferred = levels[0][1]
        lines.append(f"subtree stage: {len(levels)} levels, D = {deferred / m:.2f} per triangle, "
                     f"widest level {max(r for r, _ in levels[1:]) / deferred:.3f} D records, "
                     f"{max(f for _, f in levels[1:]) / deferred:.3f} D references")
    lines.append(f"largest footprint at an allocation: {best['footprint'] / m:.0f} B per triangle "
                 f"at {best.get('at')}; alive then (B per triangle, shape, dtype, held by):")
    lines += [f"   {size / m:8.1f}  {shape} {dtype}  {holders}" for size, shape, dtype, holders in
              best.get("alive", [])[:25]]
    lines.append("allocations of 64 KiB or more and samples "
                 "(B per triangle: size, footprint after):")
    lines += [f"   {size / m:8.1f} {footprint / m:8.0f}  {where}" for where, size, footprint in log
              if size >= 1 << 16]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("meshes", nargs="+", help="mesh names (name@subN: subdivided N times)")
    parser.add_argument("--mesh-dir", default=os.environ.get("KDTREE_GPU_MESH_DIR", ".meshes"))
    parser.add_argument("--out", help="also write each report to OUT/<mesh>.txt")
    args = parser.parse_args()
    for spec in args.meshes:
        report = trace(spec, args.mesh_dir)
        print(report, flush=True)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"{spec.replace('@', '_')}.txt").write_text(report + "\n")


if __name__ == "__main__":
    main()
