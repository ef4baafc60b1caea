"""The subtree stage's one cooperative launch, level by level: how much of a level is the
grid barrier, how much its nodes' work.

``cuda/build_small_grid.cu`` runs every subtree level in one launch with a grid barrier
between levels. This probe copies the package to a temporary folder and makes block 0's
first thread of the copied kernel write the GPU's global timer at three points of each
level: its start, when block 0 has done its own nodes (just before the barrier), and after
the barrier. Per level (median over REPS warm builds from CuPy arrays):

* ``level_us``: from the barrier before it to its own (the slowest block's work plus the
  barrier);
* ``block0_us``: block 0's own part of it (its level start and its nodes);
* ``wait_us``: the rest, block 0 waiting at the barrier for the slowest block and for the
  barrier itself;

beside the level's records and references (``build_info["small_level_sizes"]``). Levels of
a few nodes show the stage's floor per level. Then, with the same grid (as many blocks of
``SMALL_BLOCK`` threads as are resident), a kernel that only passes K grid barriers gives
the barrier alone (``barrier_us``, median of 5 launches of K = 1,000), and the same for the
level loop's grid (``LOOP_BLOCK`` threads, its resident blocks)::

    python benchmarks/probe_subtree_phases.py stanford_bunny conference [MESH ...]

One JSON line per mesh, then one for the barriers.
"""
import atexit
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# block 0's first thread writes (global timer, tag | level << 32): the level loop probe's marks
from probe_loop_phases import INSTRUMENT, MARKS  # noqa: E402

START, DONE, PASSED = 1, 2, 3  # the marks' tags

BARRIERS = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void kd_probe_barriers(int k, unsigned long long* out)
{
    cg::grid_group grid = cg::this_grid();
    unsigned long long t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (int i = 0; i < k; ++i) grid.sync();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = t1 - t0;
}
"""


def instrumented_package() -> Path:
    """A copy of ``kdtree_gpu`` whose subtree grid kernel marks its levels (its parent folder)."""
    package = Path(importlib.util.find_spec("kdtree_gpu").origin).parent
    root = Path(tempfile.mkdtemp(prefix="kd_subtree_phases_"))
    shutil.copytree(package, root / "kdtree_gpu")
    path = root / "kdtree_gpu" / "cuda" / "build_small_grid.cu"
    out = []
    for line in path.read_text().split("\n"):
        indent = line[:len(line) - len(line.lstrip())]
        if line.strip() == "grid.sync();":
            out += [f"{indent}KD_PROBE_MARK({DONE});", line, f"{indent}KD_PROBE_MARK({PASSED});"]
        elif line.strip().startswith("for (int level = first;"):
            out += [line, f"{indent}    KD_PROBE_MARK({START});"]
        else:
            out.append(line)
        if line.startswith("namespace cg"):
            out.append(INSTRUMENT)
    text = "\n".join(out)
    assert text.count("KD_PROBE_MARK(") == 4, "the subtree grid kernel's level loop not found"
    path.write_text(text)
    return root


def levels(marks: list) -> dict:
    """Per level: (level_us, block0_us, wait_us) from (time, tag | level << 32) marks."""
    at = {}
    for t, tag in marks:
        at[(tag >> 32, tag & 0xFFFFFFFF)] = t
    out, previous = {}, None
    for level in sorted({lvl for lvl, _ in at}):
        start, done, passed = (at.get((level, k)) for k in (START, DONE, PASSED))
        if None in (start, done, passed):
            continue
        begin = previous if previous is not None else start
        out[level] = ((passed - begin) / 1e3, (done - start) / 1e3, (passed - done) / 1e3)
        previous = passed
    return out


def barrier_us(cupy, block: int, blocks: int, k: int = 1000) -> float:
    """One grid barrier of ``blocks`` blocks of ``block`` threads (median of 5 launches)."""
    module = cupy.RawModule(code=BARRIERS, options=("--std=c++17",),
                            enable_cooperative_groups=True)
    kernel = module.get_function("kd_probe_barriers")
    out = cupy.zeros(1, cupy.uint64)
    runs = []
    for _ in range(6):
        kernel((blocks,), (block,), (cupy.int32(k), out))
        cupy.cuda.Device().synchronize()
        runs.append(int(out.get()[0]) / 1e3 / k)
    return round(statistics.median(runs[1:]), 3)


def main(names) -> None:
    root = instrumented_package()
    atexit.register(shutil.rmtree, root, True)
    sys.path.insert(0, str(root))
    sys.path.insert(1, os.path.join(os.getcwd(), "benchmarks"))
    import cupy

    import kdtree_gpu as kd
    from kdtree_gpu import encoding as enc
    from kdtree_gpu import kernels
    from kdtree_gpu.device import multiprocessors
    from bench_build import load

    assert Path(kd.__file__).is_relative_to(root), kd.__file__
    reps = int(os.environ.get("REPS", 5))
    for name in names:
        V, F = load(name, os.environ["KDTREE_GPU_MESH_DIR"])
        V, F = cupy.asarray(V), cupy.asarray(F)
        tree = kd.build(V, F)
        if not tree.build_info.get("small_launches"):
            print(json.dumps({"mesh": name, "subtree_stage": "none (nothing deferred)"}))
            continue
        module = kernels.get_module("build_small_grid.cu", cooperative=True)
        marks_ptr = module.get_global("kd_probe_marks")
        count_ptr = module.get_global("kd_probe_count")
        runs, stage_ms = [], []
        for _ in range(reps):
            count_ptr.memset(0, 4)
            tree = kd.build(V, F, profile=True)
            cupy.cuda.Device().synchronize()
            count = int(cupy.ndarray((1,), cupy.uint32, count_ptr).get()[0])
            raw = cupy.ndarray((2 * MARKS,), cupy.uint64, marks_ptr).get()
            raw = raw[: 2 * min(count, MARKS)].reshape(-1, 2)
            runs.append(levels([(int(t), int(g)) for t, g in raw]))
            stage_ms.append(tree.build_info["profile"].get("small subtrees: levels",
                                                           {}).get("total_ms", 0.0))
        keys = sorted({k for r in runs for k in r})
        med = {k: [round(statistics.median(r[k][j] for r in runs if k in r), 2)
                   for j in range(3)] for k in keys}
        sizes = tree.build_info.get("small_level_sizes") or []
        print(json.dumps({
            "mesh": name, "triangles": int(F.shape[0]),
            "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
            "stage_ms_profile": round(statistics.median(stage_ms), 3),
            "levels_sum_ms": round(sum(v[0] for v in med.values()) / 1e3, 3),
            "runs": len(tree.build_info.get("small_runs_full") or []) + 1,
            # level: [level_us, block0_us, wait_us, records, references]
            "levels": {int(k): med[k] + list(sizes[k] if k < len(sizes) else ())
                       for k in keys}}), flush=True)
    sms = multiprocessors(cupy.cuda.Device().id)
    small = kernels.cooperative_function("build_small_grid.cu", "kd_build_small_levels",
                                         enc.SMALL_BLOCK)
    print(json.dumps({
        "barriers": "one grid.sync, us",
        "subtree_grid": {"blocks": small[1] if small else None,
                         "barrier_us": barrier_us(cupy, enc.SMALL_BLOCK, small[1])
                         if small else None},
        "loop_grid_two_blocks": {"blocks": 2 * sms,
                                 "barrier_us": barrier_us(cupy, enc.LOOP_BLOCK, 2 * sms)},
        "loop_grid_one_block": {"blocks": sms,
                                "barrier_us": barrier_us(cupy, enc.LOOP_BLOCK, sms)}}),
          flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
