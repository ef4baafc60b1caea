"""``kdtree-gpu build``: meshes to tree files, one line of statistics per mesh."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from ..mesh import MESH_DIR_ENV
from .common import (EXIT_FAILURE, EXIT_OK, TREE_SUFFIX, CliError, ProgressBar, about,
                     build_tree, check_writable, config_from_args, describe_error, exit_status,
                     format_summary, isatty, load_input, make_parent, print_error, print_json,
                     print_warning, resolve_cli_device, resolve_mesh_inputs, summarize_tree)


EXAMPLES = """examples:
  kdtree-gpu build bunny.ply                      # writes bunny.kdt
  kdtree-gpu build bunny.ply -o trees/bunny.kdt --clip
  kdtree-gpu build 'meshes/*.ply' -o trees/       # a batch, with a progress bar
  kdtree-gpu build stanford_bunny teapot -o trees/ --json   # names from $KDTREE_GPU_MESH_DIR
  kdtree-gpu build dragon.ply --device cpu --axes longest --max-depth 20 --force
  kdtree-gpu build stanford_dragon_res2 --device cuda:0 --profile   # per-stage GPU times"""


def plan_outputs(inputs, output: Optional[str]):
    """Output path of every input.

    One input and an ``OUT`` that is not an existing directory and does not
    end with a separator: ``OUT`` is the file. Otherwise ``OUT`` (default:
    the current directory) is a directory holding ``<stem>.kdt`` per mesh;
    it is created when the first tree is written, so a batch that writes
    nothing leaves nothing behind.

    Returns
    -------
    outputs : list of Path
    in_directory : bool
        Whether the outputs go into ``OUT`` as a directory (which may be
        created) rather than to ``OUT`` itself (whose folder must exist).

    Raises
    ------
    CliError
        Several meshes and an ``OUT`` that names one file (an existing file,
        or a name ending in ``.kdt``).
    """
    names_a_directory = output is not None and output.endswith(("/", os.sep))
    if output is not None and len(inputs) == 1 and not names_a_directory \
            and not Path(output).expanduser().is_dir():
        return [Path(output).expanduser()], False
    directory = Path(output).expanduser() if output is not None else Path(".")
    if len(inputs) > 1 and not names_a_directory and (
            directory.is_file() or directory.suffix.lower() == TREE_SUFFIX):
        raise CliError(f"-o {output}: {len(inputs)} meshes need an output directory, but this "
                       "names one tree file (give a directory, e.g. -o trees/)")
    if directory.exists() and not directory.is_dir():
        raise CliError(f"-o {output}: not a directory")
    return [directory / (item.label + TREE_SUFFIX) for item in inputs], True


def run(args) -> int:
    """Build every mesh; see the package docstring for the exit status."""
    config = config_from_args(args)
    device = resolve_cli_device(args.device)
    inputs, errors = resolve_mesh_inputs(args.meshes)
    # a batch reports a mesh that fails and goes on; a single mesh that
    # fails is the command's error (an input error unless the build broke)
    batch = len(inputs) + len(errors) > 1
    if not batch and errors:
        raise CliError(errors[0][1])
    for spec, message in errors:
        print_error(message)
        if args.json:
            print_json({"mesh": spec, "ok": False, "error": message})
    if not inputs:
        raise CliError(f"none of the {len(errors)} arguments names a mesh file")
    outputs, in_directory = plan_outputs(inputs, args.output)
    progress = ProgressBar(len(inputs), enabled=args.progress or isatty(sys.stderr))
    failures = []
    claimed = set()
    for i, (item, out) in enumerate(zip(inputs, outputs)):
        progress.show(i, item.label)
        try:
            if out.resolve() in claimed:
                raise CliError(f"{out} is also the output of an earlier mesh in this batch "
                               "(two meshes with the same name)")
            claimed.add(out.resolve())
            if out.exists() and not args.force:
                raise CliError(f"{out} exists (use --force to overwrite)")
            check_writable(out, create_parent=in_directory)
            vertices, faces = load_input(item)

            def show_fraction(fraction, i=i, label=item.label):
                progress.show(i, label, fraction)

            tree, build_ms = _build(vertices, faces, config, device, args,
                                    progress=show_fraction if progress.in_place else None)
            make_parent(out)
            tree.save(out)
            summary = summarize_tree(tree)
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            if args.debug:
                raise
            progress.clear()
            message = about(item.subject, describe_error(exc))
            print_error(message)
            if args.json:
                print_json({"mesh": item.subject, "ok": False, "error": message})
            failures.append(exc)
            continue
        progress.clear()
        if args.json:
            record = {"mesh": item.subject, "ok": True, "output": str(out),
                      "device": tree.build_info.get("device"), "build_ms": build_ms,
                      "config": config.to_dict()}
            record.update(summary)
            if args.profile:
                record["profile"] = tree.build_info.get("profile")
            print_json(record)
        else:
            print(format_summary(item.label, summary, build_ms) + f" -> {out}", flush=True)
            if args.profile and tree.build_info.get("profile_table"):
                print(tree.build_info["profile_table"], flush=True)
    progress.show(len(inputs), "done")
    progress.clear()
    if not batch:
        return exit_status(failures[0]) if failures else EXIT_OK
    num_failed = len(failures) + len(errors)
    if num_failed:
        print_error(f"{num_failed} of {len(inputs) + len(errors)} meshes failed")
        return EXIT_FAILURE
    return EXIT_OK


def _build(vertices, faces, config, device, args, progress):
    # settings the GPU builder lacks (perfect splits) build on the CPU when
    # the user let the tool choose (--device auto)
    try:
        return build_tree(vertices, faces, config, device, profile=args.profile,
                          progress=progress)
    except NotImplementedError as exc:
        if not (device.is_cuda and args.device == "auto"):
            raise CliError(str(exc)) from exc
        print_warning(f"building on the CPU: {exc}")
        from ..device import CPU

        return build_tree(vertices, faces, config, CPU, profile=args.profile, progress=progress)


def add_parser(commands, shared) -> None:
    """Declare ``kdtree-gpu build``: its help, examples and options."""
    p = shared.add(commands, "build", "build tree files from meshes",
                   "Build a kd-tree for each mesh and save it to a tree file. MESH is a path, a glob "
                   f"(quote it), or a bare name looked up in ${MESH_DIR_ENV} (with or without '.ply'). "
                   "One mesh that cannot be read or built is an input error (exit status 2); in a batch "
                   "such a mesh is reported and skipped, the others still build, and the exit status "
                   "is 1.",
                   EXAMPLES, [shared.device, shared.sah, shared.json])
    p.add_argument("meshes", nargs="+", metavar="MESH", help="mesh files, globs or names")
    p.add_argument("-o", "--output", metavar="OUT",
                   help=f"output file (one mesh) or directory (created when the first tree is "
                        f"written; several meshes need one: not a name ending in {TREE_SUFFIX}); "
                        f"default: <stem>{TREE_SUFFIX} in the current directory")
    p.add_argument("--force", action="store_true", help="overwrite existing tree files")
    p.add_argument("--progress", action="store_true",
                   help="show the progress bar even when stderr is not a terminal")
    p.add_argument("--profile", action="store_true",
                   help="print the per-stage time table of each build")
    p.set_defaults(handler=run)
