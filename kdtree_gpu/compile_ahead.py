"""A first build's GPU modules compiled side by side, one child process each.

NVRTC compiles one module at a time within a process (threads, one a module,
overlapped little: benchmarks/results/cold_compile_h200.md), and a build asks
for its modules one after another as it reaches them. So a build first lists
the modules it will run (:func:`kdtree_gpu.builder.gpu.build_modules`, each
module's spec declared beside the code that launches it) and
:func:`compile_modules` compiles, in child processes, those this machine has
no stamp of (:mod:`kdtree_gpu.kernels`, "First use on a machine"). Each child
leaves the binary in CuPy's kernel cache and stamps it; the build then loads
the modules from there. A first build waits about as long as its longest
module instead of the sum (NVIDIA H200, 16 cores: the bunny 8.2-8.6 -> 5.1-5.3
s, 5.5M triangles 13.3 -> 5.8-5.9 s; benchmarks/results/cold_start_h200.md).
``KDTREE_GPU_COMPILE_PROCESSES=0`` turns it off: each module then compiles in
the build's process, as it is first asked for.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

from . import kernels

# a child compiling ahead that takes longer than this is given up (the build
# then compiles that module itself)
COMPILE_CHILD_TIMEOUT = 900.0

_seen: set = set()  # (device, ModuleSpec, stamp folder) that compile_modules looked at
# file -> the error of compile_modules' last children that failed (their modules
# then compile in the process, which raises the compiler's own error)
ahead_failures: dict = {}


class ModuleSpec(NamedTuple):
    """A module as :func:`kdtree_gpu.kernels.get_module` compiles it (its arguments)."""

    filename: str
    options: tuple = ()
    name_expressions: Optional[tuple] = None
    cooperative: bool = False


def compile_modules(specs: Sequence[ModuleSpec], workers: Optional[int] = None) -> list:
    """Compile side by side the modules of ``specs`` this machine has not compiled.

    A process's first build calls it with the modules it will run. Each
    module without a stamp is compiled in a child process of its own
    (:func:`main`, on the current device, importing this package), which
    leaves the binary in CuPy's kernel cache;
    :func:`kdtree_gpu.kernels.get_function` then loads it from there. A child
    that fails or outlasts :data:`COMPILE_CHILD_TIMEOUT` changes nothing: the
    build compiles that module itself when it first asks for it, and raises
    the compiler's error there. Each (device, module, stamp folder) is looked
    at once per process.

    Parameters
    ----------
    specs : sequence of ModuleSpec
    workers : int, optional
        Children at once (default: the machine's CPUs). Nothing runs ahead
        with fewer than two modules to compile or fewer than two workers, or
        where ``KDTREE_GPU_COMPILE_PROCESSES`` is ``0``.

    Returns
    -------
    list of str
        The files compiled ahead (empty when nothing ran); the children that
        failed are in :data:`ahead_failures`.
    """
    if os.environ.get("KDTREE_GPU_COMPILE_PROCESSES", "1").strip() == "0":
        return []
    from .device import require_gpu

    require_gpu("compiling GPU modules")
    import cupy

    device_id = cupy.cuda.runtime.getDevice()
    stamps = kernels.cache_dir()
    todo = []
    for spec in dict.fromkeys(ModuleSpec(*spec) for spec in specs):
        if (device_id, spec, stamps) in _seen:
            continue
        _seen.add((device_id, spec, stamps))
        if not kernels.module_stamp(*spec).exists():
            todo.append(spec)
    workers = (os.cpu_count() or 1) if workers is None else int(workers)
    if len(todo) < 2 or workers < 2:
        return []
    kernels.announce_compile(cupy.cuda.Device().compute_capability)
    # The children import this very package, and CuPy, from where this process
    # did: its folder first, then this process's path without the working
    # directory (with ``python -m`` the working directory came first, and a
    # checkout there compiled its own sources, whose include path gave CuPy's
    # cache other keys).
    path = [str(Path(__file__).resolve().parent.parent)] + [p for p in sys.path if p]
    child = ("import json, sys; sys.path[:0] = json.loads(sys.argv.pop(1)); "
             "from kdtree_gpu.compile_ahead import main; sys.exit(main(sys.argv[1:]))")

    def run(spec):
        command = [sys.executable, "-c", child, json.dumps(path), "--device", str(device_id),
                   "--compile-module", json.dumps(spec._asdict())]
        try:
            done = subprocess.run(command, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True,
                                  timeout=COMPILE_CHILD_TIMEOUT)
        except (OSError, subprocess.SubprocessError) as exc:  # (the build compiles it itself)
            return spec, str(exc)
        return spec, None if done.returncode == 0 else done.stderr.strip()[-2000:]

    with ThreadPoolExecutor(max_workers=min(workers, len(todo))) as pool:
        results = list(pool.map(run, todo))
    ahead_failures.clear()
    ahead_failures.update((spec.filename, error) for spec, error in results if error)
    return [spec.filename for spec, error in results if not error]


def main(argv=None) -> int:
    """A child of :func:`compile_modules`: compile one module into CuPy's cache and
    stamp it (``--device N --compile-module SPEC``, SPEC a ModuleSpec as JSON)."""
    parser = argparse.ArgumentParser(prog="kdtree_gpu.compile_ahead")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--compile-module", metavar="SPEC", required=True)
    args = parser.parse_args(argv)
    import cupy

    fields = json.loads(args.compile_module)
    spec = ModuleSpec(fields["filename"], tuple(fields.get("options") or ()),
                      None if fields.get("name_expressions") is None
                      else tuple(fields["name_expressions"]),
                      bool(fields.get("cooperative")))
    with cupy.cuda.Device(args.device):
        module = kernels.get_module(*spec)
        # (its message goes to the parent's pipe, kept only where the child fails)
        kernels.compile_announced(kernels.module_stamp(*spec), module.compile,
                                  arch=cupy.cuda.Device().compute_capability)
    return 0
