"""What every command shares: errors and exit codes, output, inputs, devices, output paths.

The commands call the library for the work (``kd.build``, ``load_mesh``,
``load_tree``, ray queries, the renderer); this module turns command-line
arguments into the library's inputs and the library's results and errors
into lines for the user.
"""

from __future__ import annotations

import dataclasses
import glob
import inspect
import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Optional

import numpy as np

from ..config import SAHConfig
from ..tree.io import json_default

PROG = "kdtree-gpu"
TREE_SUFFIX = ".kdt"

# the exit-code rule (the package docstring and the README state it)
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A usage or input error, reported as one line ``kdtree-gpu: error: <message>`` (exit 2)."""


# --- one-line messages and JSON ---------------------------------------------------

def print_error(message: str) -> None:
    """Write ``kdtree-gpu: error: <message>`` as one line on stderr."""
    _write_line(f"{PROG}: error: {_one_line(message)}", sys.stderr)


def print_warning(message: str) -> None:
    """Write ``kdtree-gpu: warning: <message>`` as one line on stderr."""
    _write_line(f"{PROG}: warning: {_one_line(message)}", sys.stderr)


def print_note(message: str) -> None:
    """Write ``kdtree-gpu: <message>`` as one line on stderr (where the work runs, a dashboard)."""
    _write_line(f"{PROG}: {_one_line(message)}", sys.stderr)


def print_line(text: str) -> None:
    """Write one line of results on stdout, above the progress bar when one is drawn."""
    _write_line(text, sys.stdout)


def _write_line(text: str, stream) -> None:
    # through tqdm, which erases a bar on the terminal first and draws it again after
    tqdm = sys.modules.get("tqdm")
    if tqdm is None:
        stream.write(text + "\n")
    else:
        tqdm.tqdm.write(text, file=stream)
    stream.flush()


def _one_line(message) -> str:
    return " ".join(str(message).split())


def print_json(record: dict) -> None:
    """One JSON object on one line of stdout (non-finite floats become ``null``)."""
    print_line(json.dumps(_finite_or_none(record), default=json_default))


def _finite_or_none(value):
    # strict JSON has no NaN or Infinity
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    if isinstance(value, (float, np.floating)) and not math.isfinite(float(value)):
        return None
    return value


def describe_error(exc: BaseException) -> str:
    """One line that tells the user what went wrong.

    Returns
    -------
    str
        The message of a known error (a bad mesh or tree file, a missing or
        unwritable file, a device problem); for anything else the exception
        type and message with a hint to rerun with ``--debug``.
    """
    if isinstance(exc, OSError):
        target = exc.filename
        if isinstance(exc, FileNotFoundError) and target is not None:
            return f"no such file or directory: {target}"
        if isinstance(exc, PermissionError) and target is not None:
            return f"permission denied: {target}"
        what = exc.strerror or str(exc)
        return f"{what}: {target}" if target is not None else what
    if is_user_error(exc) or (isinstance(exc, (ValueError, RuntimeError, TypeError)) and str(exc)):
        return str(exc)
    return f"unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)"


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the input is bad (exit 2) rather than that the work failed (exit 1)."""
    from ..mesh import MeshError
    from ..tree import TreeFileError

    return isinstance(exc, (CliError, MeshError, TreeFileError, OSError))


def exit_status(exc: BaseException) -> int:
    """The exit status of a command that ended with ``exc``."""
    return EXIT_USAGE if is_user_error(exc) else EXIT_FAILURE


def about(subject, message: str) -> str:
    """``"<subject>: <message>"``, unless the message names the subject already."""
    subject = str(subject)
    return message if subject in message else f"{subject}: {message}"


# --- the progress bar ----------------------------------------------------------------

def progress_bar(total: int, enabled: bool, leave: bool = True, unit: str = "mesh"):
    """The command line's progress bar: tqdm on stderr.

    Parameters
    ----------
    total : int
        Number of steps.
    enabled : bool
        When False the bar draws nothing (every method still works).
    leave : bool
        Keep the finished bar on the screen (a batch) or erase it (one mesh).

    Returns
    -------
    tqdm.tqdm
        ``update(1)`` per finished step, ``set_postfix_str(text)`` for the
        current one; lines printed meanwhile go through :func:`print_line`
        and the ``print_*`` functions, which keep the bar below them.
    """
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, file=sys.stderr, leave=leave, unit=unit,
                dynamic_ncols=True)


def isatty(stream) -> bool:
    """Whether ``stream`` is a terminal (False for anything without a working ``isatty``)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


# --- inputs: mesh files, names, globs, built-in scenes ---------------------------------

@dataclasses.dataclass
class MeshInput:
    """One thing to work on: a mesh file or a built-in scene."""

    label: str
    path: Optional[Path] = None
    scene: Optional[str] = None

    @property
    def subject(self) -> str:
        """How messages name the input: the file's path or the scene's name."""
        return str(self.path) if self.path is not None else self.label


def resolve_mesh_inputs(specs, allow_scenes: bool = True):
    """Turn command-line mesh arguments into inputs.

    A spec is, in this order: a glob (expanded in the current directory,
    then in the mesh directory); a path or a bare name that
    :func:`kdtree_gpu.mesh.resolve_mesh_path` finds; a built-in scene name.

    Returns
    -------
    inputs : list of MeshInput
        In the order given, globs sorted, duplicates dropped.
    errors : list of (str, str)
        ``(spec, message)`` for every spec that matched nothing.
    """
    from ..mesh import mesh_dir, resolve_mesh_path
    from ..scenes import scene_names

    inputs, errors, seen = [], [], set()
    directory = mesh_dir()

    def add(item: MeshInput, key):
        if key not in seen:
            seen.add(key)
            inputs.append(item)

    for spec in specs:
        path = Path(spec).expanduser()
        if path.is_dir():
            errors.append((spec, f"{spec}: is a directory (give mesh files, e.g. "
                                 f"'{spec}/*.ply')"))
            continue
        if not path.is_file() and any(ch in spec for ch in "*?["):
            matches = sorted(glob.glob(os.path.expanduser(spec)))
            if not matches and directory is not None and not os.path.isabs(spec):
                matches = sorted(glob.glob(str(directory / spec)))
            matches = [Path(m) for m in matches if os.path.isfile(m)]
            if not matches:
                errors.append((spec, f"{spec}: no file matches this pattern"))
            for match in matches:
                add(MeshInput(label=match.stem, path=match), match.resolve())
            continue
        try:
            found = resolve_mesh_path(spec)
        except FileNotFoundError as exc:
            if allow_scenes and spec in scene_names():
                add(MeshInput(label=spec, scene=spec), spec)
                continue
            bare_name = os.sep not in spec and not (os.altsep and os.altsep in spec)
            hint = f"; built-in scenes: {', '.join(scene_names())}" \
                if allow_scenes and bare_name else ""
            errors.append((spec, f"{exc}{hint}"))
            continue
        add(MeshInput(label=found.stem, path=found), found.resolve())
    return inputs, errors


def single_input(spec: str) -> MeshInput:
    """The one input a command such as ``verify`` or ``render`` takes."""
    inputs, errors = resolve_mesh_inputs([spec])
    if errors:
        raise CliError(errors[0][1])
    if len(inputs) != 1:
        raise CliError(f"{spec}: matches {len(inputs)} files; give one mesh")
    return inputs[0]


def load_input(item: MeshInput):
    """Vertices and faces of an input, as :func:`kdtree_gpu.mesh.load_mesh` returns them
    (or the built-in scene's); raises ``MeshError`` or ``OSError`` for an input
    that cannot be read or is not a valid triangle mesh."""
    if item.scene is not None:
        return load_scene(item.scene).arrays()
    from ..mesh import load_mesh

    with warnings.catch_warnings():
        # coordinates beyond float32 make NumPy warn as load_mesh converts
        # them, before it raises the MeshError that names the vertex
        warnings.simplefilter("ignore", RuntimeWarning)
        return load_mesh(item.path)


def check_buildable(item: MeshInput, vertices, faces):
    """The box of the triangles a builder keeps (build rule R1, ``prepare_mesh``).

    Raises
    ------
    CliError
        A mesh that no builder can build (say, every triangle degenerate),
        named: a bad input, whichever command was given it.
    """
    from ..mesh import MeshError, prepare_mesh

    try:
        return prepare_mesh(vertices, faces)[-1]
    except MeshError as exc:
        raise CliError(about(item.subject, str(exc))) from None


def load_scene(name: str):
    """A built-in scene by name (:func:`kdtree_gpu.scenes.scene_by_name`)."""
    from ..scenes import scene_by_name

    try:
        return scene_by_name(name)
    except ValueError as exc:
        raise CliError(str(exc)) from None


# --- settings and devices -----------------------------------------------------------------

def config_from_args(args) -> SAHConfig:
    """The :class:`SAHConfig` given by the build-setting options.

    Raises
    ------
    CliError
        A value the config rejects (e.g. ``--empty-bonus 2``), with the option named.
    """
    values = dict(k_traversal=args.k_traversal, k_intersect=args.k_intersect,
                  empty_bonus=args.empty_bonus, leaf_size=args.leaf_size,
                  max_depth=args.max_depth, axes=args.axes, clip=args.clip)
    try:
        return SAHConfig(**values)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        for field in values:
            message = message.replace(f"SAHConfig.{field}", "--" + field.replace("_", "-"))
        raise CliError(message) from exc


def resolve_cli_device(name: str):
    """The :class:`kdtree_gpu.device.Device` that ``--device NAME`` means.

    Raises
    ------
    CliError
        A GPU asked for and none is usable (with the reason), or a CUDA
        device number this machine does not have.
    """
    from .. import device as devices

    try:
        return devices.resolve_device(name)
    except RuntimeError:
        raise CliError(f"--device {name}: no usable CUDA GPU ({devices.unavailable_reason()}); "
                       "use --device cpu or auto") from None
    except ValueError as exc:
        raise CliError(f"--device {name}: {exc}") from None


def describe_device(device) -> str:
    """The GPU's name, or why the work ran on the CPU."""
    from .. import device as devices

    if device.is_cuda:
        return f"GPU: {devices.device_name(device)}"
    if not devices.gpu_available():
        return f"CPU only: {devices.unavailable_reason()}"
    return "CPU"


# --- building and tracing (library calls) -----------------------------------------------------

def build_tree(vertices, faces, config: SAHConfig, device, kernels: Optional[str] = None,
               profile: bool = False, progress=None):
    """:func:`kdtree_gpu.build`; returns ``(tree, build_ms)``.

    ``build_ms`` is ``tree.build_info["seconds"]``: the whole call (checks,
    upload, build), as a user waits for it. ``progress``
    (``progress(fraction)``) reaches the builder when ``kd.build`` takes one.
    The CPU builder's one-time compilation happens first and is not counted
    (:func:`warm_up_cpu_builder` says so).
    """
    from ..builder import build

    if str(device) == "cpu" and kernels in (None, "reference"):
        warm_up_cpu_builder()
    options = {}
    if progress is not None and "progress" in inspect.signature(build).parameters:
        options["progress"] = progress
    tree = build(vertices, faces, config=config, device=device, profile=profile, kernels=kernels,
                 **options)
    return tree, 1e3 * float(tree.build_info["seconds"])


def warm_up_cpu_builder() -> None:
    """Compile (or load) the CPU builder and ray kernels before anything is timed;
    when they compiled, say how long it took and that the times printed after it
    leave that out."""
    import cpu_reference

    from ..trace.api import warm_up_cpu

    done = [cpu_reference.warm_up(), warm_up_cpu()]
    if any(w.compiled for w in done):
        seconds = sum(w.seconds for w in done)
        print(f"kdtree-gpu: compiled in {seconds:.1f} s (not counted in the times below)",
              file=sys.stderr, flush=True)


def summarize_tree(tree) -> dict:
    """The numbers ``build`` and ``info`` print: :meth:`KdTree.stats`."""
    return dict(tree.stats())


def format_summary(label: str, summary: dict, build_ms: Optional[float] = None) -> str:
    """One line of statistics: triangles, nodes, leaves, refs/tri, SAH cost, build ms."""
    parts = [f"{summary['triangles']} tris", f"{summary['nodes']} nodes",
             f"{summary['leaves']} leaves", f"{summary['refs_per_tri']:.2f} refs/tri"]
    if summary.get("sah_cost") is not None:
        parts.append(f"SAH {summary['sah_cost']:.1f}")
    if build_ms is not None:
        parts.append(f"{build_ms:.1f} ms")
    return f"{label}: " + ", ".join(parts)


def cast_rays(tree, rays, device):
    """Closest hits through the tree, on ``device``; returns host ``(t, tri)``."""
    from ..arrays import to_numpy

    with device.use():
        origins, directions = device.xp.asarray(rays.origins), device.xp.asarray(rays.directions)
        t, tri = tree.intersect(origins, directions)[:2]
        return to_numpy(t), to_numpy(tri)


def cast_brute_force(vertices, faces, rays, device):
    """Closest hits over every triangle (:func:`kdtree_gpu.trace.intersect_brute`); host ``(t, tri)``."""
    from ..arrays import to_numpy
    from ..trace import intersect_brute

    with device.use():
        t, tri = intersect_brute(vertices, faces, rays.origins, rays.directions,
                                 device=device.kind)[:2]
        return to_numpy(t), to_numpy(tri)


# --- output paths -------------------------------------------------------------------------------

def check_writable(path: Path, create_parent: bool = False) -> None:
    """Fail before long work when ``path`` cannot be written.

    Parameters
    ----------
    path : Path
    create_parent : bool
        The missing folders above ``path`` will be created (by
        :func:`make_parent` when the file is about to be written): the
        nearest existing one must be a writable folder. Otherwise the
        parent itself must exist.

    Raises
    ------
    CliError
    """
    if path.is_dir():
        raise CliError(f"cannot write {path}: it is a directory")
    parent = path.parent
    if not create_parent and not parent.exists():
        raise CliError(f"cannot write {path}: directory {parent} does not exist")
    existing = parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise CliError(f"cannot write {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK):
        raise CliError(f"cannot write {path}: directory {existing} is not writable")


def make_parent(path: Path) -> None:
    """Create the folders above ``path`` (just before it is written)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create output directory {path.parent}: "
                       f"{exc.strerror or exc}") from exc
