"""Check and benchmark the path tracer on a GPU; PASS/FAIL table, images, JSON, tables, plot.

Run on a machine with a CUDA GPU (a few minutes)::

    PYTHONPATH=. python benchmarks/gpu_render_check.py --out OUT [--mesh-dir DIR] [--quick]

1. Checks (each PASS/FAIL):

   * furnace: inside a closed emissive sphere (albedo 0.5 and 0.8, Le 1),
     no depth limit: the mean radiance is within 1 % of ``Le / (1 - albedo)``,
     with and without compaction;
   * CPU vs GPU: the Cornell box, and the Cornell box with the bunny, rendered
     with the NumPy stages and the CPU traversal and with the CUDA kernels at
     equal samples: mean pixel values within 1 %;
   * kernels vs twins: the CUDA kernels against their array-expression twins
     run on CuPy (same random numbers): means within 1 %, 90 % of the pixels
     within 1e-3;
   * compaction on/off: the same image (same random numbers per path);
   * no NaN or infinity in any image.

2. Images: Cornell box + ``stanford_bunny`` and + ``happy_buddha_100k`` at
   512x512 (``--render-spp`` samples, maximum depth 8) as PNG.

3. Benchmark (``bench_render``): samples per second at 1920x1080 for
   Cornell+bunny and conference (the mesh alone with the default lights and
   camera, and its interior view ``conference@inside``); frame time of one
   sample per pixel against maximum depth 1..10, 20, 50, 100 with and without
   compaction on Cornell+bunny at 1024x1024 (GAPT part 11, Figure 17), with
   the per-stage profile of one frame at depths 10 and 100.

Outputs under ``--out``: ``render_check.json`` (checks and image stats),
``render_cornell_<mesh>.png``, ``render_bench.json``, ``render_bench.md``,
``render_depth_sweep.png`` (six files; nothing else is written under
``--out``). ``render_bench.md`` opens with the compaction speed-up at maximum
depth >= 10 and, for the profiled depths 10 and 100, where a frame's time
goes with and without compaction (traversal, compaction, other stages, and
the time the GPU sat idle between launches). Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_render as B  # noqa: E402
import kdtree_gpu.render as R  # noqa: E402  (the package attribute "render" is the function)
from kdtree_gpu.scenes import furnace_scene  # noqa: E402


# render_check.json, render_bench.json, render_bench.md, render_depth_sweep.png and
# the two images; the GPU machine returns at most 8 files
MAX_OUTPUT_FILES = 7


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--mesh-dir", default=None)
    parser.add_argument("--quick", action="store_true", help="fewer samples and frames")
    parser.add_argument("--render-spp", type=int, default=512)
    parser.add_argument("--bench-spp", type=int, default=16)
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--depths", type=int, nargs="+", default=list(B.DEFAULT_DEPTHS))
    parser.add_argument("--skip", nargs="*", default=[], choices=["checks", "images", "bench", "sweep"])
    return parser.parse_args(argv)


class Checks:
    """PASS/FAIL records, printed as they come."""

    def __init__(self):
        self.records = []

    def add(self, name: str, ok: bool, detail: str, **data):
        self.records.append({"check": name, "ok": bool(ok), "detail": detail, **data})
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)

    def error(self, name: str, exc: BaseException):
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.records.append({"check": name, "ok": False, "detail": f"{type(exc).__name__}: {exc}",
                             "traceback": text})
        print(f"FAIL  {name}: {type(exc).__name__}: {exc}\n{text}", flush=True)

    @property
    def all_ok(self) -> bool:
        return all(r["ok"] for r in self.records)


def finite(image) -> bool:
    return bool(np.all(np.isfinite(image)))


def run_checks(checks: Checks, folder: Path, quick: bool) -> None:
    spp = 32 if quick else 64
    # furnace: Le / (1 - a) with no depth limit, Russian roulette only
    for albedo, compaction in ((0.5, True), (0.5, False), (0.8, True)):
        name = f"furnace albedo {albedo} compaction {compaction}"
        try:
            result = R.render(furnace_scene(albedo), 128, 128, spp=spp, max_depth=None,
                              device="cuda", compaction=compaction)
            expected = 1.0 / (1.0 - albedo)
            error = float(result.image.mean()) / expected - 1.0
            checks.add(name, abs(error) < 0.01 and finite(result.image),
                       f"mean {result.image.mean():.5f} vs {expected:.5f} ({100 * error:+.3f} %), "
                       f"deepest {result.stats['max_depth_reached']}",
                       mean=float(result.image.mean()), expected=expected,
                       paths_per_depth=result.stats["paths_per_depth"])
        except Exception as exc:
            checks.error(name, exc)

    # CPU vs GPU at equal samples, same tree
    for spec, size, cpu_spp in (("cornell", 64, 64), ("cornell+stanford_bunny", 48, 16)):
        name = f"cpu vs gpu {spec}"
        try:
            scene = B.make_scene(spec, folder)
            gpu_renderer = R.Renderer(scene, size, size, device="cuda")
            gpu = gpu_renderer.render(spp=cpu_spp, max_depth=6)
            cpu = R.Renderer(scene, size, size, device="cpu", tree=gpu_renderer.tree).render(
                spp=cpu_spp, max_depth=6)
            error = float(gpu.image.mean()) / float(cpu.image.mean()) - 1.0
            checks.add(name, abs(error) < 0.01 and finite(gpu.image) and finite(cpu.image),
                       f"gpu mean {gpu.image.mean():.5f}, cpu mean {cpu.image.mean():.5f} "
                       f"({100 * error:+.3f} %), {size}x{size}, {cpu_spp} spp",
                       gpu_mean=float(gpu.image.mean()), cpu_mean=float(cpu.image.mean()),
                       cpu_seconds=cpu.stats["seconds"], gpu_seconds=gpu.stats["seconds"])
        except Exception as exc:
            checks.error(name, exc)

    # CUDA kernels against their array twins on CuPy, compaction on/off
    try:
        scene = B.make_scene("cornell+stanford_bunny", folder)
        renderer = R.Renderer(scene, 64, 64, device="cuda")
        twins = R.Renderer(scene, 64, 64, device="cuda", tree=renderer.tree, kernels="xp")
        a = renderer.render(spp=16, max_depth=6)
        b = twins.render(spp=16, max_depth=6)
        error = float(a.image.mean()) / float(b.image.mean()) - 1.0
        close = float(np.isclose(a.image, b.image, rtol=1e-3, atol=1e-4).mean())
        checks.add("kernels vs array twins", abs(error) < 0.01 and close > 0.9,
                   f"means {a.image.mean():.5f} / {b.image.mean():.5f} ({100 * error:+.3f} %), "
                   f"{100 * close:.1f} % of pixel values within 1e-3", close_fraction=close)
        on = renderer.render(spp=8, max_depth=10, compaction=True)
        off = renderer.render(spp=8, max_depth=10, compaction=False)
        diff = float(np.abs(on.image - off.image).max())
        checks.add("compaction on/off same image",
                   np.allclose(on.image, off.image, rtol=1e-4, atol=1e-5),
                   f"largest difference {diff:.3g}; live paths per depth {on.stats['paths_per_depth']}",
                   max_difference=diff)
    except Exception as exc:
        checks.error("kernels vs array twins / compaction", exc)


def render_images(checks: Checks, folder: Path, out: Path, spp: int) -> list:
    records = []
    for mesh in ("stanford_bunny", "happy_buddha_100k"):
        name = f"image cornell+{mesh}"
        try:
            renderer = R.Renderer(B.make_scene(f"cornell+{mesh}", folder), 512, 512, device="cuda")
            result = renderer.render(spp=spp, max_depth=8)
            path = out / f"render_cornell_{mesh}.png"
            R.save_png(result.image, path)
            record = {"image": path.name, "mesh": mesh, "spp": spp, "seconds": result.stats["seconds"],
                      "build_seconds": renderer.build_seconds, "mean": float(result.image.mean()),
                      "samples_per_second": result.stats["samples_per_second"]}
            records.append(record)
            checks.add(name, finite(result.image) and result.image.mean() > 0,
                       f"{spp} spp in {result.stats['seconds']:.2f} s (tree {renderer.build_seconds:.2f} s) "
                       f"-> {path.name}")
        except Exception as exc:
            checks.error(name, exc)
    return records


def main(argv=None) -> int:
    args = parse_args(argv)
    from kdtree_gpu.device import require_gpu

    require_gpu("benchmarks/gpu_render_check.py")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    folder = B.mesh_folder(args.mesh_dir)
    env = B.environment()
    print(f"device {env['device']}, commit {env['commit']}, {env['date']}", flush=True)
    start = time.perf_counter()
    checks = Checks()
    phases = {}
    phase_start = time.perf_counter()
    if "checks" not in args.skip:
        run_checks(checks, folder, args.quick)
    phases["checks"] = time.perf_counter() - phase_start
    images = []
    phase_start = time.perf_counter()
    if "images" not in args.skip:
        images = render_images(checks, folder, out, 64 if args.quick else args.render_spp)
    phases["images"] = time.perf_counter() - phase_start
    B.write_json(out / "render_check.json", {"environment": env, "checks": checks.records,
                                             "images": images})

    throughput, sweep = [], []
    phase_start = time.perf_counter()
    if "bench" not in args.skip:
        for spec in ("cornell+stanford_bunny", "conference", "conference@inside"):
            try:
                renderer = R.Renderer(B.make_scene(spec, folder), 1920, 1080, device="cuda")
                record = B.measure_throughput(renderer, 4 if args.quick else args.bench_spp, 8,
                                              repeats=1 if args.quick else 3)
                throughput.append(record)
                print(f"{spec}: {record['samples_per_second'] / 1e6:.2f} Msamples/s, "
                      f"{record['rays_per_second'] / 1e6:.1f} Mrays/s at 1920x1080", flush=True)
            except Exception as exc:
                checks.error(f"throughput {spec}", exc)
    if "sweep" not in args.skip:
        try:
            renderer = R.Renderer(B.make_scene("cornell+stanford_bunny", folder), 1024, 1024,
                                  device="cuda")
            sweep = B.depth_sweep(renderer, args.depths, frames=2 if args.quick else args.frames)
        except Exception as exc:
            checks.error("depth sweep", exc)
    summary = sweep_summary(sweep)
    phases["benchmark"] = time.perf_counter() - phase_start
    B.write_json(out / "render_bench.json", {"environment": env, "throughput": throughput,
                                             "depth_sweep": sweep, "summary": summary})
    (out / "render_bench.md").write_text(B.markdown_report(env, throughput, sweep, extra=summary))
    if sweep:
        B.plot_sweep(sweep, out / "render_depth_sweep.png")
    B.write_json(out / "render_check.json", {"environment": env, "checks": checks.records,
                                             "images": images, "phase_seconds": phases})
    # the GPU machine returns at most 8 files: keep the output to these few
    written = sorted(p.name for p in out.iterdir())
    if len(written) > MAX_OUTPUT_FILES:
        print(f"warning: {len(written)} files under {out} (at most {MAX_OUTPUT_FILES} expected): "
              f"{written}", flush=True)
    print(summary)
    print(f"\n{sum(r['ok'] for r in checks.records)} of {len(checks.records)} checks passed "
          f"in {time.perf_counter() - start:.1f} s; results in {out}", flush=True)
    return 0 if checks.all_ok else 1


def sweep_summary(sweep: list) -> str:
    """One line per depth >= 10: speed-up of compaction, and whether it reaches 1.5x."""
    if not sweep:
        return ""
    lines = []
    by = {(r["max_depth"], r["compaction"]): r for r in sweep}
    depths = sorted({d for d, _ in by if d >= 10})
    speedups = []
    for d in depths:
        if (d, True) in by and (d, False) in by:
            s = by[(d, False)]["frame_ms"] / by[(d, True)]["frame_ms"]
            speedups.append(s)
            lines.append(f"- max depth {d}: {by[(d, True)]['frame_ms']:.2f} ms with compaction, "
                         f"{by[(d, False)]['frame_ms']:.2f} ms without: {s:.2f}x")
    if speedups:
        reached = min(speedups) >= 1.5
        verdict = "reached" if reached else "NOT reached (measured breakdown below)"
        lines.append(f"- compaction speed-up at max depth >= 10: {min(speedups):.2f}x to "
                     f"{max(speedups):.2f}x; 1.5x bar {verdict}")
        lines += explain_profiles(by)
    return "\n".join(lines)


def explain_profiles(by: dict) -> list:
    """Where a profiled frame's time goes, with and without compaction (measured, per depth)."""
    lines = []
    for d in sorted({d for d, _ in by}):
        on, off = by.get((d, True)), by.get((d, False))
        if not on or not off or "stages" not in on or "stages" not in off:
            continue
        parts = []
        for r in (on, off):
            groups = {}
            for name, st in r["stages"].items():
                groups[B.stage_group(name)] = groups.get(B.stage_group(name), 0.0) + st["total_ms"]
            gpu = sum(groups.values())
            wall = r.get("profiled_frame_ms", float("nan"))
            parts.append(f"{'with' if r['compaction'] else 'without'}: traversal "
                         f"{groups.get('traversal', 0.0):.2f} ms, compaction / live count "
                         f"{groups.get('compaction / live count', 0.0):.2f} ms, other stages "
                         f"{groups.get('other stages', 0.0):.2f} ms, GPU total {gpu:.2f} ms, "
                         f"frame wall time {wall:.2f} ms (GPU idle: wall time minus stage times "
                         f"{max(0.0, wall - gpu):.2f} ms)")
        lines.append(f"- profiled frame at max depth {d} ({on.get('bounces', '?')} bounces): "
                     + "; ".join(parts))
    return lines


if __name__ == "__main__":
    sys.exit(main())
