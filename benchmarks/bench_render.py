"""Path tracer benchmark: samples per second, and frame time against maximum depth.

Run (GPU; the CPU works for tiny sizes)::

    PYTHONPATH=. python benchmarks/bench_render.py --out OUT \\
        --scenes cornell+stanford_bunny conference --size 1920x1080 --spp 16 \\
        --depths 1 2 3 4 5 6 7 8 9 10 20 50 100 --frames 5

Scenes: ``cornell`` (the built-in Cornell box), ``cornell+<mesh>`` (a mesh
placed on its floor), ``<mesh>`` (the mesh alone, with the default camera
framing it from outside and an emissive quad above it,
:func:`kdtree_gpu.scenes.mesh_scene`), ``<mesh>@inside`` (the same
with the interior camera and light, for rooms: ``conference@inside``),
``furnace``. Meshes are read from ``--mesh-dir`` (default
``$KDTREE_GPU_MESH_DIR``).

Two experiments per scene:

* throughput: one warm-up render, then ``--repeats`` renders of ``--spp``
  samples at ``--max-depth`` (median wall time from the first launch to the
  image on the host); samples/s and rays/s (closest + shadow rays);
* depth sweep (GAPT part 11, Figure 17): frame time of one sample per pixel
  for each maximum depth in ``--depths``, with and without compaction of the
  live paths, median of ``--frames`` frames, plus one profiled frame per
  setting for the per-stage breakdown.

Outputs under ``--out``: ``render_bench.json`` (every record, device, commit,
date), ``render_bench.md`` (tables) and ``render_depth_sweep.png`` (plot).
Timings are measured, never asserted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kdtree_gpu.render as R  # noqa: E402  (the package attribute "render" is the function)
from kdtree_gpu.scenes import (Scene, as_scene, cornell_box, cornell_box_with,  # noqa: E402
                               furnace_scene, mesh_scene)

DEFAULT_DEPTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 50, 100)


# --- inputs ------------------------------------------------------------------------
def mesh_folder(path=None) -> Path:
    folder = (path or os.environ.get("KDTREE_GPU_MESH_DIR")
              or Path(__file__).resolve().parents[2] / "shared" / "meshes")
    folder = Path(folder)
    if not folder.is_dir():
        raise SystemExit(f"mesh folder {folder} not found: pass --mesh-dir or set KDTREE_GPU_MESH_DIR")
    return folder


def read_ply(path):
    """Vertices and faces of a mesh file (float32, int32)."""
    from kdtree_gpu.mesh import load_mesh

    return load_mesh(path)


def load_mesh(name: str, folder: Path):
    path = folder / (name if name.endswith(".ply") else name + ".ply")
    if not path.is_file():
        raise SystemExit(f"no mesh {path}")
    try:
        from kdtree_gpu.mesh import load_mesh as package_load_mesh
    except ImportError:
        return read_ply(path)
    return package_load_mesh(path)


def make_scene(spec: str, folder: Path) -> Scene:
    """A scene from its name (see the module docstring)."""
    if spec == "furnace":
        return furnace_scene(0.5)
    if spec == "cornell" or spec.startswith("cornell+"):
        mesh = load_mesh(spec.split("+", 1)[1], folder) if "+" in spec else None
        scene = as_scene(cornell_box() if mesh is None else cornell_box_with(*mesh))
        scene.name = spec
        return scene
    interior = spec.endswith("@inside")
    mesh_name = spec[:-len("@inside")] if interior else spec
    V, F = load_mesh(mesh_name, folder)
    return mesh_scene(V, F, interior=interior, name=spec)


def parse_size(text: str):
    w, _, h = text.lower().partition("x")
    return int(w), int(h or w)


# --- measurements ------------------------------------------------------------------------
def measure_throughput(renderer, spp, max_depth, repeats=3, compaction=True, seed=0):
    """Median wall time of ``repeats`` renders (after a warm-up) and the derived rates.

    Returns
    -------
    dict
        Settings, ``seconds`` (median), ``samples_per_second``,
        ``rays_per_second`` (closest + shadow), ``paths_per_depth`` and
        ``stages`` of a separate profiled render.
    """
    renderer.render(spp=1, max_depth=max_depth, compaction=compaction, seed=seed, profile=False)
    times = []
    result = None
    for r in range(repeats):
        result = renderer.render(spp=spp, max_depth=max_depth, compaction=compaction,
                                 seed=seed + 1 + r, profile=False)
        times.append(result.stats["seconds"])
    seconds = statistics.median(times)
    profiled = renderer.render(spp=spp, max_depth=max_depth, compaction=compaction, seed=seed,
                               profile=True)
    pixels = renderer.width * renderer.height
    rays = result.stats["rays"] + result.stats["shadow_rays"]
    return {
        "experiment": "throughput",
        "scene": renderer.scene.name,
        "num_triangles": renderer.scene.num_triangles,
        "width": renderer.width,
        "height": renderer.height,
        "spp": spp,
        "max_depth": max_depth,
        "compaction": compaction,
        "seconds": seconds,
        "seconds_all": times,
        "samples_per_second": pixels * spp / seconds,
        "rays_per_second": rays / seconds,
        "closest_rays": result.stats["rays"],
        "shadow_rays": result.stats["shadow_rays"],
        "paths_per_depth": result.stats["paths_per_depth"],
        "build_seconds": renderer.build_seconds,
        "stages": profiled.stats["stages"],
        "profiled_seconds": profiled.stats["seconds"],
    }


def depth_sweep(renderer, depths=DEFAULT_DEPTHS, frames=5, seed=0, profile_depths=(10, 100)):
    """Frame time (one sample per pixel) against maximum depth, with and without compaction.

    Returns
    -------
    list of dict
        One record per (depth, compaction): median ``frame_ms``, all frame
        times, ``paths_per_depth``, ``queue_per_depth`` and, for depths in
        ``profile_depths``, the per-stage profile of one more frame.
    """
    records = []
    for compaction in (True, False):
        renderer.render(spp=1, max_depth=max(depths), compaction=compaction, seed=seed,
                        profile=False)  # warm-up: compile and allocate
        for depth in depths:
            times = []
            result = None
            for f in range(frames):
                result = renderer.render(spp=1, max_depth=depth, compaction=compaction,
                                         seed=seed + f, profile=False)
                times.append(1000.0 * result.stats["seconds"])
            record = {
                "experiment": "depth_sweep",
                "scene": renderer.scene.name,
                "width": renderer.width,
                "height": renderer.height,
                "paths": renderer.width * renderer.height,
                "max_depth": depth,
                "compaction": compaction,
                "frame_ms": statistics.median(times),
                "frame_ms_all": times,
                "paths_per_depth": result.stats["paths_per_depth"],
                "queue_per_depth": result.stats["queue_per_depth"],
            }
            if depth in profile_depths:
                profiled = renderer.render(spp=1, max_depth=depth, compaction=compaction,
                                           seed=seed, profile=True)
                record["stages"] = profiled.stats["stages"]
                # wall time of the profiled frame: against the sum of the stage
                # times it shows how long the GPU waited for the host
                record["profiled_frame_ms"] = 1000.0 * profiled.stats["seconds"]
                record["bounces"] = len(profiled.stats["paths_per_depth"])
            records.append(record)
    return records


# --- reports ----------------------------------------------------------------------------------
def environment() -> dict:
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import git_commit

    info["commit"] = git_commit()
    try:
        from kdtree_gpu.device import device_memory_info, gpu_available

        if gpu_available():
            import cupy

            info["device"] = device_memory_info()["name"]
            info["cupy"] = cupy.__version__
        else:
            info["device"] = "cpu"
    except Exception as exc:  # pragma: no cover - reporting only
        info["device"] = f"unknown ({exc})"
    return info


def stage_table(stages: dict, title: str) -> str:
    lines = [f"**{title}**", "", "| stage | launches | total ms | share |", "|---|---:|---:|---:|"]
    for name, s in stages.items():
        lines.append(f"| {name} | {s['launches']} | {s['total_ms']:.2f} | {100 * s['share']:.1f}% |")
    return "\n".join(lines)


# GPU traversal launches, and the CPU stages that wrap the traversal
TRAVERSAL_STAGES = ("trace closest hit", "trace any hit", "render: intersect closest",
                    "render: trace shadow rays")


def stage_group(name: str) -> str:
    """The group of a stage in the comparison: traversal, compaction or counting, other."""
    if name in TRAVERSAL_STAGES:
        return "traversal"
    if "compact" in name or "count live" in name:
        return "compaction / live count"
    return "other stages"


def compare_stages(with_compaction: dict, without: dict, bounces=None) -> str:
    """Side-by-side stage table of one frame with and without compaction, and group totals."""
    names = sorted(set(with_compaction) | set(without),
                   key=lambda n: -max(with_compaction.get(n, {}).get("total_ms", 0.0),
                                      without.get(n, {}).get("total_ms", 0.0)))
    lines = ["| stage | launches with | ms with | launches without | ms without |",
             "|---|---:|---:|---:|---:|"]
    groups = {}
    for name in names:
        a, b = with_compaction.get(name, {}), without.get(name, {})
        ms_a, ms_b = a.get("total_ms", 0.0), b.get("total_ms", 0.0)
        lines.append(f"| {name} | {a.get('launches', 0)} | {ms_a:.3f} | {b.get('launches', 0)} | "
                     f"{ms_b:.3f} |")
        group = groups.setdefault(stage_group(name), [0.0, 0.0])
        group[0] += ms_a
        group[1] += ms_b
    total_a = sum(g[0] for g in groups.values())
    total_b = sum(g[1] for g in groups.values())
    for group, (ms_a, ms_b) in sorted(groups.items()):
        lines.append(f"| **{group}** | | **{ms_a:.3f}** | | **{ms_b:.3f}** |")
    lines.append(f"| **all stages (GPU time)** | | **{total_a:.3f}** | | **{total_b:.3f}** |")
    return "\n".join(lines)


def markdown_report(env: dict, throughput: list, sweep: list, extra: str = "") -> str:
    out = ["# Path tracer benchmark", "",
           f"Device: {env.get('device')}, commit {env.get('commit')}, {env.get('date')}.", ""]
    if extra:
        out += [extra, ""]
    if throughput:
        out += ["## Throughput", "",
                "| scene | triangles | size | spp | max depth | seconds | Msamples/s | Mrays/s |",
                "|---|---:|---|---:|---:|---:|---:|---:|"]
        for r in throughput:
            out.append(f"| {r['scene']} | {r['num_triangles']:,} | {r['width']}x{r['height']} | "
                       f"{r['spp']} | {r['max_depth']} | {r['seconds']:.3f} | "
                       f"{r['samples_per_second'] / 1e6:.2f} | {r['rays_per_second'] / 1e6:.1f} |")
        out.append("")
        for r in throughput:
            out += [stage_table(r["stages"], f"{r['scene']}: stages of one profiled render"), ""]
    if sweep:
        scenes = sorted({r["scene"] for r in sweep})
        for scene in scenes:
            rows = [r for r in sweep if r["scene"] == scene]
            by_depth = {}
            for r in rows:
                by_depth.setdefault(r["max_depth"], {})[r["compaction"]] = r
            paths = rows[0]["paths"]
            out += [f"## Frame time against maximum depth: {scene}, {paths:,} paths per frame", "",
                    "| max depth | with compaction ms | without ms | speed-up | live paths at last depth |",
                    "|---:|---:|---:|---:|---:|"]
            for depth in sorted(by_depth):
                on, off = by_depth[depth].get(True), by_depth[depth].get(False)
                if on is None or off is None:
                    continue
                out.append(f"| {depth} | {on['frame_ms']:.2f} | {off['frame_ms']:.2f} | "
                           f"{off['frame_ms'] / on['frame_ms']:.2f}x | {on['paths_per_depth'][-1]:,} |")
            out.append("")
            for depth in sorted(by_depth):
                on, off = by_depth[depth].get(True), by_depth[depth].get(False)
                if on is None or off is None or "stages" not in on or "stages" not in off:
                    continue
                out += [f"**{scene}, max depth {depth}: stages of one profiled frame, with and "
                        f"without compaction** (frame wall time {on.get('profiled_frame_ms', 0):.2f} "
                        f"ms with, {off.get('profiled_frame_ms', 0):.2f} ms without; "
                        f"{on.get('bounces', '?')} bounces; the wall time beyond the stage times "
                        f"is time the GPU sat idle between launches, waiting for the host)", "",
                        compare_stages(on["stages"], off["stages"]), ""]
    return "\n".join(out) + "\n"


def plot_sweep(sweep: list, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    scenes = sorted({r["scene"] for r in sweep})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for scene in scenes:
        for compaction, style in ((True, "o-"), (False, "s--")):
            rows = sorted((r for r in sweep if r["scene"] == scene and r["compaction"] == compaction),
                          key=lambda r: r["max_depth"])
            if not rows:
                continue
            label = f"{scene}, {'with' if compaction else 'without'} compaction"
            axes[0].plot([r["max_depth"] for r in rows], [r["frame_ms"] for r in rows], style, label=label)
            axes[1].plot([r["max_depth"] for r in rows], [1000.0 / r["frame_ms"] for r in rows], style,
                         label=label)
    for ax, ylabel in ((axes[0], "frame time (ms)"), (axes[1], "frames per second")):
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlabel("maximum depth")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=8)
    paths = sweep[0]["paths"] if sweep else 0
    fig.suptitle(f"One sample per pixel ({paths:,} paths per frame), with and without compaction")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=float))
    os.replace(tmp, path)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--mesh-dir", default=None)
    parser.add_argument("--scenes", nargs="+", default=["cornell+stanford_bunny", "conference"])
    parser.add_argument("--size", default="1920x1080", help="throughput image size WxH")
    parser.add_argument("--spp", type=int, default=16)
    parser.add_argument("--max-depth", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sweep-scenes", nargs="*", default=["cornell+stanford_bunny"])
    parser.add_argument("--sweep-size", default="1024x1024", help="depth sweep image size (1 spp)")
    parser.add_argument("--depths", type=int, nargs="+", default=list(DEFAULT_DEPTHS))
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--device", default="auto")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    folder = mesh_folder(args.mesh_dir)
    env = environment()
    print(f"device {env['device']}, commit {env['commit']}", flush=True)
    width, height = parse_size(args.size)
    throughput = []
    for spec in args.scenes:
        renderer = R.Renderer(make_scene(spec, folder), width, height, device=args.device)
        record = measure_throughput(renderer, args.spp, args.max_depth, repeats=args.repeats)
        throughput.append(record)
        print(f"{spec}: {record['samples_per_second'] / 1e6:.2f} Msamples/s, "
              f"{record['rays_per_second'] / 1e6:.1f} Mrays/s", flush=True)
    sweep = []
    sweep_w, sweep_h = parse_size(args.sweep_size)
    for spec in args.sweep_scenes:
        renderer = R.Renderer(make_scene(spec, folder), sweep_w, sweep_h, device=args.device)
        sweep += depth_sweep(renderer, args.depths, frames=args.frames)
    write_json(out / "render_bench.json", {"environment": env, "throughput": throughput,
                                           "depth_sweep": sweep})
    (out / "render_bench.md").write_text(markdown_report(env, throughput, sweep))
    if sweep:
        plot_sweep(sweep, out / "render_depth_sweep.png")
    print((out / "render_bench.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
