"""The module factory: every CUDA source of the package is compiled here.

CUDA code lives in real files under ``kdtree_gpu/cuda/``: ``.cu`` files with
kernels, grouped by stage family, and ``.cuh`` headers they ``#include``
(device functions shared by several ``.cu`` files, e.g. the SAH cost). A
module is built from one ``.cu`` file as::

    <kdtree_gpu.encoding.cuda_defines()>      the KD_* #define block
    // kd-headers <hash of the .cuh files>    so caches see header edits
    #line 1 "<filename>"                      errors point into the file
    <the file>

and compiled with NVRTC (``--std=c++17 -lineinfo -I kdtree_gpu/cuda``; the
architecture is the current device's, chosen by CuPy). Modules are memoized
per (device id, filename, options, name expressions, source hash).

Conventions for the sources
---------------------------
* Kernel names start with ``kd_`` (``kd_segmented_argmin``), so that they are
  recognizable in Nsight and in the launch profile. Plain kernels are
  ``extern "C" __global__``; templates are reached through
  ``name_expressions``.
* Sources use only built-in types (``int``, ``long long``, ``unsigned int``,
  ``float``, ``double``) and no standard headers (CUDA's own
  ``<cooperative_groups.h>`` is the one exception): the same file must
  compile under NVRTC at run time and under ``nvcc`` in CI.
* The ``KD_*`` constants come from the define block; never repeat a number
  that :mod:`kdtree_gpu.encoding` defines.

Checking the sources without a GPU
----------------------------------
``python -m kdtree_gpu.kernels --check [--arch sm_90]`` writes the define
block to a header and compiles every ``.cu`` file with the machine's nvcc::

    nvcc -arch=sm_90 --std=c++17 -include <defines.h> -I kdtree_gpu/cuda -c FILE.cu -o /dev/null

It exits non-zero and names the file on any failure.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from . import encoding

CUDA_DIR = Path(__file__).resolve().parent / "cuda"
KERNEL_PREFIX = "kd_"
# Options every module is compiled with. No fast-math: the SAH cost must round
# exactly as the CPU reference does (see kdtree_gpu/config.py).
BASE_OPTIONS = ("--std=c++17", "-lineinfo")
DEFAULT_NVCC_ARCH = "sm_90"

_module_cache: dict = {}
_function_cache: dict = {}


def cuda_sources() -> list:
    """All ``.cu`` files of the package, sorted by name.

    Returns
    -------
    list of pathlib.Path
    """
    return sorted(CUDA_DIR.glob("*.cu"))


def cuda_headers() -> list:
    """All ``.cuh`` headers of the package, sorted by name.

    Returns
    -------
    list of pathlib.Path
    """
    return sorted(CUDA_DIR.glob("*.cuh"))


def write_defines_header(path) -> Path:
    """Write :func:`kdtree_gpu.encoding.cuda_defines` to a header file.

    Parameters
    ----------
    path : str or os.PathLike
        Destination (e.g. ``build/kd_defines.h``); parent folders are created.

    Returns
    -------
    pathlib.Path
        The written path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "#pragma once\n" + encoding.cuda_defines()
    path.write_text(text)
    return path


def read_source(filename: str) -> str:
    """The full text compiled for ``kdtree_gpu/cuda/<filename>``.

    Parameters
    ----------
    filename : str
        Name of a ``.cu`` file in ``kdtree_gpu/cuda`` (no folders).

    Returns
    -------
    str
        Define block, header hash line, ``#line 1 "<filename>"``, the file.

    Raises
    ------
    FileNotFoundError
        No such file; the message lists the available sources.
    ValueError
        ``filename`` is not a plain ``.cu`` file name.
    """
    if not isinstance(filename, str) or os.path.basename(filename) != filename \
            or not filename.endswith(".cu"):
        raise ValueError(f"filename must be the name of a .cu file in {CUDA_DIR}, got {filename!r}")
    path = CUDA_DIR / filename
    if not path.is_file():
        names = ", ".join(p.name for p in cuda_sources()) or "none"
        raise FileNotFoundError(f"no CUDA source {filename!r} in {CUDA_DIR} (available: {names})")
    # CuPy's compile cache keys on the source text only; a hash of the headers
    # makes an edited .cuh recompile every module that may include it.
    header_hash = hashlib.sha1()
    for header in cuda_headers():
        header_hash.update(header.name.encode())
        header_hash.update(header.read_bytes())
    return (
        encoding.cuda_defines()
        + f"// kd-headers {header_hash.hexdigest()}\n"
        + f'#line 1 "{filename}"\n'
        + path.read_text()
    )


def compile_options(options: Sequence[str] = ()) -> tuple:
    """The full NVRTC option tuple for a module: base options, include path, extras."""
    extra = tuple(options)
    return BASE_OPTIONS + (f"-I{CUDA_DIR}",) + extra


def get_module(filename: str, options: Sequence[str] = (), name_expressions=None,
               cooperative: bool = False):
    """Compiled module of one ``.cu`` file on the current device (memoized).

    Parameters
    ----------
    filename : str
        Name of a file in ``kdtree_gpu/cuda``, e.g. ``"primitives.cu"``.
    options : sequence of str
        Extra NVRTC options (e.g. ``("-DKD_BLOCK=256",)``), added after
        :data:`BASE_OPTIONS` and the include path.
    name_expressions : sequence of str, optional
        Template kernel instantiations to compile, e.g.
        ``["kd_segmented_argmin<double>"]``.
    cooperative : bool
        Compile for cooperative groups; every kernel of the module is then
        launched cooperatively (all blocks resident at once, so a grid
        barrier is safe; the grid must fit on the device).

    Returns
    -------
    cupy.RawModule

    Raises
    ------
    RuntimeError
        No GPU is usable.
    FileNotFoundError, ValueError
        See :func:`read_source`.
    """
    from .device import require_gpu

    require_gpu(f"compiling {filename}")
    import cupy

    code = read_source(filename)
    options = tuple(options)
    names = None if name_expressions is None else tuple(name_expressions)
    device_id = cupy.cuda.runtime.getDevice()
    key = (device_id, filename, options, names, cooperative,
           hashlib.sha1(code.encode()).hexdigest())
    module = _module_cache.get(key)
    if module is None:
        module = cupy.RawModule(
            code=code,
            options=compile_options(options),
            name_expressions=names,
            enable_cooperative_groups=cooperative,
        )
        _module_cache[key] = module
    return module


def get_function(filename: str, name: str, options: Sequence[str] = (), name_expressions=None,
                 cooperative: bool = False):
    """One kernel of a ``.cu`` file on the current device (memoized).

    Parameters
    ----------
    filename : str
        Name of a file in ``kdtree_gpu/cuda``.
    name : str
        Kernel name (``extern "C"``) or one of ``name_expressions``; starts
        with ``kd_``.
    options, name_expressions, cooperative
        As in :func:`get_module`.

    Returns
    -------
    cupy.RawKernel

    Raises
    ------
    ValueError
        ``name`` does not start with ``kd_``.
    """
    if not name.startswith(KERNEL_PREFIX):
        raise ValueError(f"kernel names start with {KERNEL_PREFIX!r}, got {name!r} in {filename}")
    from .device import require_gpu

    require_gpu(f"kernel {name} of {filename}")
    import cupy

    names = None if name_expressions is None else tuple(name_expressions)
    # a launch-time lookup must not re-read and hash the sources every time
    key = (cupy.cuda.runtime.getDevice(), filename, name, tuple(options), names, cooperative)
    function = _function_cache.get(key)
    if function is None:
        module = get_module(filename, options, names, cooperative)
        function = module.get_function(name)
        _function_cache[key] = function
    return function


def clear_cache() -> None:
    """Forget every compiled module and function (sources are re-read next time)."""
    _module_cache.clear()
    _function_cache.clear()


def find_nvcc() -> Optional[str]:
    """Path of the ``nvcc`` used by :func:`check_sources` (PATH, then ``$CUDA_HOME/bin``)."""
    found = shutil.which("nvcc")
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


def check_sources(arch: str = DEFAULT_NVCC_ARCH, nvcc: Optional[str] = None, sources=None,
                  ptx: bool = False) -> dict:
    """Compile CUDA sources with nvcc, as the module factory would see them.

    Parameters
    ----------
    arch : str
        nvcc ``-arch`` value, default ``"sm_90"`` (H100/H200).
    nvcc : str, optional
        Path of nvcc; default :func:`find_nvcc`.
    sources : sequence of path, optional
        Files to compile; default :func:`cuda_sources`.
    ptx : bool
        Stop at PTX (``--ptx``) instead of a full compile (``-c``, which also
        runs ptxas and catches register and resource errors).

    Returns
    -------
    dict
        ``{filename: error text}`` for each file that failed (empty: all good).

    Raises
    ------
    FileNotFoundError
        No nvcc found.
    """
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found on PATH or in $CUDA_HOME/bin")
    sources = cuda_sources() if sources is None else [Path(s) for s in sources]
    failures = {}
    with tempfile.TemporaryDirectory(prefix="kd_check_") as tmp:
        header = write_defines_header(Path(tmp) / "kd_defines.h")
        for source in sources:
            out = Path(tmp) / (source.stem + (".ptx" if ptx else ".o"))
            cmd = [nvcc, f"-arch={arch}", "--std=c++17", "-include", str(header),
                   f"-I{CUDA_DIR}", "--ptx" if ptx else "-c", str(source), "-o", str(out)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                failures[source.name] = (proc.stdout + proc.stderr).strip() or \
                    f"nvcc exited with status {proc.returncode}"
    return failures


def main(argv=None) -> int:
    """Command line: ``python -m kdtree_gpu.kernels --check [--arch sm_90] [--ptx]``."""
    parser = argparse.ArgumentParser(
        prog="python -m kdtree_gpu.kernels",
        description="Compile the package's CUDA sources with nvcc (no GPU needed).")
    parser.add_argument("--check", action="store_true", help="compile every .cu file")
    parser.add_argument("--arch", default=DEFAULT_NVCC_ARCH, help="nvcc -arch (default sm_90)")
    parser.add_argument("--ptx", action="store_true", help="stop at PTX instead of -c")
    parser.add_argument("--write-defines", metavar="PATH",
                        help="write the KD_* define block to PATH and exit")
    parser.add_argument("files", nargs="*", help="sources to check (default: all)")
    args = parser.parse_args(argv)
    if args.write_defines:
        print(write_defines_header(args.write_defines))
        return 0
    if not args.check:
        for source in cuda_sources():
            print(source.name)
        return 0
    sources = [Path(f) for f in args.files] or cuda_sources()
    if not sources:
        print(f"no .cu files in {CUDA_DIR}")
        return 0
    try:
        failures = check_sources(arch=args.arch, sources=sources, ptx=args.ptx)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for source in sources:
        status = "FAILED" if source.name in failures else "ok"
        print(f"{status:6s} {source.name}")
    for name, text in failures.items():
        print(f"\n--- {name} ---\n{text}", file=sys.stderr)
    if failures:
        print(f"\n{len(failures)} of {len(sources)} CUDA sources failed to compile: "
              + ", ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
