"""The argument parser: the top level and the option groups commands share.

Each command module declares its own options, help text and examples in an
``add_parser(commands, shared)`` function next to its ``run``; this module
puts them together (:func:`build_parser`). The option types are in
:mod:`.options`, which the command modules import (they are imported here).
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap

from ..config import AXES_CHOICES, SAHConfig
from ..mesh import MESH_DIR_ENV
from .common import EXIT_USAGE, PROG, print_error
from .options import device_choice, finite_float, non_negative_int

DEVICE_METAVAR = "{auto,cpu,gpu,cuda,cuda:N}"


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line, like every other error."""

    def error(self, message):
        print_error(f"{message} (see '{self.prog} --help')")
        raise SystemExit(EXIT_USAGE)


# --- the parser ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SharedOptions:
    """Option groups that several commands take, as argparse parent parsers.

    Attributes
    ----------
    common : argparse.ArgumentParser
        ``--debug`` (every command).
    device : argparse.ArgumentParser
        ``--device``.
    sah : argparse.ArgumentParser
        The build settings (``kdtree_gpu.SAHConfig``).
    json : argparse.ArgumentParser
        ``--json``.
    """

    common: argparse.ArgumentParser
    device: argparse.ArgumentParser
    sah: argparse.ArgumentParser
    json: argparse.ArgumentParser

    def add(self, commands, name: str, help_text: str, description: str, examples: str,
            parents=()):
        """The parser of command ``name``: help, wrapped description, examples as epilog."""
        return commands.add_parser(
            name, help=help_text, description=textwrap.fill(description, 79),
            epilog=examples, parents=[self.common, *parents],
            formatter_class=argparse.RawDescriptionHelpFormatter)


def shared_options() -> SharedOptions:
    """The option groups of :class:`SharedOptions`."""
    # SUPPRESS keeps a top-level --debug from being reset by the command's default
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show Python tracebacks instead of one-line errors")

    device = argparse.ArgumentParser(add_help=False)
    device.add_argument("--device", type=device_choice, default="auto", metavar=DEVICE_METAVAR,
                        help="where to work: a GPU (gpu and cuda mean the current one, cuda:N "
                             "GPU N), the CPU, or the GPU when one is usable (default: auto)")

    sah = argparse.ArgumentParser(add_help=False)
    group = sah.add_argument_group("build settings (kdtree_gpu.SAHConfig)")
    defaults = SAHConfig()
    group.add_argument("--axes", choices=AXES_CHOICES, default=defaults.axes,
                       help="candidate planes on all three axes or only the longest one "
                            f"(default: {defaults.axes})")
    group.add_argument("--clip", action="store_true",
                       help="perfect splits: clip straddling triangles to the child boxes")
    group.add_argument("--k-traversal", type=finite_float, default=defaults.k_traversal,
                       metavar="K_T",
                       help=f"cost of a traversal step (default: {defaults.k_traversal:g})")
    group.add_argument("--k-intersect", type=finite_float, default=defaults.k_intersect,
                       metavar="K_I",
                       help=f"cost of a triangle test (default: {defaults.k_intersect:g})")
    group.add_argument("--empty-bonus", type=finite_float, default=defaults.empty_bonus,
                       metavar="LAMBDA", help="cost factor when a child is empty, in (0, 1] "
                                              f"(default: {defaults.empty_bonus:g})")
    group.add_argument("--leaf-size", type=non_negative_int, default=defaults.leaf_size,
                       metavar="N", help="nodes with at most N triangles become leaves "
                                         f"(default: {defaults.leaf_size})")
    group.add_argument("--max-depth", type=non_negative_int, default=None, metavar="D",
                       help="maximum depth (default: round(8 + 1.3 log2 N), capped)")

    json_option = argparse.ArgumentParser(add_help=False)
    json_option.add_argument("--json", action="store_true",
                             help="machine-readable output: one JSON object per line on stdout")
    return SharedOptions(common=common, device=device, sah=sah, json=json_option)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kdtree-gpu``: every command module's ``add_parser``."""
    from .. import __version__
    from . import bench, build, demo, info, render, verify

    parser = _Parser(
        prog=PROG,
        description=textwrap.fill(
            "Full-SAH kd-trees for triangle meshes, built on the GPU (CuPy) or the CPU; "
            "ray casting and a small path tracer on top.", 79),
        epilog=textwrap.fill(
            "run 'kdtree-gpu COMMAND --help' for the options and examples of a command; "
            f"bare mesh names are looked up in ${MESH_DIR_ENV}; exit status: 0 success, "
            "1 the work failed, 2 a usage or input error, 130 interrupted", 79),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show Python tracebacks instead of one-line errors")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    shared = shared_options()
    for command in (build, info, verify, render, bench, demo):
        command.add_parser(commands, shared)
    return parser
