#!/usr/bin/env python3
"""Build-time benchmark: the GPU level-by-level builder beside the CPU reference.

For each mesh: warm GPU build time (CUDA events around ``kd.build``, median of
repeats after a warm-up), the same from CuPy arrays (the mesh already on the
device, as the peers build), cold build time (first call in a fresh process
with an empty kernel cache, so compilation is included), a per-stage breakdown
(one profiled build), peak device memory, nodes, leaves, references per
triangle, SAH cost, when a warm build returns on the host against when the
GPU is done (which of the two bounds it), whether the GPU tree equals the CPU
reference's, and the CPU reference's build time on this machine's CPU.
Beside them: NVIDIA Warp's
BVH build (``wp.Mesh``, its GPU LBVH) on the same mesh in the same run, when
``peer_bench.py`` (``--peers-dir``) and Warp can run; OptiX's builds on an
H200 (``h200_optix.md`` in the peers' results: PREFER_FAST_TRACE plus
compaction, the best-quality BVH, and PREFER_FAST_BUILD), with our build from
CuPy arrays over them (a ratio that means something only when this table
is from an H200 too); the GTX 1070 times of the GAPT part 11 post (its
Table 2) and tomilov/sah_kd_tree on an H200 (``shared/peers/README.md``).

Usage::

    PYTHONPATH=. python benchmarks/bench_build.py --mesh-dir DIR --out DIR [--meshes M ...]
        [--repeats N] [--no-cold] [--no-cpu]
    python benchmarks/bench_build.py --render OUT/build_<gpu>.json   # its table again

Writes ``build_<gpu>.json`` (one object per mesh plus a header) and
``build_<gpu>.md`` (a readable table) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import git_commit, gpu_time_ms, kernels_ms, optix_table, utc_now  # noqa: E402

import cpu_reference  # noqa: E402
import kdtree_gpu as kd  # noqa: E402

# GAPT part 11, Table 2: GTX 1070 GPU build seconds (Wald-style CPU on i7-4770 in parentheses).
GAPT_GTX1070_S = {"cornell_box": 0.046, "suzanne": 0.095, "stanford_bunny": 0.655,
                  "stanford_dragon_res2": 1.100, "buddha_1.09M": 2.801}
# The build times this project aims at, on an H200 (warm, from CuPy arrays), ms, and the
# most device memory a build may hold at its peak, bytes per triangle.
GOAL_H200_MS = {"stanford_bunny": 1.5, "conference": 3.0, "stanford_armadillo@sub1": 8.0,
                "stanford_armadillo@sub2": 30.0, "stanford_armadillo@sub3": 150.0}
GOAL_PEAK_B_PER_TRI = 400
# tomilov/sah_kd_tree (CUDA/Thrust, full SAH with clipping) on an H200, ms (shared/peers/README.md).
SAH_KD_TREE_H200_MS = {"cornell_box": 26.3, "suzanne": 73.8, "spot": 97.2, "stanford_bunny": 123.0,
                       "sponza_dabrovic": 113.0, "happy_buddha_100k": 129.1,
                       "stanford_dragon_res2": 170.3, "stanford_armadillo": 130.5,
                       "conference": 206.2}
DEFAULT_MESHES = ["cornell_box", "suzanne", "stanford_bunny", "stanford_dragon_res2",
                  "stanford_armadillo", "happy_buddha_100k", "conference",
                  "stanford_armadillo@sub1", "stanford_armadillo@sub2"]


def subdivide(V, F):
    """4-to-1 midpoint subdivision (edge midpoints shared between neighbours)."""
    V = np.asarray(V, dtype=np.float64)
    F = np.asarray(F, dtype=np.int64)
    edges = np.concatenate([F[:, [0, 1]], F[:, [1, 2]], F[:, [2, 0]]])
    edges.sort(axis=1)
    # one int64 key per edge: sorts as the (first, second) rows would, far faster
    keys, inverse = np.unique(edges[:, 0] * len(V) + edges[:, 1], return_inverse=True)
    first, second = np.divmod(keys, len(V))
    mid = (V[first] + V[second]) / 2
    m = F.shape[0]
    e01, e12, e20 = (len(V) + inverse.reshape(3, m)).astype(np.int64)
    a, b, c = F.T
    F2 = np.concatenate([np.stack([a, e01, e20], 1), np.stack([e01, b, e12], 1),
                         np.stack([e20, e12, c], 1), np.stack([e01, e12, e20], 1)])
    return np.concatenate([V, mid]).astype(np.float32), F2.astype(np.int32)


def timed_build(V, F, **kwargs):
    """One ``kd.build(V, F, **kwargs)`` between two CUDA events, synchronized after
    (the probes' timelines): ``(host clock at the call, host ms until the call
    returned, start event, end event)``."""
    import cupy

    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    t0 = time.perf_counter()
    start.record()
    kd.build(V, F, **kwargs)
    end.record()
    host_ms = 1e3 * (time.perf_counter() - t0)
    end.synchronize()
    return t0, host_ms, start, end


def load(spec, mesh_dir):
    name, _, sub = spec.partition("@sub")
    V, F = kd.load_mesh(str(Path(mesh_dir) / f"{name}.ply"))
    for _ in range(int(sub or 0)):
        V, F = subdivide(V, F)
    return V, F


def copy_bandwidth_gbs():
    """Device-to-device copy bandwidth (read + write bytes / time), the memory ceiling."""
    import cupy

    a = cupy.ones(1 << 28, dtype=np.float32)  # 1 GiB
    b = cupy.empty_like(a)
    ms, _ = gpu_time_ms(lambda: b.__setitem__(Ellipsis, a), 10, 3)
    return 2 * a.nbytes / (ms * 1e-3) / 1e9


def cold_build_ms(spec, mesh_dir):
    """First build in a fresh process with an empty kernel cache (compile included)."""
    code = (
        "import sys, time; sys.path.insert(0, %r); sys.path.insert(0, %r);"
        "import bench_build as b, kdtree_gpu as kd;"
        "V, F = b.load(%r, %r); t = time.perf_counter(); kd.build(V, F, device='cuda');"
        "print(1000 * (time.perf_counter() - t))"
    ) % (str(ROOT), str(ROOT / "benchmarks"), spec, str(mesh_dir))
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, CUPY_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=600)
    if out.returncode != 0:
        return None
    return float(out.stdout.strip().splitlines()[-1])


# Bytes each kernel streams per reference and per event (its main loads and
# stores in cuda/build.cu and cuda/cost_candidates.cu; gathers that mostly hit
# the cache are left out).
# With the element counts of every level this gives the achieved bandwidth of
# the largest stages, next to the device-to-device copy.
STAGE_BYTES = {
    # (the cost pre-pass: kind, position, segment, and each event's 16-bit
    # open/close counts; the cost pass itself reads the candidates only)
    "compute_split_costs: scan: tile sums": (0, 1 + 4 + 4 + 4),
    "classify_triangles": (4 + 4 + 8 + 1, 0),
    # (the events' scan is made again by the scatter, stored for no event)
    "route: event scan: tile sums": (0, 4 + 1 + 4),
    # (an event: position, kind, reference, segment, its reference's two scan
    # values, and two copies of the first four at most)
    "split_refs_and_events": (4 + 4 + 1 + 8 + 2 * 8, 4 + 1 + 4 + 4 + 2 * 8 + 2 * 13),
}


def stage_bandwidth(profile, level_sizes, stage_levels):
    """Achieved GB/s of the element-proportional stages (bytes estimated per
    element), over the levels each ran: the per-stage kernels over the levels
    run one launch per stage, the level-loop kernel (all stages) over the rest."""
    staged = set(stage_levels)
    stage_sizes = [s for i, s in enumerate(level_sizes) if i in staged]
    loop_sizes = [s for i, s in enumerate(level_sizes) if i not in staged]
    out = {}

    def add(name, sizes, per_ref, per_event):
        rec = profile.get(name) if isinstance(profile, dict) else None
        if not sizes or not rec or not rec.get("total_ms"):
            return
        refs = sum(r for _, r, _ in sizes)
        events = sum(e for _, _, e in sizes)
        gbytes = (refs * per_ref + events * per_event) / 1e9
        out[name] = {"ms": rec["total_ms"], "gbytes": gbytes,
                     "gbs": gbytes / (rec["total_ms"] * 1e-3)}

    for name, (per_ref, per_event) in STAGE_BYTES.items():
        add(name, stage_sizes, per_ref, per_event)
    add("build_levels_grid", loop_sizes, sum(b[0] for b in STAGE_BYTES.values()),
        sum(b[1] for b in STAGE_BYTES.values()))
    return out


def warp_peer(peers_dir):
    """``peer_bench``'s NVIDIA Warp peer (GPU LBVH), or (None, why not)."""
    sys.path.insert(0, str(peers_dir))
    try:
        import peer_bench
    except ImportError as exc:
        return None, f"peer_bench not importable from {peers_dir}: {exc}"
    peer = peer_bench.WarpPeer("lbvh", "cuda:0", None)
    ok, why = peer.available()
    return (peer, "") if ok else (None, why)


def warp_build_ms(peer, V, F, repeats, warmup=2):
    """Warp's BVH build on the mesh (already on the device, as peer_bench times
    it): synchronized wall clock, median of ``repeats`` after ``warmup``."""
    peer.upload_mesh(V, F)
    times = []
    for k in range(warmup + repeats):
        peer.sync()
        t0 = time.perf_counter()
        mesh = peer.build(V, F)
        peer.sync()
        if k >= warmup:
            times.append(1000 * (time.perf_counter() - t0))
        del mesh
    return statistics.median(times)


def bench_mesh(spec, args, copy_gbs, warp=None):
    import cupy

    V, F = load(spec, args.mesh_dir)
    row = {"mesh": spec, "triangles": int(F.shape[0])}
    big = F.shape[0] > 1_000_000
    repeats = args.repeats if not big else max(3, args.repeats // 2)
    ms, times = gpu_time_ms(lambda: kd.build(V, F, device="cuda"), repeats, 1)
    row["gpu_warm_ms"] = ms
    row["gpu_warm_all_ms"] = times
    V_d, F_d = cupy.asarray(V), cupy.asarray(F)
    row["gpu_warm_device_ms"], _ = gpu_time_ms(lambda: kd.build(V_d, F_d, device="cuda"),
                                               repeats, 1)
    # Whether the host or the GPU bounds the build: when kd.build returns on the host
    # against when the GPU is done (CUDA events), from CuPy arrays, median of repeats.
    host, device = [], []
    for _ in range(repeats):
        _, host_ms, start, end = timed_build(V_d, F_d, device="cuda")
        host.append(host_ms)
        device.append(cupy.cuda.get_elapsed_time(start, end))
    row["host_returns_ms"], row["gpu_done_ms"] = statistics.median(host), statistics.median(device)
    if warp is not None:
        row["warp_build_ms"] = warp_build_ms(warp, V, F, repeats)
    tree = kd.build(V, F, device="cuda", profile=True)
    row["gpu_profiled_ms"] = 1000 * tree.build_info["seconds"]
    row["levels"] = tree.build_info["levels"]
    row["peak_device_bytes"] = tree.build_info.get("peak_device_bytes")
    prof = tree.build_info["profile"]
    row["profile"] = prof
    row["kernels_ms"] = kernels_ms(prof)
    row["profile_table"] = tree.build_info["profile_table"]
    row["level_sizes"] = tree.build_info["level_sizes"]
    row["stage_bandwidth"] = stage_bandwidth(prof, tree.build_info["level_sizes"],
                                             tree.build_info["stage_levels"])
    row["loop_launches"] = tree.build_info["loop_launches"]
    row["stage_levels"] = len(tree.build_info["stage_levels"])
    stats = tree.stats()
    for key in ("nodes", "leaves", "empty_leaves", "max_depth", "refs_per_tri", "sah_cost"):
        row[key] = stats[key]
    if not args.no_cold:
        row["gpu_cold_ms"] = cold_build_ms(spec, args.mesh_dir)
    # The CPU reference on this machine's CPU (numba, one thread), compile excluded.
    if not args.no_cpu:
        # Small meshes build in milliseconds: more repeats for a stable median.
        reps = 1 if big else (args.cpu_repeats if F.shape[0] > 50_000 else 5 * args.cpu_repeats)
        t = []
        ref = None
        for _ in range(reps):
            t0 = time.perf_counter()
            ref = cpu_reference.build(V, F)
            t.append(time.perf_counter() - t0)
        row["cpu_reference_ms"] = 1000 * statistics.median(t)
        diff = ref.compare(tree)
        row["identical_to_reference"] = diff is None
        if diff is not None:
            row["difference"] = diff
            rs = ref.stats()
            row["reference_sah_cost"] = rs["sah_cost"]
            row["sah_cost_rel_diff"] = abs(rs["sah_cost"] - stats["sah_cost"]) / rs["sah_cost"]
    del tree
    cupy.get_default_memory_pool().free_all_blocks()
    return row


def fmt(x, nd=1):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return f"{x:,}"


def _ratio(a, b):
    return f"{a / b:.1f}x" if a and b else "-"


def markdown(header, rows):
    optix = header.get("optix", {})
    lines = [f"# Build benchmark on {header['gpu']}", "",
             f"commit `{header['commit']}`, {header['date']}, CPU: {header['cpu']} "
             f"({header['cpu_count']} cores; the CPU reference uses one), "
             f"device-to-device copy {header['copy_gbs']:.0f} GB/s.", "",
             "Warm: CUDA events around `kd.build` (host validation, upload, all levels, "
             "download), median of repeats after a warm-up (range: fastest and slowest "
             "repeat). Cold: first call in a fresh process with an empty kernel cache (NVRTC "
             "compilation included). CPU reference: `cpu_reference.build` (numba, one "
             "thread), median of repeats, compilation excluded. Loop launches: launches of "
             "the level-loop kernel; stage levels: levels of more than "
             "`LOOP_MAX_EVENTS` events, run one launch per stage.", "",
             "Beside the peers: ours from CuPy arrays (CUDA events around `kd.build`, the "
             "mesh on the device); Warp: `wp.Mesh` (GPU LBVH) in this run, synchronized wall "
             "clock, median of repeats"
             + (f" ({header['warp']})" if header.get("warp") else "") + "; OptiX: "
             "`h200_optix.md`, measured on an H200 (best quality = PREFER_FAST_TRACE build "
             "+ compaction; fast build = PREFER_FAST_BUILD).", "",
             "Goal: the build time this project aims at on an H200 (warm, from CuPy arrays), "
             f"and at most {GOAL_PEAK_B_PER_TRI} bytes per triangle of device memory at the "
             "build's peak (`build_info['peak_device_bytes']`: the build's pools at their "
             "high-water mark, the caller's pool's growth, the mesh).", "",
             "| mesh | triangles | ours ms (CuPy arrays) | goal ms (H200) | ours / goal "
             "| peak B/tri | Warp LBVH ms | ours / Warp "
             "| OptiX best-quality ms | ours / OptiX best | OptiX fast-build ms "
             "| ours / OptiX fast |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ours, warp_ms = r.get("gpu_warm_device_ms"), r.get("warp_build_ms")
        o = optix.get(r["mesh"])
        best = o["build_ms"] + o["compact_ms"] if o else None
        fast = o["fast_build_ms"] if o else None
        goal = GOAL_H200_MS.get(r["mesh"])
        peak = r.get("peak_device_bytes")
        lines.append("| " + " | ".join([
            r["mesh"], fmt(r["triangles"]), fmt(ours, 2), fmt(goal, 1), _ratio(ours, goal),
            fmt(peak / r["triangles"], 0) if peak else "-",
            fmt(warp_ms, 2), _ratio(ours, warp_ms),
            fmt(best, 2), _ratio(ours, best), fmt(fast, 2), _ratio(ours, fast)]) + " |")
    lines += ["", "| mesh | triangles | GPU warm ms | warm range ms | GPU cold ms "
              "| CPU reference ms | speed-up | levels | loop launches | stage levels | nodes "
              "| leaves | refs/tri | SAH cost | same tree | peak MiB | GTX 1070 (GAPT) ms "
              "| sah_kd_tree H200 ms |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:"
              "|---:|---:|"]
    for r in rows:
        speed = (r["cpu_reference_ms"] / r["gpu_warm_ms"]) if r.get("cpu_reference_ms") else None
        gapt = GAPT_GTX1070_S.get(r["mesh"])
        peak = r.get("peak_device_bytes")
        same = r.get("identical_to_reference")
        same_s = "-" if same is None else ("yes" if same else
                                           f"no (SAH rel diff {r.get('sah_cost_rel_diff', 0):.1e})")
        lines.append("| " + " | ".join([
            r["mesh"], fmt(r["triangles"]), fmt(r["gpu_warm_ms"], 2),
            f"{min(r['gpu_warm_all_ms']):.2f}-{max(r['gpu_warm_all_ms']):.2f}",
            fmt(r.get("gpu_cold_ms"), 0),
            fmt(r.get("cpu_reference_ms"), 1 if (r.get("cpu_reference_ms") or 0) < 100 else 0),
            fmt(speed, 1) + "x" if speed else "-",
            fmt(r["levels"]), fmt(r.get("loop_launches")), fmt(r.get("stage_levels")),
            fmt(r["nodes"]), fmt(r["leaves"]), fmt(r["refs_per_tri"], 2),
            fmt(r["sah_cost"], 2), same_s, fmt(peak / 2**20, 0) if peak else "-",
            fmt(1000 * gapt, 0) if gapt else "-", fmt(SAH_KD_TREE_H200_MS.get(r["mesh"]), 1),
        ]) + " |")
    lines += ["", "Where a warm build from CuPy arrays waits: when `kd.build` returns on the host "
              "and when the GPU is done (CUDA events), medians of repeats, beside the sum of the "
              "profiled build's stages (kernels). A host return close to the GPU's end means "
              "the host's launches, allocations and reads bound the build; the GPU idles for "
              "about the difference between its end and the kernels.", "",
              "| mesh | host returns ms | GPU done ms | kernels ms | GPU idle ms |",
              "|---|---:|---:|---:|---:|"]
    for r in rows:
        done, kernels = r.get("gpu_done_ms"), r.get("kernels_ms")
        idle = done - kernels if done is not None and kernels is not None else None
        lines.append("| " + " | ".join([r["mesh"], fmt(r.get("host_returns_ms"), 2), fmt(done, 2),
                                        fmt(kernels, 2), fmt(idle, 2)]) + " |")
    lines += ["", "## Per-stage breakdown (one profiled build each)", ""]
    for r in rows:
        lines += [f"### {r['mesh']}", "", "```", r["profile_table"], "```", ""]
        bw = r.get("stage_bandwidth") or {}
        if bw:
            lines += ["| stage | ms | GB moved (est.) | GB/s | share of copy bandwidth |",
                      "|---|---:|---:|---:|---:|"]
            for name, b in bw.items():
                lines.append(f"| {name} | {b['ms']:.2f} | {b['gbytes']:.3f} | {b['gbs']:.0f} | "
                             f"{100 * b['gbs'] / header['copy_gbs']:.0f}% |")
            lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mesh-dir", default=os.environ.get("KDTREE_GPU_MESH_DIR", "meshes"))
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--meshes", nargs="*", default=DEFAULT_MESHES)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--cpu-repeats", type=int, default=3)
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--no-cpu", action="store_true")
    ap.add_argument("--peers-dir", default=str(ROOT / ".peers"),
                    help="folder holding peer_bench.py and results/h200_optix.md")
    ap.add_argument("--render", metavar="JSON",
                    help="write the table of an earlier run's JSON (beside it, .md) and stop")
    args = ap.parse_args(argv)
    if args.render:
        path = Path(args.render)
        run = json.loads(path.read_text())
        md = markdown(run["header"], run["rows"])
        path.with_suffix(".md").write_text(md)
        print(md)
        return
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    header = {"gpu": gpu, "commit": git_commit(), "date": utc_now(),
              "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
              "cupy": cupy.__version__, "copy_gbs": copy_bandwidth_gbs(),
              "optix": optix_table(args.peers_dir)}
    warp, why = warp_peer(args.peers_dir)
    header["warp"] = f"Warp {warp.info()['version']}" if warp is not None else f"no Warp: {why}"
    # Warm the kernels and numba once so no row pays compilation.
    V, F = load("cornell_box", args.mesh_dir)
    kd.build(V, F, device="cuda")
    cpu_reference.build(V, F)
    rows = []
    for spec in args.meshes:
        try:
            row = bench_mesh(spec, args, header["copy_gbs"], warp)
        except Exception as exc:  # keep the other meshes
            row = {"mesh": spec, "error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(row), flush=True)
            continue
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items()
                          if k not in ("profile", "profile_table", "gpu_warm_all_ms",
                                       "level_sizes", "stage_bandwidth")}), flush=True)
    tag = gpu.lower().replace("nvidia", "").strip().replace(" ", "_")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"build_{tag}.json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    md = markdown(header, rows)
    (out / f"build_{tag}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
