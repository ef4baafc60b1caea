"""``kdtree-gpu bench``: build times and ray throughput per builder, as a table."""

from __future__ import annotations

import time

import numpy as np

from .common import (EXIT_OK, CliError, MeshInput, build_tree, cast_rays, check_buildable,
                     config_from_args, describe_device, load_input, print_json,
                     resolve_cli_device, resolve_mesh_inputs, summarize_tree)

# builder name -> kd.build's kernels, and whether it runs on the GPU
BUILDERS = {"gpu": ("fused", True), "numpy": ("xp", False), "reference": ("reference", False)}


EXAMPLES = """examples:
  kdtree-gpu bench                                # built-in scenes
  kdtree-gpu bench stanford_bunny teapot.ply --repeat 5
  kdtree-gpu bench --builders reference,numpy --rays 20000 --json"""


def run(args) -> int:
    """Time every builder on every input; print a table (or JSON lines)."""
    from ..device import CPU
    from ..scenes import scene_names

    config = config_from_args(args)
    device = resolve_cli_device(args.device)
    available = {name: device.is_cuda or not on_gpu for name, (_, on_gpu) in BUILDERS.items()}
    if args.builders is None:
        builders = [name for name, ok in available.items() if ok]
    else:
        builders = [b.strip() for b in args.builders.split(",") if b.strip()]
        unknown = [b for b in builders if b not in BUILDERS]
        if unknown or not builders:
            raise CliError(f"--builders: unknown builder(s) {unknown or args.builders!r}; "
                           f"choose from {', '.join(BUILDERS)}")
        if not all(available[b] for b in builders):
            raise CliError(f"--builders gpu: no GPU to run it on (--device {args.device} is "
                           f"{device}); leave out 'gpu'")
    inputs = [] if args.no_scenes else [MeshInput(label=n, scene=n) for n in scene_names()]
    found, errors = resolve_mesh_inputs(args.meshes) if args.meshes else ([], [])
    if errors:
        raise CliError(errors[0][1])
    inputs += found
    if not inputs:
        raise CliError("nothing to benchmark (--no-scenes and no meshes given)")
    rows = []
    for item in inputs:
        vertices, faces = load_input(item)
        check_buildable(item, vertices, faces)
        for builder in builders:
            kernels, on_gpu = BUILDERS[builder]
            rows.append(bench_case(item.label, vertices, faces, builder, kernels,
                                   device if on_gpu else CPU, config, args.repeat, args.rays))
            if args.json:
                print_json(rows[-1])
    if not args.json:
        print(format_table(rows))
        runs = "one run" if args.repeat == 1 else f"median of {args.repeat} runs"
        print(f"({runs} after a warm-up build and trace; {args.rays} random rays; "
              f"{describe_device(device)})")
    return EXIT_OK


def bench_case(label, vertices, faces, builder, kernels, device, config, repeat,
               num_rays) -> dict:
    """Time one builder on one mesh: build ms and rays/s, medians of ``repeat`` runs.

    One build and one trace of the same rays run first, untimed, so that no
    row pays for compilation, caches or memory pools that a row before it
    would have paid for.
    """
    from ..testing import random_rays

    tree, _ = build_tree(vertices, faces, config, device, kernels=kernels)  # warm-up
    rays = random_rays(tree.bounds, num_rays, seed=1) if num_rays else None
    if rays is not None:
        cast_rays(tree, rays, device)  # warm-up
    build_ms = [build_tree(vertices, faces, config, device, kernels=kernels)[1]
                for _ in range(repeat)]
    row = {"mesh": label, "triangles": int(np.asarray(faces).shape[0]), "builder": builder,
           "device": str(device), "build_ms": float(np.median(build_ms)),
           "nodes": tree.num_nodes, "sah_cost": summarize_tree(tree).get("sah_cost"),
           "rays_per_s": None}
    if rays is not None:
        seconds = []
        for _ in range(repeat):
            start = time.perf_counter()
            cast_rays(tree, rays, device)  # results on the host: the trace has finished
            seconds.append(time.perf_counter() - start)
        row["rays_per_s"] = num_rays / max(float(np.median(seconds)), 1e-9)
    return row


def format_table(rows) -> str:
    """Rows of ``bench`` as an aligned text table."""
    header = ["mesh", "tris", "builder", "build ms", "nodes", "SAH cost", "rays/s"]
    body = []
    for r in rows:
        body.append([r["mesh"], str(r["triangles"]), r["builder"], f"{r['build_ms']:.1f}",
                     str(r["nodes"]),
                     "-" if r["sah_cost"] is None else f"{r['sah_cost']:.1f}",
                     "-" if r["rays_per_s"] is None else f"{r['rays_per_s']:.3g}"])
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(header)]
    numeric = {1, 3, 4, 5, 6}

    def line(cells):
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(b) for b in body])


def add_parser(commands, shared) -> None:
    """Declare ``kdtree-gpu bench``: its help, examples and options."""
    from .options import non_negative_int, positive_int

    p = shared.add(commands, "bench", "a quick benchmark table",
                   "Time the builders on the built-in scenes and on any meshes given, and the ray "
                   "throughput of the resulting trees; prints a table. Every builder builds and traces "
                   "once before the clock starts (compilation, caches, memory pools), then the median "
                   "of --repeat runs is shown.", EXAMPLES, [shared.device, shared.sah, shared.json])
    p.add_argument("meshes", nargs="*", metavar="MESH", help="extra mesh files, globs or names")
    p.add_argument("--builders", default=None, metavar="LIST",
                   help=f"comma-separated subset of {','.join(BUILDERS)} "
                        "(default: all that can run on --device)")
    p.add_argument("--no-scenes", action="store_true", help="skip the built-in scenes")
    p.add_argument("--repeat", type=positive_int, default=3,
                   help="timed runs per case (default: 3)")
    p.add_argument("--rays", type=non_negative_int, default=100_000, metavar="N",
                   help="random rays for the throughput column; 0 skips it (default: 100000)")
    p.set_defaults(handler=run)
