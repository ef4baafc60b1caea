"""``kdtree-gpu verify``: the pipeline against the CPU reference and brute force; PASS or FAIL."""

from __future__ import annotations

import time
from typing import Callable

from .common import (EXIT_FAILURE, EXIT_OK, CliError, build_tree, cast_brute_force, cast_rays,
                     check_buildable, config_from_args, describe_error, format_summary,
                     load_input, print_json, resolve_cli_device, single_input, summarize_tree)


EXAMPLES = """examples:
  kdtree-gpu verify teapot.ply
  kdtree-gpu verify stanford_bunny --rays 1000000 --axes longest
  kdtree-gpu verify cornell --device cpu --rays 10000"""


def pipeline(device):
    """The level-by-level builder on ``device``: ``(name for output, kernels for kd.build)``."""
    return ("GPU pipeline", "fused") if device.is_cuda else ("NumPy pipeline", "xp")


def run(args) -> int:
    """Build twice, compare, check, cast rays; 0 for PASS, 1 for FAIL, 2 for a bad input."""
    from ..device import CPU
    from ..testing import compare_hits, random_rays

    config = config_from_args(args)
    device = resolve_cli_device(args.device)
    item = single_input(args.mesh)
    vertices, faces = load_input(item)
    # a mesh that no builder can build is a bad input, not a FAIL of the builders
    bounds = check_buildable(item, vertices, faces)
    name, kernels = pipeline(device)
    reasons, lines = [], []
    facts = {"mesh": item.subject, "device": str(device), "builder": name, "rays": args.rays}

    def step(what: str, fn: Callable):
        # a crash in one step is a FAIL reason, not an abort: the other steps still run
        try:
            return fn()
        except (KeyboardInterrupt, CliError):
            raise
        except NotImplementedError as exc:
            # settings a builder lacks: nothing to verify
            raise CliError(f"{what}: {exc}") from exc
        except Exception as exc:
            if args.debug:
                raise
            reasons.append(f"{what} raised {type(exc).__name__}: {describe_error(exc)}")
            return None

    built = step(name, lambda: build_tree(vertices, faces, config, device, kernels=kernels))
    reference = step("CPU reference", lambda: build_tree(vertices, faces, config, CPU,
                                                         kernels="reference"))
    if built is not None:
        tree, facts["build_ms"] = built
        lines.append(format_summary(name, summarize_tree(tree), facts["build_ms"]))
    if reference is not None:
        ref_tree, facts["reference_ms"] = reference
        lines.append(format_summary("CPU reference", summarize_tree(ref_tree),
                                    facts["reference_ms"]))
    if built is not None and reference is not None:
        difference = step("compare", lambda: tree.compare(ref_tree))
        if difference is not None:
            reasons.append(f"trees differ: {difference}")
        else:
            lines.append("trees: identical")
    if built is not None:
        if step("check", lambda: tree.check() or "ok") == "ok":
            lines.append("invariants: ok")
        rays = random_rays(bounds, args.rays, args.seed)

        def cast():
            start = time.perf_counter()
            hits = cast_rays(tree, rays, device)
            facts["rays_per_s"] = args.rays / max(time.perf_counter() - start, 1e-9)
            return compare_hits(hits, cast_brute_force(vertices, faces, rays, device))

        comparison = step("ray casting", cast)
        if comparison is not None:
            facts["hits"] = comparison.num_hits
            if not comparison.ok:
                reasons.append(comparison.describe())
            elif comparison.num_hits == 0:
                reasons.append(f"none of the {args.rays} rays hit the mesh, so none tested the "
                               "traversal (the rays are aimed into the mesh's box)")
            else:
                lines.append(f"rays: {args.rays} agree with brute force "
                             f"({comparison.num_hits} hits, {comparison.num_ties} ties, "
                             f"{facts['rays_per_s']:.3g} rays/s)")
    verdict = "PASS" if not reasons else "FAIL"
    if args.json:
        print_json({**facts, "verdict": verdict, "reasons": reasons})
    else:
        print(f"verify {facts['mesh']} ({name} on {device} vs CPU reference, {args.rays} rays)")
        for line in lines:
            print(f"  {line}")
        print(verdict + ("" if not reasons else ":"))
        for reason in reasons:
            print(f"  - {reason}")
    return EXIT_OK if not reasons else EXIT_FAILURE


def add_parser(commands, shared) -> None:
    """Declare ``kdtree-gpu verify``: its help, examples and options."""
    from .options import positive_int

    p = shared.add(commands, "verify", "check the builder against the CPU reference and brute force",
                   "Build MESH with the level-by-level pipeline (on the GPU, or the NumPy pipeline with "
                   "--device cpu or without a usable GPU) and with the Wald & Havran CPU reference, "
                   "compare the two trees, check the tree's invariants, and cast random rays (scaled to "
                   "the mesh's box) against brute force. Prints PASS or FAIL with the reasons; the exit "
                   "status is 0 for PASS, 1 for FAIL (also when no ray hits the mesh) and 2 for a mesh "
                   "that cannot be built at all.",
                   EXAMPLES, [shared.device, shared.sah, shared.json])
    p.add_argument("mesh", metavar="MESH", help="a mesh file, a name, or a built-in scene")
    p.add_argument("--rays", type=positive_int, default=100_000, metavar="N",
                   help="random rays checked against brute force (default: 100000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random rays (default: 0)")
    p.set_defaults(handler=run)
