"""The ``kdtree-gpu`` command-line tool (also ``python -m kdtree_gpu``).

Commands
--------
``build``   meshes to tree files, with one line of statistics per mesh
``info``    statistics, settings and file facts of a saved tree
``verify``  builds with the pipeline and the CPU reference, compares, checks,
            casts random rays against brute force; prints PASS or FAIL
``render``  path-traces a mesh or a built-in scene to a PNG
``bench``   a quick benchmark table (build time per builder, rays/s)
``demo``    builds, traces and renders the Cornell box; works without a GPU

User mistakes (a missing file, a bad mesh, an unwritable output, no GPU with
``--device gpu``, a bad option value) end with one line
``kdtree-gpu: error: ...`` on stderr and a non-zero exit status; ``--debug``
shows the traceback instead.

Exit status: 0 success, 1 a failure (a mesh of a batch did not build, verify
says FAIL), 2 a usage or input error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import math
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from .config import AXES_CHOICES, SAHConfig
from .tree.io import json_default

PROG = "kdtree-gpu"
TREE_SUFFIX = ".kdt"
DEFAULT_DEMO_OUTPUT = "kdtree_gpu_demo.png"
MESH_DIR_ENV = "KDTREE_GPU_MESH_DIR"
MESH_SUFFIXES = (".ply", ".obj", ".off", ".stl", ".glb", ".gltf")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A user mistake, reported as one line ``kdtree-gpu: error: <message>``."""


# --------------------------------------------------------------------------------------
# Argument parsing
# --------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line, like every other error."""

    def error(self, message):
        print_error(f"{message} (see '{self.prog} --help')")
        raise SystemExit(EXIT_USAGE)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def parse_size(text: str) -> tuple:
    """Parse an image size ``"WxH"`` or ``"N"`` (square).

    Parameters
    ----------
    text : str

    Returns
    -------
    (int, int)
        Width and height, each in ``[1, 16384]``.

    Raises
    ------
    argparse.ArgumentTypeError
        Anything else.
    """
    parts = text.lower().replace("×", "x").split("x")
    try:
        if len(parts) == 1:
            width = height = int(parts[0])
        elif len(parts) == 2:
            width, height = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WxH or N (e.g. 640x480 or 256), got {text!r}") \
            from None
    if not (1 <= width <= 16384 and 1 <= height <= 16384):
        raise argparse.ArgumentTypeError(f"width and height must be in [1, 16384], got {text!r}")
    return width, height


def _device_choice(text: str) -> str:
    value = text.lower()
    if value not in ("auto", "gpu", "cuda", "cpu"):
        raise argparse.ArgumentTypeError(f"expected auto, gpu or cpu, got {text!r}")
    return "gpu" if value == "cuda" else value


_EXAMPLES = {
    "build": """examples:
  kdtree-gpu build bunny.ply                      # writes bunny.kdt
  kdtree-gpu build bunny.ply -o trees/bunny.kdt --clip
  kdtree-gpu build 'meshes/*.ply' -o trees/       # a batch, with a progress bar
  kdtree-gpu build stanford_bunny teapot -o trees/ --json   # names from $KDTREE_GPU_MESH_DIR
  kdtree-gpu build dragon.ply --device cpu --axes longest --max-depth 20 --force
  kdtree-gpu build stanford_dragon_res2 --device gpu --profile   # per-stage GPU times""",
    "info": """examples:
  kdtree-gpu info bunny.kdt
  kdtree-gpu info bunny.kdt --json
  kdtree-gpu info bunny.kdt --check               # also check the invariants""",
    "verify": """examples:
  kdtree-gpu verify teapot.ply
  kdtree-gpu verify stanford_bunny --rays 1000000 --clip
  kdtree-gpu verify cornell --device cpu --rays 10000""",
    "render": """examples:
  kdtree-gpu render cornell -o cornell.png
  kdtree-gpu render cornell -o cornell.png --size 512 --spp 64 --max-depth 8
  kdtree-gpu render stanford_bunny -o bunny.png --size 640x480 --device gpu""",
    "bench": """examples:
  kdtree-gpu bench                                # built-in scenes
  kdtree-gpu bench stanford_bunny teapot.ply --repeat 5
  kdtree-gpu bench --builders reference,numpy --rays 20000 --json""",
    "demo": """examples:
  kdtree-gpu demo                                 # writes kdtree_gpu_demo.png
  kdtree-gpu demo -o /tmp/demo.png --device cpu""",
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kdtree-gpu`` with its six subcommands."""
    from . import __version__

    parser = _Parser(
        prog=PROG,
        description=textwrap.fill(
            "Full-SAH kd-trees for triangle meshes, built on the GPU (CuPy) or the CPU; "
            "ray casting and a small path tracer on top.", 79),
        epilog=textwrap.fill(
            "run 'kdtree-gpu COMMAND --help' for the options and examples of a command; "
            f"bare mesh names are looked up in ${MESH_DIR_ENV}", 79),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show Python tracebacks instead of one-line errors")

    # options shared by every command; SUPPRESS keeps a top-level --debug
    # from being reset by the subcommand's default
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show Python tracebacks instead of one-line errors")

    device = argparse.ArgumentParser(add_help=False)
    device.add_argument("--device", type=_device_choice, default="auto", metavar="{auto,gpu,cpu}",
                        help="where to build and trace: the GPU, the CPU (NumPy pipeline), or the "
                             "GPU when one is usable (default: auto)")

    sah = argparse.ArgumentParser(add_help=False)
    group = sah.add_argument_group("build settings (kdtree_gpu.SAHConfig)")
    defaults = SAHConfig()
    group.add_argument("--axes", choices=AXES_CHOICES, default=defaults.axes,
                       help="candidate planes on all three axes or only the longest one "
                            f"(default: {defaults.axes})")
    group.add_argument("--clip", action="store_true",
                       help="perfect splits: clip straddling triangles to the child boxes")
    group.add_argument("--k-traversal", type=_finite_float, default=defaults.k_traversal,
                       metavar="K_T", help=f"cost of a traversal step (default: {defaults.k_traversal:g})")
    group.add_argument("--k-intersect", type=_finite_float, default=defaults.k_intersect,
                       metavar="K_I", help=f"cost of a triangle test (default: {defaults.k_intersect:g})")
    group.add_argument("--empty-bonus", type=_finite_float, default=defaults.empty_bonus,
                       metavar="LAMBDA",
                       help=f"cost factor when a child is empty, in (0, 1] (default: {defaults.empty_bonus:g})")
    group.add_argument("--leaf-size", type=_non_negative_int, default=defaults.leaf_size, metavar="N",
                       help=f"nodes with at most N triangles become leaves (default: {defaults.leaf_size})")
    group.add_argument("--max-depth", type=_non_negative_int, default=None, metavar="D",
                       help="maximum depth (default: round(8 + 1.3 log2 N), capped)")

    json_opt = argparse.ArgumentParser(add_help=False)
    json_opt.add_argument("--json", action="store_true",
                          help="machine-readable output: one JSON object per line on stdout")

    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    def add(name, help_text, description, parents):
        return commands.add_parser(
            name, help=help_text, description=textwrap.fill(description, 79),
            epilog=_EXAMPLES[name],
            parents=[common, *parents], formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    p = add("build", "build tree files from meshes",
            "Build a kd-tree for each mesh and save it to a tree file. MESH is a path, a glob "
            f"(quote it), or a bare name looked up in ${MESH_DIR_ENV} (with or without '.ply'). "
            "A mesh that cannot be read or built is reported and skipped; the others still build "
            "and the exit status is 1.",
            [device, sah, json_opt])
    p.add_argument("meshes", nargs="+", metavar="MESH", help="mesh files, globs or names")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="output file (one mesh) or directory (several meshes; created if needed); "
                        f"default: <stem>{TREE_SUFFIX} in the current directory")
    p.add_argument("--force", action="store_true", help="overwrite existing tree files")
    p.add_argument("--progress", action="store_true",
                   help="show the progress bar even when stderr is not a terminal")
    p.add_argument("--profile", action="store_true",
                   help="print the per-stage time table of each build")
    p.set_defaults(handler=run_build)

    p = add("info", "statistics and settings of a saved tree",
            "Print the statistics, build settings, format version and checksum status of a "
            "tree file.", [json_opt])
    p.add_argument("tree", metavar="TREE", help=f"a tree file written by 'build' ({TREE_SUFFIX})")
    p.add_argument("--check", action="store_true",
                   help="also check the tree's invariants (kdtree_gpu.KdTree.check)")
    p.set_defaults(handler=run_info)

    p = add("verify", "check the builder against the CPU reference and brute force",
            "Build MESH with the level-by-level pipeline (on the GPU, or the NumPy pipeline when "
            "no GPU is usable) and with the Wald & Havran CPU reference, compare the two trees, "
            "check the tree's invariants, and cast random rays against brute force. Prints PASS "
            "or FAIL with the reasons; the exit status is 0 for PASS and 1 for FAIL.",
            [device, sah, json_opt])
    p.add_argument("mesh", metavar="MESH", help="a mesh file, a name, or a built-in scene")
    p.add_argument("--rays", type=_positive_int, default=100_000, metavar="N",
                   help="random rays checked against brute force (default: 100000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random rays (default: 0)")
    p.set_defaults(handler=run_verify)

    p = add("render", "path-trace a mesh or a built-in scene to a PNG",
            "Render MESH (a file, a name, or a built-in scene such as 'cornell') with the path "
            "tracer and write a PNG (an existing image is replaced).", [device])
    p.add_argument("mesh", metavar="MESH|SCENE", help="a mesh file, a name, or a built-in scene")
    p.add_argument("-o", "--output", required=True, metavar="PNG", help="the image to write")
    p.add_argument("--size", type=parse_size, default=(256, 256), metavar="WxH|N",
                   help="image size (default: 256x256)")
    p.add_argument("--spp", type=_positive_int, default=16, help="samples per pixel (default: 16)")
    p.add_argument("--max-depth", type=_positive_int, default=5,
                   help="maximum path length in bounces (default: 5)")
    p.set_defaults(handler=run_render)

    p = add("bench", "a quick benchmark table",
            "Time the builders on the built-in scenes and on any meshes given, and the ray "
            "throughput of the resulting trees; prints a table (median of --repeat runs after "
            "one warm-up).", [sah, json_opt])
    p.add_argument("meshes", nargs="*", metavar="MESH", help="extra mesh files, globs or names")
    p.add_argument("--builders", default=None, metavar="LIST",
                   help="comma-separated subset of gpu,numpy,reference "
                        "(default: all that can run here)")
    p.add_argument("--no-scenes", action="store_true", help="skip the built-in scenes")
    p.add_argument("--repeat", type=_positive_int, default=3, help="timed runs per case (default: 3)")
    p.add_argument("--rays", type=_non_negative_int, default=100_000, metavar="N",
                   help="random rays for the throughput column; 0 skips it (default: 100000)")
    p.set_defaults(handler=run_bench)

    p = add("demo", "build, trace and render the Cornell box",
            "Build a tree for the built-in Cornell box, cast random rays (checked against brute "
            "force), render a small image and write it as a PNG. Runs on the CPU when no GPU "
            "is usable.", [device])
    p.add_argument("-o", "--output", default=DEFAULT_DEMO_OUTPUT, metavar="PNG",
                   help=f"the image to write (default: {DEFAULT_DEMO_OUTPUT})")
    p.add_argument("--size", type=parse_size, default=(128, 128), metavar="WxH|N",
                   help="image size (default: 128x128)")
    p.add_argument("--spp", type=_positive_int, default=16, help="samples per pixel (default: 16)")
    p.set_defaults(handler=run_demo)
    return parser


# --------------------------------------------------------------------------------------
# Output helpers
# --------------------------------------------------------------------------------------

def print_error(message: str) -> None:
    """Write ``kdtree-gpu: error: <message>`` as one line on stderr."""
    one_line = " ".join(str(message).split())
    print(f"{PROG}: error: {one_line}", file=sys.stderr, flush=True)


def print_warning(message: str) -> None:
    """Write ``kdtree-gpu: warning: <message>`` as one line on stderr."""
    one_line = " ".join(str(message).split())
    print(f"{PROG}: warning: {one_line}", file=sys.stderr, flush=True)


def print_json(record: dict) -> None:
    """One JSON object on one line of stdout (non-finite floats become ``null``)."""
    print(json.dumps(_finite_or_none(record), default=json_default), flush=True)


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

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    str
        The message of a known user error (a bad mesh, a missing or
        unwritable file, no GPU); for anything else the exception type and
        message with a hint to rerun with ``--debug``.
    """
    from .mesh import MeshError

    if isinstance(exc, (CliError, MeshError)):
        return str(exc)
    if isinstance(exc, OSError):
        what = exc.strerror or str(exc)
        target = exc.filename
        if isinstance(exc, FileNotFoundError) and target is not None:
            return f"no such file or directory: {target}"
        if isinstance(exc, PermissionError) and target is not None:
            return f"permission denied: {target}"
        return f"{what}: {target}" if target is not None else what
    tree_file_error = _optional_attr("kdtree_gpu.tree", "TreeFileError")
    if tree_file_error is not None and isinstance(exc, tree_file_error):
        return str(exc)
    if isinstance(exc, (ValueError, RuntimeError, TypeError)) and str(exc):
        return str(exc)
    return (f"unexpected {type(exc).__name__}: {exc} "
            "(rerun with --debug for the traceback)")


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a mistake in the input rather than a failure of the program."""
    from .mesh import MeshError

    tree_file_error = _optional_attr("kdtree_gpu.tree", "TreeFileError")
    known = (CliError, MeshError, OSError) + ((tree_file_error,) if tree_file_error else ())
    return isinstance(exc, known)


def _optional_attr(module_name: str, attr: str):
    # a name from a sibling module, or None when that module cannot be imported
    try:
        module = __import__(module_name, fromlist=[attr])
    except ImportError:
        return None
    return getattr(module, attr, None)


class ProgressBar:
    """A progress bar on stderr: redrawn in place on a terminal, else one line per step.

    Parameters
    ----------
    total : int
        Number of steps.
    enabled : bool
        When False every method does nothing.
    stream : file
        Where to draw (default: ``sys.stderr``).
    """

    def __init__(self, total: int, enabled: bool, stream=None, width: int = 28):
        self.total = max(int(total), 1)
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.in_place = enabled and _isatty(self.stream)
        self._last_len = 0

    def show(self, done: int, label: str = "") -> None:
        """Draw ``done`` of ``total`` steps, with a label for the current one."""
        if not self.enabled:
            return
        filled = int(self.width * done / self.total)
        text = f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} {label}"
        if not self.in_place:
            # a log file gets whole lines, not carriage returns
            self.stream.write(text + "\n")
            self.stream.flush()
            return
        self.clear()
        self.stream.write(text)
        self.stream.flush()
        self._last_len = len(text)

    def clear(self) -> None:
        """Erase the bar (before other output is written to the terminal)."""
        if self.in_place and self._last_len:
            self.stream.write("\r" + " " * self._last_len + "\r")
            self.stream.flush()
            self._last_len = 0


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


# --------------------------------------------------------------------------------------
# Inputs: meshes, built-in scenes, settings, devices
# --------------------------------------------------------------------------------------

@dataclasses.dataclass
class MeshInput:
    """One thing to build: a mesh file or a built-in scene."""

    label: str
    path: Optional[Path] = None
    scene: Optional[str] = None


def mesh_dir() -> Optional[Path]:
    """The folder where bare mesh names are looked up, or None."""
    finder = _optional_attr("kdtree_gpu.mesh", "mesh_dir")
    if finder is not None:
        found = finder()
        return Path(found) if found else None
    value = os.environ.get(MESH_DIR_ENV)
    return Path(value) if value else None


def scene_factories() -> dict:
    """Built-in scenes by command-line name: ``{name: function returning the scene}``.

    ``cornell`` is :func:`kdtree_gpu.scenes.cornell_box`; any other entries of
    ``kdtree_gpu.scenes.SCENES`` are added under their own names.
    """
    from . import scenes

    table = {}
    if hasattr(scenes, "cornell_box"):
        table["cornell"] = scenes.cornell_box
    for name, entry in dict(getattr(scenes, "SCENES", {}) or {}).items():
        factory = entry if callable(entry) else getattr(scenes, str(name), None)
        if callable(factory) and factory not in table.values():
            table.setdefault(str(name), factory)
    return table


def scene_names() -> list:
    """Names of the built-in scenes accepted where a mesh is expected."""
    return list(scene_factories())


def _has_glob(text: str) -> bool:
    return any(ch in text for ch in "*?[")


def resolve_mesh_inputs(specs, allow_scenes: bool = True):
    """Turn command-line mesh arguments into inputs.

    A spec is, in this order: an existing file; a glob (expanded in the
    current directory, then in the mesh directory); a bare name found in the
    mesh directory (as given or with a mesh suffix); a built-in scene name.

    Parameters
    ----------
    specs : list of str
    allow_scenes : bool
        Whether built-in scene names are accepted.

    Returns
    -------
    inputs : list of MeshInput
        In the order given, globs sorted, duplicates dropped.
    errors : list of str
        One message per spec that matched nothing.
    """
    inputs, errors, seen = [], [], set()
    directory = mesh_dir()

    def add(path: Path):
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            inputs.append(MeshInput(label=path.stem, path=path))

    for spec in specs:
        path = Path(spec).expanduser()
        if path.is_file():
            add(path)
            continue
        if path.is_dir():
            errors.append(f"{spec}: is a directory (give mesh files, e.g. '{spec}/*.ply')")
            continue
        if _has_glob(spec):
            matches = sorted(glob.glob(os.path.expanduser(spec)))
            if not matches and directory is not None and not os.path.isabs(spec):
                matches = sorted(glob.glob(str(directory / spec)))
            matches = [m for m in matches if os.path.isfile(m)]
            if not matches:
                errors.append(f"{spec}: no file matches this pattern")
            for match in matches:
                add(Path(match))
            continue
        candidates = []
        if directory is not None and os.sep not in spec:
            candidates = [directory / spec] + [directory / (spec + s) for s in MESH_SUFFIXES]
        found = next((c for c in candidates if c.is_file()), None)
        if found is not None:
            add(found)
            continue
        if allow_scenes and spec in _scene_names_or_empty():
            if spec not in seen:
                seen.add(spec)
                inputs.append(MeshInput(label=spec, scene=spec))
            continue
        if os.sep in spec or (os.altsep and os.altsep in spec):
            where = ""
        elif directory is not None:
            where = f" (nor in {MESH_DIR_ENV}={directory})"
        else:
            where = f" (set {MESH_DIR_ENV} to look up bare names)"
        errors.append(f"{spec}: no such mesh file{where}")
    return inputs, errors


def _scene_names_or_empty() -> list:
    try:
        return scene_names()
    except ImportError:
        return []


def load_input(item: MeshInput):
    """Vertices and faces of an input.

    Returns
    -------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32

    Raises
    ------
    MeshError, OSError
        The file cannot be read or is not a valid triangle mesh.
    """
    if item.scene is not None:
        scene = load_scene(item.scene)
        return scene_arrays(scene)
    from .mesh import load_mesh

    return load_mesh(item.path)


def load_scene(name: str):
    """A built-in scene by name (see :func:`scene_factories`)."""
    try:
        factory = scene_factories()[name]
    except (ImportError, KeyError):
        raise CliError(f"no built-in scene {name!r}") from None
    return factory()


def scene_arrays(scene):
    """Vertices and faces of a built-in scene (an object with both, or a pair)."""
    if hasattr(scene, "vertices") and hasattr(scene, "faces"):
        return scene.vertices, scene.faces
    if isinstance(scene, dict):
        return scene["vertices"], scene["faces"]
    vertices, faces = scene[:2]
    return vertices, faces


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
            if f"SAHConfig.{field}" in message:
                option = "--" + field.replace("_", "-")
                message = message.replace(f"SAHConfig.{field}", option)
        raise CliError(message) from exc


def resolve_cli_device(choice: str) -> str:
    """Map ``auto|gpu|cpu`` to ``"cuda"`` or ``"cpu"``.

    Raises
    ------
    CliError
        ``gpu`` asked for and no GPU is usable (with the reason).
    """
    from . import device as devices

    if choice == "cpu":
        return "cpu"
    if choice == "gpu":
        if not devices.gpu_available():
            raise CliError(f"--device gpu: no usable CUDA GPU ({devices.unavailable_reason()}); "
                           "use --device cpu or auto")
        return "cuda"
    return "cuda" if devices.gpu_available() else "cpu"


def pipeline_name(device: str) -> str:
    """How the level-by-level builder is called on a device, for output."""
    return "GPU pipeline" if device == "cuda" else "NumPy pipeline"


def build_tree(vertices, faces, config: SAHConfig, device: str, profile: bool = False,
               cpu_fallback: bool = False):
    """Build with the level-by-level builder; returns ``(tree, build_ms)``.

    ``build_ms`` is the wall time of the whole call (validation, upload,
    build, download), as a user sees it. With ``cpu_fallback`` (the user
    said ``--device auto``), settings the GPU builder does not implement are
    built on the CPU after a warning.
    """
    import kdtree_gpu

    options = {"profile": True} if profile else {}
    start = time.perf_counter()
    try:
        tree = kdtree_gpu.build(vertices, faces, config=config, device=device, **options)
    except NotImplementedError as exc:
        if not (cpu_fallback and device == "cuda"):
            raise
        print_warning(f"building on the CPU: {exc}")
        start = time.perf_counter()
        tree = kdtree_gpu.build(vertices, faces, config=config, device="cpu", **options)
    return tree, (time.perf_counter() - start) * 1e3


def build_reference(vertices, faces, config: SAHConfig):
    """Build with the Wald & Havran CPU reference; returns ``(tree, build_ms)``."""
    import cpu_reference

    start = time.perf_counter()
    tree = cpu_reference.build(vertices, faces, config=config)
    return tree, (time.perf_counter() - start) * 1e3


def summarize_tree(tree) -> dict:
    """The numbers printed by ``build`` and ``info``: ``tree.stats()``.

    Returns
    -------
    dict
        At least ``triangles, degenerate, nodes, leaves, refs_per_tri,
        sah_cost`` (see :func:`kdtree_gpu.tree.check.tree_stats`).
    """
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


def make_random_rays(bounds, num_rays: int, seed: int = 0):
    """Random rays that mostly hit the box ``bounds``.

    Half the rays start inside the box with uniform directions (they test the
    traversal from inner nodes); the other half start on a sphere around the
    box and aim at a random point inside it.

    Parameters
    ----------
    bounds : (2, 3) float32
    num_rays : int
    seed : int

    Returns
    -------
    origins, directions : (num_rays, 3) float32
        Directions have unit length.
    """
    rng = np.random.default_rng(seed)
    lo = np.asarray(bounds[0], dtype=np.float64)
    hi = np.asarray(bounds[1], dtype=np.float64)
    center, extent = (lo + hi) / 2, np.maximum(hi - lo, 1e-6)
    radius = float(np.linalg.norm(extent))
    num_inside = num_rays // 2
    num_outside = num_rays - num_inside

    def unit_vectors(n):
        v = rng.normal(size=(n, 3))
        return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)

    inside_origins = lo + rng.random((num_inside, 3)) * extent
    inside_dirs = unit_vectors(num_inside)
    outside_origins = center + radius * unit_vectors(num_outside)
    targets = lo + rng.random((num_outside, 3)) * extent
    outside_dirs = targets - outside_origins
    outside_dirs /= np.maximum(np.linalg.norm(outside_dirs, axis=1, keepdims=True), 1e-12)
    origins = np.concatenate([inside_origins, outside_origins]).astype(np.float32)
    directions = np.concatenate([inside_dirs, outside_dirs]).astype(np.float32)
    return origins, directions


def compare_hits(t_tree, tri_tree, t_brute, tri_brute, scale: float) -> Optional[str]:
    """Describe disagreements between traversal and brute-force hits, or None.

    Hit or miss must agree, and the distances must agree to a relative
    ``1e-5`` (plus ``1e-6 * scale``); triangle ids may differ only where the
    distances are equal (a ray through a shared edge).

    Parameters
    ----------
    t_tree, t_brute : (num_rays,) float32
        ``inf`` on a miss.
    tri_tree, tri_brute : (num_rays,) int32
    scale : float
        Size of the scene (box diagonal).
    """
    t_tree, t_brute = np.asarray(t_tree, np.float64), np.asarray(t_brute, np.float64)
    tri_tree, tri_brute = np.asarray(tri_tree), np.asarray(tri_brute)
    hit_tree, hit_brute = np.isfinite(t_tree), np.isfinite(t_brute)
    hit_differs = hit_tree != hit_brute
    both = hit_tree & hit_brute
    t_differs = np.zeros_like(both)
    t_differs[both] = ~np.isclose(t_tree[both], t_brute[both], rtol=1e-5, atol=1e-6 * scale)
    tri_differs = both & ~t_differs & (tri_tree != tri_brute) & (t_tree != t_brute)
    bad = hit_differs | t_differs | tri_differs
    if not bad.any():
        return None
    first = int(np.argmax(bad))
    return (f"{int(bad.sum())} of {bad.size} rays disagree with brute force "
            f"({int(hit_differs.sum())} hit/miss, {int(t_differs.sum())} distance, "
            f"{int(tri_differs.sum())} triangle); first: ray {first}, tree t={float(t_tree[first])!r} "
            f"tri={int(tri_tree[first])}, brute force t={float(t_brute[first])!r} "
            f"tri={int(tri_brute[first])}")


def cast_brute_force(vertices, faces, origins, directions, device: str):
    """Closest hits by testing every triangle (``kdtree_gpu.trace``).

    Returns
    -------
    t : (num_rays,) float32
    tri : (num_rays,) int32
    """
    from . import trace as raycast

    result = raycast.intersect_brute(vertices, faces, origins, directions, device=device)
    return _to_host(result[0]), _to_host(result[1])


def _to_host(a):
    from .arrays import to_numpy as to_host

    return to_host(a)


def _check_output_dir(path: Path) -> None:
    # fail before long work when the output cannot be written at all
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        raise CliError(f"cannot write {path}: directory {parent} does not exist")
    if not parent.is_dir():
        raise CliError(f"cannot write {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK):
        raise CliError(f"cannot write {path}: directory {parent} is not writable")
    if path.is_dir():
        raise CliError(f"cannot write {path}: it is a directory")


# --------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------

def plan_outputs(inputs, output: Optional[str]):
    """Output path of every input of ``build``.

    One input and an ``OUT`` that is not an existing directory (and does not
    end with a separator): ``OUT`` is the file. Otherwise ``OUT`` (default: the
    current directory) is a directory, created if needed, holding
    ``<stem>.kdt`` per mesh.

    Returns
    -------
    list of Path
    """
    if output is not None and len(inputs) == 1 and not output.endswith(("/", os.sep)) \
            and not Path(output).is_dir():
        return [Path(output).expanduser()]
    directory = Path(output).expanduser() if output is not None else Path(".")
    if directory.exists() and not directory.is_dir():
        raise CliError(f"-o {output}: several meshes need an output directory, "
                       "but this is a file")
    if not directory.exists():
        try:
            directory.mkdir(parents=True)
        except OSError as exc:
            raise CliError(f"cannot create output directory {directory}: "
                           f"{exc.strerror or exc}") from exc
    return [directory / (item.label + TREE_SUFFIX) for item in inputs]


def run_build(args) -> int:
    """``kdtree-gpu build``: meshes to tree files."""
    config = config_from_args(args)
    device = resolve_cli_device(args.device)
    inputs, errors = resolve_mesh_inputs(args.meshes)
    if not inputs and len(errors) == 1:
        raise CliError(errors[0])
    for message in errors:
        print_error(message)
        if args.json:
            print_json({"mesh": message.split(":")[0], "ok": False, "error": message})
    if not inputs:
        raise CliError(f"none of the {len(errors)} arguments names a mesh file")
    outputs = plan_outputs(inputs, args.output)
    progress = ProgressBar(len(inputs), enabled=args.progress or _isatty(sys.stderr))
    num_failed = len(errors)
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
            _check_output_dir(out)
            vertices, faces = load_input(item)
            tree, build_ms = build_tree(vertices, faces, config, device, profile=args.profile,
                                        cpu_fallback=args.device == "auto")
            tree.save(out)
            summary = summarize_tree(tree)
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            if args.debug:
                raise
            num_failed += 1
            progress.clear()
            message = f"{item.path or item.label}: {describe_error(exc)}"
            print_error(message)
            if args.json:
                print_json({"mesh": str(item.path or item.label), "ok": False, "error": message})
            continue
        progress.clear()
        if args.json:
            record = {"mesh": str(item.path or item.label), "ok": True, "output": str(out),
                      "device": tree.build_info.get("device", device), "build_ms": build_ms, "config": config.to_dict()}
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
    if num_failed:
        total = len(inputs) + len(errors)
        if total > 1:
            print_error(f"{num_failed} of {total} meshes failed")
        return EXIT_FAILURE
    return EXIT_OK


def run_info(args) -> int:
    """``kdtree-gpu info``: what a tree file holds.

    A file whose checksum does not match still has its header shown (settings,
    build facts, array shapes), with the mismatch, and the exit status is 1.
    """
    from . import tree as tree_io

    path = Path(args.tree)
    if not path.exists():
        raise CliError(f"no such file: {path}")
    if path.is_dir():
        raise CliError(f"{path} is a directory, not a tree file")
    # a header that reads means the version is one this package reads
    header = tree_io.read_header(path)
    record = {"path": str(path), "bytes": path.stat().st_size,
              "format_version": header.get("format_version", tree_io.io.FORMAT_VERSION)}
    try:
        tree = tree_io.load_tree(path)
    except tree_io.TreeFileError as exc:
        if "checksum" not in str(exc):
            raise
        record.update({"checksum": "mismatch", "error": str(exc),
                       "config": header.get("config"), "build_info": header.get("build_info"),
                       "arrays": {a.get("name"): a.get("shape") for a in header["arrays"]}})
        if args.json:
            print_json(record)
        else:
            _print_info(record, summary=None)
        print_error(str(exc))
        return EXIT_FAILURE
    record.update({"checksum": "ok", "config": tree.config.to_dict(),
                   "build_info": tree.build_info})
    summary = summarize_tree(tree)
    if args.check:
        tree.check()  # raises ValueError naming the broken invariant
        record["invariants"] = "ok"
    if args.json:
        print_json({**record, **summary})
    else:
        _print_info(record, summary)
    return EXIT_OK


def _print_info(record: dict, summary: Optional[dict]) -> None:
    print(f"file:           {record['path']} ({record['bytes']} bytes)")
    print(f"format version: {record['format_version']}")
    print(f"checksum:       {record['checksum']}")
    if "invariants" in record:
        print(f"invariants:     {record['invariants']}")
    if summary is not None:
        print(format_summary("tree", summary))
        for key, value in summary.items():
            if key not in ("triangles", "nodes", "leaves", "refs_per_tri", "sah_cost"):
                print(f"  {key}: {_format_value(value)}")
    else:
        print("arrays (from the header):")
        for name, shape in record["arrays"].items():
            print(f"  {name}: {shape}")
    print("settings:")
    for key, value in (record["config"] or {}).items():
        print(f"  {key}: {value}")
    if record["build_info"]:
        print("build:")
        for key, value in record["build_info"].items():
            if key not in ("profile", "profile_table"):
                print(f"  {key}: {_format_value(value)}")


def _format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)) and len(value) > 6:
        # per-level lists of deep trees: the ends tell the story
        head = ", ".join(str(v) for v in value[:3])
        tail = ", ".join(str(v) for v in value[-2:])
        return f"[{head}, ..., {tail}] ({len(value)} entries)"
    return str(value)


def run_verify(args) -> int:
    """``kdtree-gpu verify``: pipeline vs reference vs brute force; PASS or FAIL."""
    config = config_from_args(args)
    device = resolve_cli_device(args.device)
    item = _single_input(args.mesh)
    vertices, faces = load_input(item)
    from .mesh import validate_mesh

    vertices, faces = validate_mesh(vertices, faces)
    reasons, facts = [], {"mesh": str(item.path or item.label), "device": device,
                          "builder": pipeline_name(device), "rays": args.rays}

    def step(name: str, fn: Callable):
        # a crash in one step is a FAIL reason, not an abort: the other steps still run
        try:
            return fn()
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            if args.debug:
                raise
            reasons.append(f"{name} raised {type(exc).__name__}: {describe_error(exc)}")
            return None

    built = step(pipeline_name(device), lambda: build_tree(
        vertices, faces, config, device, cpu_fallback=args.device == "auto"))
    reference = step("CPU reference", lambda: build_reference(vertices, faces, config))
    lines = []
    if built is not None:
        tree, ms = built
        facts["build_ms"] = ms
        lines.append(format_summary(pipeline_name(device), summarize_tree(tree), ms))
    if reference is not None:
        ref_tree, ref_ms = reference
        facts["reference_ms"] = ref_ms
        lines.append(format_summary("CPU reference", summarize_tree(ref_tree), ref_ms))
    if built is not None and reference is not None:
        difference = step("compare", lambda: tree.compare(ref_tree))
        if difference is not None:
            reasons.append(f"trees differ: {difference}")
        else:
            lines.append("trees: identical")
    if built is not None:
        if step("check", lambda: tree.check() or "ok") == "ok":
            lines.append("invariants: ok")
        origins, directions = make_random_rays(tree.bounds, args.rays, args.seed)
        scale = float(np.linalg.norm(tree.bounds[1].astype(np.float64) - tree.bounds[0]))

        def cast():
            start = time.perf_counter()
            t, tri = tree.intersect(origins, directions, device=device)[:2]
            t, tri = _to_host(t), _to_host(tri)
            facts["rays_per_s"] = args.rays / max(time.perf_counter() - start, 1e-9)
            t_ref, tri_ref = cast_brute_force(vertices, faces, origins, directions, device)
            return t, tri, t_ref, tri_ref

        hits = step("ray casting", cast)
        if hits is not None:
            problem = compare_hits(*hits, scale=scale)
            if problem is not None:
                reasons.append(problem)
            else:
                lines.append(f"rays: {args.rays} agree with brute force "
                             f"({int(np.isfinite(hits[0]).sum())} hits, "
                             f"{facts['rays_per_s']:.3g} rays/s)")
    verdict = "PASS" if not reasons else "FAIL"
    if args.json:
        print_json({**facts, "verdict": verdict, "reasons": reasons})
    else:
        print(f"verify {facts['mesh']} ({pipeline_name(device)} vs CPU reference, "
              f"{args.rays} rays)")
        for line in lines:
            print(f"  {line}")
        print(verdict + ("" if not reasons else ":"))
        for reason in reasons:
            print(f"  - {reason}")
    return EXIT_OK if not reasons else EXIT_FAILURE


def _single_input(spec: str) -> MeshInput:
    inputs, errors = resolve_mesh_inputs([spec])
    if errors:
        raise CliError(errors[0])
    if len(inputs) != 1:
        raise CliError(f"{spec}: matches {len(inputs)} files; give one mesh")
    return inputs[0]


def run_render(args) -> int:
    """``kdtree-gpu render``: a mesh or scene to a PNG."""
    device = resolve_cli_device(args.device)
    out = Path(args.output).expanduser()
    _check_output_dir(out)
    item = _single_input(args.mesh)
    if item.scene is None:
        target = load_input(item)
    else:
        target = load_scene(item.scene)
        if getattr(target, "tri_material", None) is None:
            # a geometry-only scene renders like a mesh: grey, lit from above
            target = scene_arrays(target)
    width, height = args.size
    start = time.perf_counter()
    image = render_image(target, width, height, args.spp, args.max_depth, device)
    seconds = time.perf_counter() - start
    save_image(image, out)
    print(f"rendered {item.label} at {width}x{height}, {args.spp} spp, max depth "
          f"{args.max_depth} on {device} in {seconds:.2f} s -> {out}")
    return EXIT_OK


def render_image(target, width, height, spp, max_depth, device, tree=None):
    """Path-trace ``target`` (a scene or ``(vertices, faces)``); returns the image.

    ``tree``, when given, is a tree over exactly the scene's triangles and
    saves the renderer a build.
    """
    from .render import render

    result = render(target, width, height, spp=spp, max_depth=max_depth, device=device,
                    tree=tree)
    return result.image


def save_image(image, path: Path) -> None:
    """Write an image as a PNG (``kdtree_gpu.render.save_png``)."""
    from .render import save_png

    save_png(image, path)


def run_bench(args) -> int:
    """``kdtree-gpu bench``: build times and ray throughput in a table."""
    config = config_from_args(args)
    from .device import gpu_available

    available = {"gpu": gpu_available(), "numpy": True, "reference": True}
    if args.builders is None:
        builders = [name for name, ok in available.items() if ok]
    else:
        builders = [b.strip() for b in args.builders.split(",") if b.strip()]
        unknown = [b for b in builders if b not in available]
        if unknown or not builders:
            raise CliError(f"--builders: unknown builder(s) {unknown or args.builders!r}; "
                           "choose from gpu, numpy, reference")
        if "gpu" in builders and not available["gpu"]:
            raise CliError("--builders gpu: no usable CUDA GPU; leave out 'gpu'")
    inputs = [] if args.no_scenes else [MeshInput(label=n, scene=n) for n in bench_scene_names()]
    found, errors = resolve_mesh_inputs(args.meshes) if args.meshes else ([], [])
    if errors:
        raise CliError(errors[0])
    inputs += found
    if not inputs:
        raise CliError("nothing to benchmark (--no-scenes and no meshes given)")
    rows = []
    for item in inputs:
        vertices, faces = load_input(item)
        for builder in builders:
            rows.append(bench_case(item.label, vertices, faces, builder, config,
                                   args.repeat, args.rays))
            if args.json:
                print_json(rows[-1])
    if not args.json:
        print(format_table(rows))
        print(f"(median of {args.repeat} builds after a warm-up; {args.rays} random rays; "
              f"{describe_device()})")
    return EXIT_OK


def describe_device() -> str:
    """The GPU's name, or why there is none."""
    from . import device as devices

    if not devices.gpu_available():
        return f"CPU only: {devices.unavailable_reason()}"
    return f"GPU: {devices.device_name()}"


def bench_scene_names() -> list:
    """Built-in scenes that ``bench`` times by default."""
    return scene_names()


def bench_case(label, vertices, faces, builder, config, repeat, num_rays) -> dict:
    """Time one builder on one mesh (median of ``repeat`` after a warm-up)."""
    device = "cuda" if builder == "gpu" else "cpu"

    def run_once():
        if builder == "reference":
            return build_reference(vertices, faces, config)
        return build_tree(vertices, faces, config, device)

    tree, _ = run_once()  # warm-up: kernel compilation, numba JIT, memory pools
    times = [run_once()[1] for _ in range(repeat)]
    row = {"mesh": label, "triangles": int(np.asarray(faces).shape[0]), "builder": builder,
           "build_ms": float(np.median(times)), "nodes": tree.num_nodes,
           "sah_cost": summarize_tree(tree).get("sah_cost"), "rays_per_s": None}
    if num_rays:
        origins, directions = make_random_rays(tree.bounds, num_rays, seed=1)
        tree.intersect(origins[:64], directions[:64], device=device)  # warm-up
        start = time.perf_counter()
        result = tree.intersect(origins, directions, device=device)
        _to_host(result[0])
        row["rays_per_s"] = num_rays / max(time.perf_counter() - start, 1e-9)
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


def run_demo(args) -> int:
    """``kdtree-gpu demo``: the Cornell box built, traced and rendered."""
    device = resolve_cli_device(args.device)
    out = Path(args.output).expanduser()
    _check_output_dir(out)
    name = "cornell"
    scene = load_scene(name)
    vertices, faces = scene_arrays(scene)
    print(f"demo on {device} ({pipeline_name(device)}): built-in scene '{name}', "
          f"{np.asarray(faces).shape[0]} triangles")
    tree, build_ms = build_tree(vertices, faces, SAHConfig(), device)
    print("  built:    " + format_summary("tree", summarize_tree(tree), build_ms))
    num_rays = 20_000
    origins, directions = make_random_rays(tree.bounds, num_rays, seed=0)
    tree.intersect(origins[:64], directions[:64], device=device)  # warm-up: JIT, upload
    start = time.perf_counter()
    t, tri = tree.intersect(origins, directions, device=device)[:2]
    t, tri = _to_host(t), _to_host(tri)
    seconds = time.perf_counter() - start
    t_ref, tri_ref = cast_brute_force(tree.vertices, tree.faces, origins, directions, device)
    scale = float(np.linalg.norm(tree.bounds[1].astype(np.float64) - tree.bounds[0]))
    problem = compare_hits(t, tri, t_ref, tri_ref, scale)
    print(f"  cast:     {num_rays} random rays, {int(np.isfinite(t).sum())} hits, "
          f"{num_rays / max(seconds, 1e-9):.3g} rays/s; "
          + ("all agree with brute force" if problem is None else f"MISMATCH: {problem}"))
    width, height = args.size
    start = time.perf_counter()
    image = render_image(scene, width, height, args.spp, 5, device, tree=tree)
    seconds = time.perf_counter() - start
    save_image(image, out)
    print(f"  rendered: {width}x{height}, {args.spp} spp in {seconds:.2f} s -> {out}")
    return EXIT_OK if problem is None else EXIT_FAILURE


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------

def main(argv=None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status (0 success, 1 failure, 2 usage or input error).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    debug = getattr(args, "debug", False)
    args.debug = debug
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print_error("interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:
        if debug:
            raise
        print_error(describe_error(exc))
        return EXIT_USAGE if is_user_error(exc) else EXIT_FAILURE
