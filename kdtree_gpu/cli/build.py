"""``kdtree-gpu build``: meshes to tree files, one line of statistics per mesh."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Optional

from ..mesh import MESH_DIR_ENV
from .common import (EXIT_FAILURE, EXIT_OK, EXIT_USAGE, TREE_SUFFIX, CliError, about,
                     check_writable, config_from_args, describe_error, format_summary, isatty,
                     print_error, print_json, print_line, print_note, print_warning,
                     progress_bar, resolve_cli_device, resolve_mesh_inputs)
from .options import positive_int


EXAMPLES = """examples:
  kdtree-gpu build bunny.ply                      # writes bunny.kdt
  kdtree-gpu build bunny.ply -o trees/bunny.kdt --clip
  kdtree-gpu build 'meshes/*.ply' -o trees/       # a batch, with a progress bar
  kdtree-gpu build stanford_bunny teapot -o trees/ --json   # names from $KDTREE_GPU_MESH_DIR
  kdtree-gpu build dragon.ply --device cpu --axes longest --max-depth 20 --force
  kdtree-gpu build stanford_dragon_res2 --device cuda:0 --profile   # per-stage GPU times
  kdtree-gpu build 'meshes/*.ply' -o trees/ --workers 2           # one worker per GPU (or CPU)
  kdtree-gpu build 'meshes/*.ply' -o trees/ --scheduler tcp://head:8786 --json   # a cluster"""


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
    from .. import batch

    config = config_from_args(args)
    distributed = args.workers is not None or args.scheduler is not None
    if distributed:
        _check_dask(args)
    else:
        resolve_cli_device(args.device)
    inputs, errors = resolve_mesh_inputs(args.meshes)
    # a batch reports a mesh that fails and goes on; a single mesh that
    # fails is the command's error (an input error unless the build broke)
    is_batch = len(inputs) + len(errors) > 1
    if not is_batch and errors:
        raise CliError(errors[0][1])
    for spec, message in errors:
        print_error(message)
        if args.json:
            print_json({"mesh": spec, "ok": False, "error": message})
    if not inputs:
        raise CliError(f"none of the {len(errors)} arguments names a mesh file")
    outputs, in_directory = plan_outputs(inputs, args.output)
    jobs = batch.plan_jobs([item.path if item.path is not None else item.scene
                            for item in inputs], outputs=outputs)
    bar = progress_bar(len(inputs), enabled=args.progress or isatty(sys.stderr), leave=is_batch)
    records, runnable = [], []
    for item, job in zip(inputs, jobs):
        try:
            check_writable(Path(job.output), create_parent=in_directory)
        except CliError as exc:
            records.append(batch.failed_record(job, exc, input_error=True))
            _report(records[-1], item, config, args, bar)
            continue
        runnable.append(job)

    def on_record(record):
        records.append(record)
        _report(record, inputs[record.index], config, args, bar)

    def show_fraction(job, fraction):
        bar.set_postfix_str(f"{inputs[job.index].label} {fraction:.0%}")

    settings = batch.BatchSettings(config=config, device=args.device, force=args.force,
                                   build_options={"profile": args.profile})
    try:
        if distributed:
            with _dask_client(args) as connect:
                batch.run_jobs(runnable, settings, connect=connect, on_record=on_record)
        else:
            # the builder's own progress redraws the bar in place, on a terminal only
            batch.run_jobs(runnable, settings, on_record=on_record,
                           progress=show_fraction if isatty(sys.stderr) else None)
    except KeyboardInterrupt:
        if args.workers is not None:
            # the local workers are gone: clear what the killed ones were writing
            done = {r.index for r in records}
            batch.remove_partial_trees([job for job in runnable if job.index not in done])
        raise
    finally:
        bar.close()
    failures = [r for r in records if not r.ok]
    if not is_batch:
        return (EXIT_USAGE if failures[0].input_error else EXIT_FAILURE) if failures else EXIT_OK
    num_failed = len(failures) + len(errors)
    if num_failed:
        print_error(f"{num_failed} of {len(inputs) + len(errors)} meshes failed")
        return EXIT_FAILURE
    return EXIT_OK


def _report(record, item, config, args, bar) -> None:
    """Print one mesh's outcome (a line or a JSON object) and advance the bar."""
    from .. import batch

    bar.update(1)
    for warning in record.warnings:
        print_warning(f"{item.subject}: {warning}")
    if record.status == batch.FAILED:
        if args.debug and record.exception is not None:
            raise record.exception
        message = about(item.subject, _error_message(record))
        print_error(message)
        if args.json:
            print_json({"mesh": item.subject, "ok": False, "status": record.status,
                        "error": message, "output": record.output, "worker": record.worker,
                        "retries": record.retries})
        return
    bar.set_postfix_str(item.label, refresh=False)
    if args.json:
        json_record = {"mesh": item.subject, "ok": True, "status": record.status,
                       "output": record.output, "triangles": record.triangles,
                       "sha256": record.sha256, "worker": record.worker,
                       "retries": record.retries, "config": config.to_dict()}
        if record.status == batch.BUILT:
            json_record.update(reason=record.reason, device=record.device, gpu=record.gpu,
                               build_ms=1e3 * record.seconds)
            json_record.update(record.stats)
            if args.profile:
                json_record["profile"] = record.build_info.get("profile")
        print_json(json_record)
        return
    if record.status == batch.UP_TO_DATE:
        print_line(f"{item.label}: up to date -> {record.output}")
        return
    line = format_summary(item.label, record.stats, 1e3 * record.seconds) + f" -> {record.output}"
    if record.retries:
        line += (" (run again after its worker died)" if record.retries == 1
                 else f" (run again after {record.retries} workers died)")
    print_line(line)
    if args.profile and record.build_info.get("profile_table"):
        print_line(record.build_info["profile_table"])


def _error_message(record) -> str:
    # this process's exception is described as every command describes one;
    # a worker's arrives as its one line
    if record.exception is not None:
        message = describe_error(record.exception)
    else:
        message = record.error
    return message.replace("force=True", "--force")


def _check_dask(args) -> None:
    """Usage errors of --workers / --scheduler, before any work."""
    from .. import batch
    from ..device import parse_device

    option = "--workers" if args.workers is not None else "--scheduler"
    try:
        batch.require_dask(option)
    except ImportError as exc:
        raise CliError(str(exc)) from None
    if args.workers is not None:
        if parse_device(args.device)[1] is not None:
            raise CliError(f"--device {args.device} names one GPU; with --workers each worker "
                           "uses its own GPU (use --device auto, gpu or cpu)")
        resolve_cli_device(args.device)


@contextlib.contextmanager
def _dask_client(args):
    """A function that starts (--workers) or connects to (--scheduler) a cluster when called."""
    from .. import batch

    with contextlib.ExitStack() as stack:
        def connect():
            if args.scheduler is not None:
                try:
                    client = stack.enter_context(batch.connect(args.scheduler))
                except (OSError, RuntimeError) as exc:
                    raise CliError(f"--scheduler {args.scheduler}: {describe_error(exc)}") from None
                print_note(f"cluster at {args.scheduler}: {len(client.nthreads())} workers")
            else:
                client = stack.enter_context(batch.local_client(args.workers, device=args.device))
                print_note(f"local cluster: {client.cluster.kdtree_gpu_layout}")
            link = batch.dashboard_link(client)
            if link and args.workers is not None and not batch.has_bokeh():
                link += " (its pages need bokeh: pip install 'bokeh>=3.1')"
            print_note(f"dashboard: {link or 'none'}")
            return client

        yield connect


def add_parser(commands, shared) -> None:
    """Declare ``kdtree-gpu build``: its help, examples and options."""
    p = shared.add(commands, "build", "build tree files from meshes",
                   "Build a kd-tree for each mesh and save it to a tree file. MESH is a path, a glob "
                   f"(quote it), or a bare name looked up in ${MESH_DIR_ENV} (with or without '.ply'). "
                   "One mesh that cannot be read or built is an input error (exit status 2); in a batch "
                   "such a mesh is reported and skipped, the others still build, and the exit status "
                   "is 1. A tree records the sha256 of its mesh and the build settings: a mesh "
                   "whose tree is up to date is skipped, so an interrupted batch resumes where it "
                   "stopped.",
                   EXAMPLES, [shared.device, shared.sah, shared.json])
    p.add_argument("meshes", nargs="+", metavar="MESH", help="mesh files, globs or names")
    p.add_argument("-o", "--output", metavar="OUT",
                   help=f"output file (one mesh) or directory (created when the first tree is "
                        f"written; several meshes need one: not a name ending in {TREE_SUFFIX}); "
                        f"default: <stem>{TREE_SUFFIX} in the current directory")
    p.add_argument("--force", action="store_true",
                   help="build every mesh and overwrite its tree file (default: skip a mesh whose "
                        "tree is up to date, rebuild an out-of-date one, refuse other files)")
    p.add_argument("--progress", action="store_true",
                   help="show the progress bar even when stderr is not a terminal")
    p.add_argument("--profile", action="store_true",
                   help="print the per-stage time table of each build")
    dask = p.add_argument_group("many meshes on a Dask cluster (pip install 'kdtree-gpu[dask]')")
    where = dask.add_mutually_exclusive_group()
    where.add_argument("--workers", type=positive_int, metavar="N",
                       help="start a local cluster of N worker processes; with GPUs, worker i "
                            "builds on GPU i mod the GPU count (dask-cuda's LocalCUDACluster, one "
                            "worker per GPU, when installed; else CUDA_VISIBLE_DEVICES set per "
                            "worker); CPU workers without a GPU or with --device cpu")
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="run on an existing cluster, e.g. tcp://host:8786 (started with "
                            "'dask scheduler' and 'dask worker', or any Dask deployment); every "
                            "worker must read the meshes and write the output directory")
    p.set_defaults(handler=run)
