"""The module factory: every CUDA source of the package is compiled here.

CUDA code lives in real files under ``kdtree_gpu/cuda/``: ``.cu`` files with
kernels, grouped by stage family, and ``.cuh`` headers they ``#include``
(device functions shared by several ``.cu`` files, e.g. the SAH cost). A
module is built from one ``.cu`` file as::

    <cuda_preamble()>                         the KD_* #define block and the
                                              structs of the builder's SoAs
    // kd-headers <hash of the .cuh files>    so caches see header edits
    #line 1 "<filename>"                      errors point into the file
    <the file>

and compiled with NVRTC (``--std=c++17 -lineinfo -I kdtree_gpu/cuda``; the
architecture is the current device's, chosen by CuPy). Modules are memoized
per (device id, filename, options, name expressions, source hash), and
kernels per (device id, filename, name, options): this is the package's one
kernel cache, looked up at every launch.

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
  that :mod:`kdtree_gpu.encoding` defines. Structs of arrays passed by value
  (``KdEvents``, ``KdLevelScratch``, ...) come from their declarations in
  :mod:`kdtree_gpu.builder.soa` (:func:`kdtree_gpu.soa.cuda_struct`).

First use on a machine
----------------------
CuPy compiles a module with NVRTC when its first kernel is asked for and
keeps the binary in its on-disk kernel cache (``CUPY_CACHE_DIR``, default
``~/.cupy/kernel_cache``), so later processes load it in milliseconds. Before
the first compilation of a module this machine has not compiled before,
:data:`GPU_COMPILE_MESSAGE` is printed once per process on stderr; a stamp
per module (its source hash, options, the device's architecture, the CuPy and
NVRTC versions) under ``KDTREE_GPU_CACHE_DIR`` (default
``~/.cache/kdtree_gpu``) remembers that it was compiled.

A first build compiles the modules it will run side by side, one child
process each, before it asks for any of them
(:func:`kdtree_gpu.compile_ahead.compile_modules`, which reads and writes the
same stamps).

Checking the sources without a GPU
----------------------------------
``python -m kdtree_gpu.kernels --check [--arch sm_90]`` writes the preamble
to a header and compiles every ``.cu`` file with the machine's nvcc::

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

GPU_COMPILE_MESSAGE = ("kdtree-gpu: compiling GPU kernels for sm_{arch}, once per machine "
                       "(5-20 seconds)...")

_module_cache: dict = {}
_function_cache: dict = {}
_cooperative_cache: dict = {}  # (device, file, kernel, block) -> cooperative_function's
_pointer_cache: dict = {}  # as _function_cache: (CUfunction, the RawKernel keeping it loaded)
_announced = False


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


def cuda_preamble() -> str:
    """The text prepended to every CUDA source: the ``KD_*`` defines and the structs.

    Returns
    -------
    str
        :func:`kdtree_gpu.encoding.cuda_defines`, then one C struct per
        declaration in ``CUDA_STRUCTS`` of :mod:`kdtree_gpu.builder.soa` and
        :mod:`kdtree_gpu.trace.soa`, each with
        ``static_assert`` checks that its layout is the NumPy dtype's.
    """
    from .builder.soa import CUDA_STRUCTS as build_structs
    from .soa import cuda_struct
    from .trace.soa import CUDA_STRUCTS as trace_structs

    structs = "".join(cuda_struct(cls) for cls in build_structs + trace_structs)
    return encoding.cuda_defines() + "// generated by kdtree_gpu.soa.cuda_struct()\n" + structs


def write_defines_header(path) -> Path:
    """Write :func:`cuda_preamble` to a header file.

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
    text = "#pragma once\n" + cuda_preamble()
    path.write_text(text)
    return path


def kernel_parameters(filename: str, name: str) -> tuple:
    """A kernel's parameter list as its definition in ``kdtree_gpu/cuda/<filename>`` declares it
    (a parameter macro may come from a package header the file includes).

    Returns
    -------
    tuple of (str, str, bool)
        ``(name, C type, pointer)`` per parameter, in order; the type without
        ``const``, ``__restrict__`` and ``*`` (``"long long"``, ``"KdRays"``).

    Raises
    ------
    ValueError
        The file does not define ``name``.
    """
    import re

    def read(name):
        # comments may hold parentheses and commas: drop them first; then join a
        # macro's continued lines
        code = (CUDA_DIR / name).read_text()
        return re.sub(r"//[^\n]*|/\*.*?\*/", " ", code, flags=re.S).replace("\\\n", " ")

    text = read(filename)
    # the definition: the name, its parameters, the body's brace (template
    # instantiations end with ';', calls sit inside bodies with no brace after)
    match = re.search(r"\b" + re.escape(name) + r"\s*\(([^)]*)\)\s*\{", text)
    if match is None:
        raise ValueError(f"no definition of kernel {name!r} in {filename}")
    # a macro of the file, or of a package header it includes (and so on), may
    # stand for several parameters (kernels that share them)
    macros, seen, files = {}, {filename}, [text]
    while files:
        code = files.pop()
        for macro, value in re.findall(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+([^\n]*)", code,
                                       flags=re.M):
            macros.setdefault(macro, value)  # (the file's own first)
        for header in re.findall(r'^[ \t]*#[ \t]*include[ \t]+"([\w.]+)"', code, flags=re.M):
            if header not in seen and (CUDA_DIR / header).is_file():
                seen.add(header)
                files.append(read(header))
    listed = []
    for item in match.group(1).split(","):
        listed += macros[item.strip()].split(",") if item.strip() in macros else [item]
    parameters = []
    for parameter in listed:
        words = [w for w in parameter.replace("*", " * ").split()
                 if w not in ("const", "__restrict__")]
        pointer = "*" in words
        words = [w for w in words if w != "*"]
        if len(words) < 2:
            raise ValueError(f"kernel {name!r} in {filename}: parameter {parameter.strip()!r} "
                             f"is not a declaration")
        parameters.append((words[-1], " ".join(words[:-1]), pointer))
    return tuple(parameters)


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
        cuda_preamble()
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
    return _module_entry(filename, options, name_expressions, cooperative)[0]


def _module_entry(filename, options, name_expressions, cooperative) -> tuple:
    """``(module, stamp)``: :func:`get_module`'s module and its stamp file on this machine."""
    from .device import require_gpu

    require_gpu(f"compiling {filename}")
    import cupy

    code, identity = _module_identity(filename, options, name_expressions, cooperative)
    key = (cupy.cuda.runtime.getDevice(), *identity)
    entry = _module_cache.get(key)
    if entry is None:
        _, options, names, _, _ = identity
        module = cupy.RawModule(
            code=code,
            options=compile_options(options),
            name_expressions=names,
            enable_cooperative_groups=cooperative,
        )
        entry = _module_cache[key] = (module, _stamp(identity))
    return entry


def _module_identity(filename, options, name_expressions, cooperative) -> tuple:
    """``(code, identity)``: a module's source and what identifies it on any device,
    ``(file, options, name expressions, cooperative, source hash)``."""
    code = read_source(filename)
    names = None if name_expressions is None else tuple(name_expressions)
    return code, (filename, tuple(options), names, cooperative,
                  hashlib.sha1(code.encode()).hexdigest())


def _stamp(key: tuple) -> Path:
    """The stamp file of a module (``key``: :func:`_module_identity`'s identity) on
    this machine: the module on any device of the current device's architecture
    and this CuPy and NVRTC."""
    import cupy

    machine_key = repr((key, compile_options(key[1]), cupy.cuda.Device().compute_capability,
                        cupy.__version__, cupy.cuda.nvrtc.getVersion()))
    return cache_dir() / "gpu_modules" / hashlib.sha1(machine_key.encode()).hexdigest()


def module_stamp(filename: str, options: Sequence[str] = (), name_expressions=None,
                 cooperative: bool = False) -> Path:
    """The stamp file on this machine of the module :func:`get_module` compiles from
    these arguments (see "First use on a machine" above)."""
    return _stamp(_module_identity(filename, options, name_expressions, cooperative)[1])


def get_function(filename: str, name: str, options: Sequence[str] = (), name_expressions=None,
                 cooperative: bool = False):
    """One kernel of a ``.cu`` file on the current device (memoized).

    Looked up at every launch: after the first call for a (device, file,
    kernel, options) it costs one device query and one dictionary lookup.

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
    RuntimeError
        No GPU is usable.
    """
    if not name.startswith(KERNEL_PREFIX):
        raise ValueError(f"kernel names start with {KERNEL_PREFIX!r}, got {name!r} in {filename}")
    from .device import require_gpu

    require_gpu(f"kernel {name} of {filename}")
    import cupy

    key = (cupy.cuda.runtime.getDevice(), filename, name, tuple(options), cooperative)
    function = _function_cache.get(key)
    if function is None:
        module, stamp = _module_entry(filename, options, name_expressions, cooperative)
        # the module compiles (or loads CuPy's cached binary) at its first kernel
        function = compile_announced(stamp, lambda: module.get_function(name),
                                     arch=cupy.cuda.Device().compute_capability)
        _function_cache[key] = function
    return function


def get_function_pointer(filename: str, name: str, options: Sequence[str] = (),
                         name_expressions=None, device_id: Optional[int] = None) -> int:
    """The ``CUfunction`` of :func:`get_function`'s kernel on the current device (memoized).

    For launches through the driver (:class:`kdtree_gpu.packed_launch.PackedLaunch`).
    The cache entry also holds the ``RawKernel``, which keeps its module
    loaded as long as the address is handed out. ``device_id``: the current
    device's, when the caller has it (a query asks the runtime once).
    """
    if device_id is None:
        import cupy

        device_id = cupy.cuda.runtime.getDevice()
    key = (device_id, filename, name, tuple(options))
    entry = _pointer_cache.get(key)
    if entry is None:
        kernel = get_function(filename, name, options, name_expressions)
        entry = _pointer_cache[key] = (kernel.kernel.ptr, kernel)
    return entry[0]


def cooperative_function(filename: str, name: str, block: int) -> Optional[tuple]:
    """A kernel of a cooperative module (:func:`get_function` with ``cooperative``)
    and how many of its blocks of ``block`` threads are resident at once on the
    current device (blocks per multiprocessor times multiprocessors), memoized.

    Returns
    -------
    (cupy.RawKernel, int) or None
        None where the device cannot launch cooperatively or no block fits
        on a multiprocessor.
    """
    import cupy

    from .device import cooperative_launch, multiprocessors

    device_id = cupy.cuda.runtime.getDevice()
    key = (device_id, filename, name, int(block))
    if key not in _cooperative_cache:
        result = None
        if cooperative_launch(device_id):
            from cupy_backends.cuda.api import driver

            kernel = get_function(filename, name, cooperative=True)
            per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr,
                                                                      int(block), 0)
            if per_sm > 0:
                result = (kernel, per_sm * multiprocessors(device_id))
        _cooperative_cache[key] = result
    return _cooperative_cache[key]


def cache_dir() -> Path:
    """Where the package keeps its per-machine stamps (``KDTREE_GPU_CACHE_DIR``)."""
    return Path(os.environ.get("KDTREE_GPU_CACHE_DIR") or Path.home() / ".cache" / "kdtree_gpu")


def announce_compile(arch: str = "") -> None:
    """Print :data:`GPU_COMPILE_MESSAGE` on stderr, at most once per process."""
    global _announced
    if not _announced:
        _announced = True
        print(GPU_COMPILE_MESSAGE.format(arch=arch), file=sys.stderr, flush=True)


def compile_announced(stamp: Path, compile_, arch: str = ""):
    """Run ``compile_()``, first saying so on stderr if ``stamp`` does not exist.

    The message (:data:`GPU_COMPILE_MESSAGE`) is printed at most once per
    process; after ``compile_`` returns the stamp is written (quietly skipped
    where the cache directory is not writable).

    Returns
    -------
    What ``compile_()`` returns.
    """
    known = stamp.exists()
    if not known:
        announce_compile(arch)
    result = compile_()
    if not known:
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.touch()
        except OSError:
            pass
    return result


def clear_cache() -> None:
    """Forget every compiled module and function (sources are re-read next time)."""
    _module_cache.clear()
    _function_cache.clear()
    _pointer_cache.clear()
    _cooperative_cache.clear()


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
