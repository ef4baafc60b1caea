"""``kdtree-gpu demo``: the Cornell box built, traced and rendered; works without a GPU."""

from __future__ import annotations

import time
from pathlib import Path

from .common import (EXIT_FAILURE, EXIT_OK, build_tree, cast_brute_force, cast_rays,
                     check_writable, format_summary, load_scene, resolve_cli_device,
                     summarize_tree)

DEFAULT_OUTPUT = "kdtree_gpu_demo.png"
SCENE = "cornell"
NUM_RAYS = 20_000
MAX_DEPTH = 5


EXAMPLES = """examples:
  kdtree-gpu demo                                 # writes kdtree_gpu_demo.png
  kdtree-gpu demo -o /tmp/demo.png --device cpu"""


def run(args) -> int:
    """Build, cast checked rays, render; 1 when the rays disagree with brute force."""
    from ..config import SAHConfig
    from ..render import render, save_png
    from ..testing import compare_hits, random_rays

    device = resolve_cli_device(args.device)
    out = Path(args.output).expanduser()
    check_writable(out)
    scene = load_scene(SCENE)
    vertices, faces = scene.arrays()
    print(f"demo on {device}: built-in scene '{SCENE}', {faces.shape[0]} triangles")
    tree, build_ms = build_tree(vertices, faces, SAHConfig(), device)
    print("  built:    " + format_summary("tree", summarize_tree(tree), build_ms))
    rays = random_rays(tree.bounds, NUM_RAYS, seed=0)
    cast_rays(tree, rays, device)  # warm-up: JIT, upload
    start = time.perf_counter()
    hits = cast_rays(tree, rays, device)
    seconds = time.perf_counter() - start
    comparison = compare_hits(hits, cast_brute_force(vertices, faces, rays, device))
    print(f"  cast:     {NUM_RAYS} random rays, {comparison.num_hits} hits, "
          f"{NUM_RAYS / max(seconds, 1e-9):.3g} rays/s; "
          + ("all agree with brute force" if comparison.ok
             else f"MISMATCH: {comparison.describe()}"))
    width, height = args.size
    start = time.perf_counter()
    with device.use():
        result = render(scene, width, height, spp=args.spp, max_depth=MAX_DEPTH,
                        device=device.kind, tree=tree)
    seconds = time.perf_counter() - start
    save_png(result.image, out)
    print(f"  rendered: {width}x{height}, {args.spp} spp in {seconds:.2f} s -> {out}")
    return EXIT_OK if comparison.ok else EXIT_FAILURE


def add_parser(commands, shared) -> None:
    """Declare ``kdtree-gpu demo``: its help, examples and options."""
    from .options import parse_size, positive_int

    p = shared.add(commands, "demo", "build, trace and render the Cornell box",
                   "Build a tree for the built-in Cornell box, cast random rays (checked against brute "
                   "force), render a small image and write it as a PNG. Runs on the CPU when no GPU "
                   "is usable.", EXAMPLES, [shared.device])
    p.add_argument("-o", "--output", default=DEFAULT_OUTPUT, metavar="PNG",
                   help=f"the image to write (default: {DEFAULT_OUTPUT})")
    p.add_argument("--size", type=parse_size, default=(128, 128), metavar="WxH|N",
                   help="image size (default: 128x128)")
    p.add_argument("--spp", type=positive_int, default=16, help="samples per pixel (default: 16)")
    p.set_defaults(handler=run)
