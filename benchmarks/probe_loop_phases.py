"""Where the level-loop kernel's time goes, phase by phase and level by level.

The loop kernel (``cuda/build_loop.cuh``) runs a level as about a dozen phases
between grid barriers; the profile sees it as one launch. This probe copies the
package to a temporary folder, makes block 0's first thread write the GPU's
global timer and the source line after every grid barrier of the copied
``build_loop.cuh`` (and at each level's start and the loop's ends), builds each
mesh warm from CuPy arrays with the copy, and prints per phase (named by the
line of the barrier that ends it) the time summed over levels, and per level
its time and sizes. A phase's time is the slowest block's work plus the
barrier. The instrumented kernel writes a few more bytes a phase than the
package's: the totals sit near, not at, the profile's ``build_levels_grid``::

    python benchmarks/probe_loop_phases.py stanford_bunny conference [MESH ...]

One JSON line per mesh (REPS warm builds; every phase's median over them), with
each level's nodes, references and events beside its time.
"""
import atexit
import importlib.util
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

MARKS = 1 << 13

INSTRUMENT = r"""
__device__ unsigned long long kd_probe_marks[2 * %d];
__device__ unsigned int kd_probe_count;
#define KD_PROBE_MARK(tag)                                                          \
    do {                                                                            \
        if (blockIdx.x == 0 && threadIdx.x == 0) {                                  \
            unsigned int k_ = kd_probe_count++;                                     \
            if (k_ < %d) {                                                          \
                unsigned long long t_;                                              \
                asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t_));             \
                kd_probe_marks[2 * k_] = t_;                                        \
                kd_probe_marks[2 * k_ + 1] = (unsigned long long)(tag)              \
                                             | ((unsigned long long)level << 32);   \
            }                                                                       \
        }                                                                           \
    } while (0)
""" % (MARKS, MARKS)


def instrumented_package() -> tuple:
    """A copy of ``kdtree_gpu`` whose loop body marks its phases: its parent folder, and the
    lines of the original ``build_loop.cuh`` (the marks' tags are their numbers)."""
    # found, not imported: the copy is imported in its place
    package = Path(importlib.util.find_spec("kdtree_gpu").origin).parent
    root = Path(tempfile.mkdtemp(prefix="kd_loop_phases_"))
    shutil.copytree(package, root / "kdtree_gpu")
    path = root / "kdtree_gpu" / "cuda" / "build_loop.cuh"
    lines = path.read_text().split("\n")
    out = []
    for number, line in enumerate(lines, start=1):
        if line.strip() == "grid.sync();":
            out.append(line + f" KD_PROBE_MARK({number});")
        elif line.strip() == "for (;;) {":
            # tag 1 (a comment's line): a launch begins; the time since the last mark is
            # the host's between two launches, not the loop's
            out.append(line.replace("for (;;) {", "KD_PROBE_MARK(1); for (;;) {"))
            out[-1] += " KD_PROBE_MARK(0);"
        elif line.strip() == "return;" and "kd_build_levels" in "\n".join(out):
            indent = line[:len(line) - len(line.lstrip())]
            out.append(f"{indent}KD_PROBE_MARK({number});")
            out.append(line)
        else:
            out.append(line)
        if line.startswith("namespace cg"):
            out.append(INSTRUMENT)
    text = "\n".join(out)
    # a mark inside a lambda of kd_grid_for would see no `level`: only the loop body is marked
    assert "KD_PROBE_MARK(0)" in text and text.count("KD_PROBE_MARK(") > 10, "loop not found"
    path.write_text(text)
    return root, lines


def phase_labels(source: list) -> dict:
    """Each mark's phase name: its line and the ``kd_`` calls since the mark before it."""
    # a return's mark comes after the barrier before it (the loop's last level only)
    marked = [i for i, text in enumerate(source, start=1)
              if text.strip() in ("grid.sync();", "return;", "for (;;) {")]
    labels, previous = {0: "level start (since the last barrier)"}, marked[0]
    for line in marked[1:]:
        if source[previous - 1].strip() == "return;":
            previous = max(m for m in marked if m < previous
                           and source[m - 1].strip() != "return;")
        calls = []
        for text in source[previous:line - 1]:
            for call in re.findall(r"\b(kd_\w+)\(", text.split("//")[0]):
                if call not in calls and call not in ("kd_grid_for", "kd_child_group"):
                    calls.append(call)
        labels[line] = f"{line}: " + (", ".join(calls) or "-")
        previous = line
    return labels


def phases(marks: list) -> tuple:
    """Microseconds per phase (named by the mark that ends it) and per level (the level of
    the mark that starts it: a level's last phase ends after ``level`` is counted up)."""
    per_phase, per_level = {}, {}
    for (t0, tag0), (t1, tag1) in zip(marks, marks[1:]):
        if tag1 & 0xFFFFFFFF == 1 or tag0 & 0xFFFFFFFF == 1:
            continue
        us = (t1 - t0) / 1000.0
        line, level = tag1 & 0xFFFFFFFF, tag0 >> 32
        per_phase[line] = per_phase.get(line, 0.0) + us
        per_level[level] = per_level.get(level, 0.0) + us
    return per_phase, per_level


def main(names) -> None:
    root, original = instrumented_package()
    atexit.register(shutil.rmtree, root, True)
    sys.path.insert(0, str(root))
    sys.path.insert(1, os.path.join(os.getcwd(), "benchmarks"))
    import cupy

    import kdtree_gpu as kd
    from kdtree_gpu import kernels
    from bench_build import load

    assert Path(kd.__file__).is_relative_to(root), kd.__file__
    labels = phase_labels(original)
    reps = int(os.environ.get("REPS", 5))
    for name in names:
        V, F = load(name, os.environ["KDTREE_GPU_MESH_DIR"])
        V, F = cupy.asarray(V), cupy.asarray(F)
        tree = kd.build(V, F)
        kernel = tree.build_info.get("loop_kernel") or ""
        module_file = "build_loop_one_block.cu" if kernel.endswith("one_block") else "build_loop.cu"
        module = kernels.get_module(module_file, cooperative=True)
        marks_ptr = module.get_global("kd_probe_marks")
        count_ptr = module.get_global("kd_probe_count")
        runs_phase, runs_level, loop_ms = [], [], []
        for _ in range(reps):
            count_ptr.memset(0, 4)
            tree = kd.build(V, F, profile=True)
            cupy.cuda.Device().synchronize()
            count = cupy.ndarray((1,), cupy.uint32, count_ptr).get()[0]
            raw = cupy.ndarray((2 * MARKS,), cupy.uint64, marks_ptr).get()
            raw = raw[: 2 * min(int(count), MARKS)].reshape(-1, 2)
            per_phase, per_level = phases([(int(t), int(g)) for t, g in raw])
            runs_phase.append(per_phase)
            runs_level.append(per_level)
            loop_ms.append(tree.build_info["profile"].get("build_levels_grid",
                                                          {}).get("total_ms", 0.0))
        med = lambda runs, k: round(statistics.median(r.get(k, 0.0) for r in runs), 2)
        sizes = tree.build_info.get("level_sizes") or []
        lines = sorted({k for r in runs_phase for k in r})
        levels = sorted({k for r in runs_level for k in r})
        print(json.dumps({
            "mesh": name, "triangles": int(F.shape[0]), "marks": int(count),
            "loop_kernel": tree.build_info.get("loop_kernel"),
            "loop_ms_profile": round(statistics.median(loop_ms), 3),
            "phases_us": {labels.get(k, str(k)): med(runs_phase, k) for k in lines},
            "levels_us": {int(k): med(runs_level, k) for k in levels},
            # each level's (nodes, references, events), by the same level numbers
            "level_sizes": {int(k): list(sizes[k]) for k in levels if k < len(sizes)}}),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
