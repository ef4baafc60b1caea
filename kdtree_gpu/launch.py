"""One launcher for every GPU launch of the package, with a per-stage profile.

Modelled on pbrt-v4's ``GPUParallelFor(description, n, func)`` (Pharr, Jakob
and Humphreys, *Physically Based Rendering*, 4th ed., section 15.2): each
launch carries a description; when profiling is on, a pair of CUDA events
brackets it and :meth:`Profiler.report` prints launches, total, share and
min/avg/max time per description. Library calls that are not our kernels
(CuPy ``cumsum``, ``argsort``, CUB) are timed by wrapping them in
:func:`stage`.

Typical use::

    from kdtree_gpu.launch import launch, stage, profiling

    with profiling() as prof:
        launch("classify triangles", kernel, num_tris, (tri_class, ...))
        with stage("sort events"):
            order = cupy.argsort(event_key)
    print(prof.report())

Costs
-----
With profiling off, :func:`launch` is the kernel call plus a few attribute
tests: no events, no synchronization. CuPy's kernel call itself inspects
every argument (9-17 us of host time for the traversal's six parameters,
measured on H200 machines); a launch whose host time matters (a ray query: a few
microseconds of GPU work for a small batch) declares its parameter list once
as a :class:`PackedLaunch` and costs one ``struct.pack_into`` and one
``cuLaunchKernel`` (4-5 us). With profiling on, each launch records
two events (no synchronization either); event times are read when the
profile is reported. The debug switch (``KDTREE_GPU_DEBUG=1`` or
:func:`set_debug`) synchronizes after every launch and stage and raises an
error that names the one that failed; it is for finding faults, not for
timing.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import struct
import sys
import threading
import time
from typing import Optional, Sequence

import numpy as np

DEFAULT_BLOCK = 256
# Pending event pairs above this count are converted to times when they are
# done (a non-blocking query), so a long run does not hold unbounded events.
_MAX_PENDING_EVENTS = 2048

_debug = os.environ.get("KDTREE_GPU_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")
_active_profiler: Optional["Profiler"] = None
_stage_depth = 0  # stages open now (records made inside one are nested)


class LaunchError(RuntimeError):
    """A kernel launch or profiled stage failed; the message names it."""


class Profiler:
    """Per-description launch counts and times.

    GPU launches and stages are timed with CUDA events (milliseconds between
    two events recorded on the current stream around the work); NumPy-backend
    stages with :func:`time.perf_counter`. Both kinds land in the same table.

    A launch or stage recorded while another stage is open is *nested*: it
    is listed (marked ``nested`` in :meth:`as_dict`, indented in
    :meth:`report`) but left out of the total, since the enclosing stage's
    time already contains it. Shares are fractions of that total.
    """

    def __init__(self):
        self._times = {}  # description -> list of float ms
        self._pending = []  # (description, start_event, end_event)
        self._previous = []  # profilers that were active before each __enter__
        self._nested = set()  # descriptions recorded inside an open stage

    # --- recording -------------------------------------------------------
    def add_time(self, description: str, ms: float, nested: bool = False) -> None:
        """Record one measured duration (ms) under ``description``."""
        self._times.setdefault(description, []).append(float(ms))
        if nested:
            self._nested.add(description)

    def add_events(self, description: str, start, end, nested: bool = False) -> None:
        """Record a pair of CUDA events; their time is read later."""
        self._times.setdefault(description, [])
        if nested:
            self._nested.add(description)
        self._pending.append((description, start, end))
        if len(self._pending) > _MAX_PENDING_EVENTS:
            self._resolve(block=False)

    def _resolve(self, block: bool = True) -> None:
        if not self._pending:
            return
        import cupy

        still_pending = []
        for description, start, end in self._pending:
            if not block and not end.done:
                still_pending.append((description, start, end))
                continue
            end.synchronize()
            self._times[description].append(cupy.cuda.get_elapsed_time(start, end))
        self._pending = still_pending

    def reset(self) -> None:
        """Forget every record."""
        self._times.clear()
        self._pending.clear()
        self._nested.clear()

    # --- reading ---------------------------------------------------------
    def as_dict(self) -> dict:
        """Statistics per description (waits for pending GPU events).

        Returns
        -------
        dict
            ``{description: {"launches", "total_ms", "min_ms", "avg_ms",
            "max_ms", "share", "nested"}}`` with ``share`` the fraction of
            the sum of the totals of the records that are not nested,
            ordered by decreasing total.
        """
        self._resolve(block=True)
        grand_total = sum(sum(t) for d, t in self._times.items() if d not in self._nested)
        stats = {}
        for description, times in self._times.items():
            total = math.fsum(times)
            stats[description] = {
                "launches": len(times),
                "total_ms": total,
                "min_ms": min(times) if times else 0.0,
                "avg_ms": total / len(times) if times else 0.0,
                "max_ms": max(times) if times else 0.0,
                "share": total / grand_total if grand_total > 0 else 0.0,
                "nested": description in self._nested,
            }
        return dict(sorted(stats.items(), key=lambda kv: -kv[1]["total_ms"]))

    @property
    def total_ms(self) -> float:
        """Sum of the recorded times that are not nested in a stage (ms)."""
        return sum(s["total_ms"] for s in self.as_dict().values() if not s["nested"])

    def report(self, title: str = "kernel profile") -> str:
        """Readable table, one row per description, largest total first.

        Returns
        -------
        str
        """
        stats = self.as_dict()
        width = max([len("description")] + [len(d) + 2 for d in stats])
        header = (f"{'description':<{width}}  {'launches':>8}  {'total ms':>10}  {'share':>6}  "
                  f"{'min ms':>9}  {'avg ms':>9}  {'max ms':>9}")
        lines = [title, header, "-" * len(header)]
        for description, s in stats.items():
            label = ("  " + description) if s["nested"] else description
            lines.append(
                f"{label:<{width}}  {s['launches']:>8d}  {s['total_ms']:>10.3f}  "
                f"{100 * s['share']:>5.1f}%  {s['min_ms']:>9.4f}  {s['avg_ms']:>9.4f}  "
                f"{s['max_ms']:>9.4f}")
        lines.append("-" * len(header))
        top = [s for s in stats.values() if not s["nested"]]
        total = sum(s["total_ms"] for s in top)
        launches = sum(s["launches"] for s in top)
        lines.append(f"{'total':<{width}}  {launches:>8d}  {total:>10.3f}  {100.0 if top else 0.0:>5.1f}%")
        if len(top) < len(stats):
            lines.append("(indented rows ran inside a stage above; not in the total)")
        return "\n".join(lines)

    # --- enabling --------------------------------------------------------
    def __enter__(self):
        global _active_profiler
        self._previous.append(_active_profiler)
        _active_profiler = self
        return self

    def __exit__(self, *exc):
        global _active_profiler
        _active_profiler = self._previous.pop()
        return False


def profiling(profiler: Optional[Profiler] = None) -> Profiler:
    """Make a profiler active for a ``with`` block: ``with profiling() as prof:``.

    Parameters
    ----------
    profiler : Profiler, optional
        Reuse one (to add to its records); default a new one.

    Returns
    -------
    Profiler
        A context manager; the previous active profiler (if any) is restored
        on exit.
    """
    return profiler if profiler is not None else Profiler()


def active_profiler() -> Optional[Profiler]:
    """The profiler that records launches now, or ``None``."""
    return _active_profiler


def set_active_profiler(profiler: Optional[Profiler]) -> Optional[Profiler]:
    """Make ``profiler`` (or ``None``: profiling off) active outside a ``with`` block.

    Returns
    -------
    Profiler or None
        The previously active profiler.
    """
    global _active_profiler
    previous, _active_profiler = _active_profiler, profiler
    return previous


def set_debug(enabled: bool) -> None:
    """Synchronize and check after each launch and stage (also ``KDTREE_GPU_DEBUG=1``)."""
    global _debug
    _debug = bool(enabled)


def debug_enabled() -> bool:
    """Whether launches synchronize and check for errors."""
    return _debug


def grid_size(n: int, block: int = DEFAULT_BLOCK) -> int:
    """Number of blocks of ``block`` threads that cover ``n`` items."""
    return (n + block - 1) // block


def launch(description: str, kernel, n: int, args: tuple, block: int = DEFAULT_BLOCK,
           shared_mem: int = 0) -> None:
    """Launch a 1-D kernel over ``n`` items, named ``description``.

    Thread ``i`` of the launch handles item ``i``; the grid is
    ``ceil(n / block)`` blocks, so the kernel must test ``i < n`` itself.

    Parameters
    ----------
    description : str
        Name in the profile and in error messages (a verb phrase:
        ``"classify triangles"``).
    kernel : cupy.RawKernel
        From :func:`kdtree_gpu.kernels.get_function`.
    n : int
        Number of items (threads). A host integer: a count that lives on the
        device must be read explicitly by the caller (a synchronization worth
        marking in the code). ``n == 0`` launches nothing.
    args : tuple
        Kernel arguments (CuPy arrays and NumPy scalars of the exact C type).
    block : int
        Threads per block (1..1024), default 256.
    shared_mem : int
        Dynamic shared memory per block, bytes.

    Raises
    ------
    TypeError
        ``n`` is not a host integer.
    ValueError
        ``n < 0`` or ``block`` outside 1..1024.
    LaunchError
        The launch failed (or, in debug mode, the kernel faulted); the message
        names the description and the kernel.
    """
    if isinstance(n, bool) or not hasattr(n, "__index__"):
        raise TypeError(f"launch {description!r}: n must be a host integer, got "
                        f"{type(n).__name__} (read a device count explicitly with int())")
    n = n.__index__()
    if n <= 0:
        if n < 0:
            raise ValueError(f"launch {description!r}: n must be >= 0, got {n}")
        return
    if not 1 <= block <= 1024:
        raise ValueError(f"launch {description!r}: block must be in 1..1024, got {block}")
    grid = (n + block - 1) // block
    if _active_profiler is None and not _debug:
        try:
            kernel((grid,), (block,), args, shared_mem=shared_mem)
            return
        except Exception as exc:
            raise _launch_error(description, kernel, n, grid, block, exc) from exc
    _observed(description, kernel, n, grid, block,
              lambda: kernel((grid,), (block,), args, shared_mem=shared_mem))


def _observed(description, kernel, n, grid, block, call) -> None:
    """Run ``call`` (one launch) under the active profiler and the debug switch."""
    profiler = _active_profiler
    try:
        if profiler is None:
            call()
        else:
            import cupy

            start = cupy.cuda.Event()
            end = cupy.cuda.Event()
            start.record()
            call()
            end.record()
            profiler.add_events(description, start, end, nested=_stage_depth > 0)
        if _debug:
            import cupy

            cupy.cuda.get_current_stream().synchronize()
    except LaunchError:
        raise
    except Exception as exc:
        raise _launch_error(description, kernel, n, grid, block, exc) from exc


def _launch_error(description, kernel, n, grid, block, exc) -> LaunchError:
    name = getattr(kernel, "name", type(kernel).__name__)
    return LaunchError(f"launch {description!r} (kernel {name}, n={n}, grid={grid}, "
                       f"block={block}) failed: {type(exc).__name__}: {exc}")


# struct module codes of the scalar types kernel parameters are made of
_STRUCT_CODES = {
    np.dtype(np.float32): "f", np.dtype(np.float64): "d", np.dtype(np.int8): "b",
    np.dtype(np.uint8): "B", np.dtype(np.bool_): "?", np.dtype(np.int32): "i",
    np.dtype(np.uint32): "I", np.dtype(np.int64): "q", np.dtype(np.uint64): "Q",
}


def _struct_format(dtype: np.dtype) -> str:
    """The :mod:`struct` format of an aligned NumPy dtype: its scalars in offset order, padding as ``x``."""
    parts, at = [], 0
    for name, (field, offset) in sorted(dtype.fields.items(), key=lambda item: item[1][1]):
        parts.append("x" * (offset - at))
        parts.append(_struct_format(field) if field.fields else _STRUCT_CODES[field])
        at = offset + field.itemsize
    parts.append("x" * (dtype.itemsize - at))
    return "".join(parts)


# CuPy's binding of the driver API; looked up in sys.modules at each launch
# (an import statement costs a microsecond there)
_DRIVER = "cupy_backends.cuda.api.driver"


class PackedLaunch:
    """A kernel's parameter list packed into one block and launched through the driver.

    CuPy's ``RawKernel`` call inspects every argument at each launch (9 us of
    host time for the traversal's six parameters on an H200 machine, where
    ``cuLaunchKernel`` itself takes 4 us); a query that is one launch wants
    less. Here the parameter list is declared once, in the kernel's order,
    each parameter a NumPy scalar dtype (a pointer is ``uint64``) or a class
    whose generated C struct the kernel takes by value
    (:class:`kdtree_gpu.soa.ScalarStruct`, :class:`kdtree_gpu.soa.SoA`). A
    launch packs the values, flattened in that order (struct fields in
    declaration order, ``0`` for a null pointer), with one
    ``struct.pack_into`` into a block of this thread and hands
    ``cuLaunchKernel`` the address of each parameter in it; the driver copies
    the parameters at the call, so the block is free again when it returns.

    Parameters
    ----------
    kernel_name : str
        For error messages.
    parameters : sequence of (name, type)
    """

    def __init__(self, kernel_name: str, parameters: Sequence):
        from .soa import struct_dtype

        self.name = kernel_name
        self.parameters = tuple(parameters)

        def dtype(kind):
            scalar = isinstance(kind, np.dtype) or (isinstance(kind, type)
                                                    and issubclass(kind, np.generic))
            return np.dtype(kind) if scalar else struct_dtype(kind)

        block = np.dtype([(name, dtype(kind)) for name, kind in parameters], align=True)
        self._struct = struct.Struct("<" + _struct_format(block))
        if self._struct.size != block.itemsize:
            raise AssertionError(f"{kernel_name}: packed parameters take {self._struct.size} "
                                 f"bytes, the aligned block {block.itemsize}")
        self._offsets = np.array([block.fields[name][1] for name, _ in parameters], np.uint64)
        self._local = threading.local()  # a launch may release the GIL: one block per thread
        self._splits = {}  # number of fixed values -> (head, tail) Structs (bound launches)

    @classmethod
    def of_kernel(cls, filename: str, name: str, structs=()) -> "PackedLaunch":
        """The parameter list of kernel ``name`` as ``kdtree_gpu/cuda/<filename>`` defines it.

        Pointers become addresses, C scalars their NumPy types
        (:data:`kdtree_gpu.soa.C_TYPES`), and a struct taken by value the class
        among ``structs`` whose generated C struct has that name; the list is
        then declared once, in the CUDA source.

        Raises
        ------
        ValueError
            A parameter type that is none of these.
        """
        from .kernels import kernel_parameters
        from .soa import C_TYPES

        scalars = {c_type: dtype for dtype, c_type in C_TYPES.items()}
        by_name = {struct.c_name: struct for struct in structs}
        parameters = []
        for param, c_type, pointer in kernel_parameters(filename, name):
            kind = np.dtype(np.uint64) if pointer else scalars.get(c_type, by_name.get(c_type))
            if kind is None:
                raise ValueError(f"{name} in {filename}: parameter {param!r} has type {c_type!r}, "
                                 f"neither a pointer, a scalar nor one of the structs given")
            parameters.append((param, kind))
        return cls(name, parameters)

    def _new_block(self) -> tuple:
        data = np.zeros(self._struct.size, np.uint8)
        pointers = self._offsets + np.uint64(data.ctypes.data)
        # the arrays stay referenced with the address, so it stays valid
        return data, pointers, pointers.ctypes.data

    def _block(self):
        blocks = self._local.__dict__.get("blocks")
        if blocks is None:
            blocks = self._local.blocks = self._new_block()
        return blocks

    def __call__(self, description: str, function: int, n: int, block: int, values: tuple,
                 stream: int) -> None:
        """Launch ``ceil(n / block)`` blocks of ``function`` (a ``CUfunction``) on ``stream``.

        ``n`` is a host integer (``0``: nothing is launched); errors raise
        :class:`LaunchError` naming ``description``; the active profiler and
        the debug switch apply as in :func:`launch`.
        """
        data, _, address = self._block()
        self._launch(description, function, n, block, stream, data, address, self._struct, 0,
                     values)

    def _launch(self, description, function, n, block, stream, data, address, packer, at,
                values) -> None:
        """Pack ``values`` with ``packer`` at byte ``at`` of ``data`` and launch."""
        if n <= 0:
            return
        driver = sys.modules.get(_DRIVER) or importlib.import_module(_DRIVER)
        grid = (n + block - 1) // block
        if _active_profiler is None and not _debug:
            try:
                packer.pack_into(data, at, *values)
                driver.launchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, address, 0)
                return
            except Exception as exc:
                raise _launch_error(description, self, n, grid, block, exc) from exc

        def call():
            packer.pack_into(data, at, *values)
            driver.launchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, address, 0)

        _observed(description, self, n, grid, block, call)

    def bound(self, head: tuple) -> "BoundLaunch":
        """This launch with its first ``len(head)`` values fixed (:class:`BoundLaunch`)."""
        return BoundLaunch(self, head)

    def _split(self, count: int) -> tuple:
        """``(head Struct, tail Struct)``: the first ``count`` values (with the padding
        after them) and the rest."""
        split = self._splits.get(count)
        if split is None:
            codes, seen = self._struct.format.lstrip("<"), 0
            for at, code in enumerate(codes):
                if code != "x":
                    if seen == count:
                        break
                    seen += 1
            else:
                at = len(codes)
            if seen < count:
                raise ValueError(f"{self.name}: {count} fixed values, the block holds {seen}")
            split = self._splits[count] = (struct.Struct("<" + codes[:at]),
                                           struct.Struct("<" + codes[at:]))
        return split

    @property
    def offsets(self) -> tuple:
        """Where each parameter starts in the block (bytes)."""
        return tuple(int(x) for x in self._offsets)

    def pack(self, values: tuple) -> np.ndarray:
        """A new block (uint8) holding ``values``, padding zero."""
        data = np.zeros(self._struct.size, np.uint8)
        self._struct.pack_into(data, 0, *values)
        return data

    def prepared(self, function: int, n: int, block: int, values: tuple, stream: int):
        """A callable that launches with these values, packed now into a block of its own.

        For timing the kernel alone: each call is one ``cuLaunchKernel``.
        """
        from cupy_backends.cuda.api import driver

        data = self.pack(values)
        pointers = self._offsets + np.uint64(data.ctypes.data)
        address = pointers.ctypes.data
        grid = (n + block - 1) // block

        def call():
            driver.launchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, address, 0)

        call.arrays = (data, pointers)  # alive as long as the callable: the addresses stay valid
        return call


class BoundLaunch:
    """A :class:`PackedLaunch` whose first values never change, packed once.

    A tree's query launches with the same addresses and box every time:
    they are packed once into each thread's block, and a launch packs only
    the values after them. The block of the thread that binds is made here
    (a GPU build binds its tree's launch, so that the tree's first query
    there makes nothing); another thread's at its first launch. Call as the
    launch itself, with those values only.
    """

    def __init__(self, launch: PackedLaunch, head: tuple):
        self.launch = launch
        self.head = tuple(head)
        self._head, self._tail = launch._split(len(self.head))
        self._local = threading.local()
        self._block()

    def _block(self):
        blocks = self._local.__dict__.get("blocks")
        if blocks is None:
            blocks = self.launch._new_block()
            self._head.pack_into(blocks[0], 0, *self.head)
            self._local.blocks = blocks
        return blocks

    def __call__(self, description: str, function: int, n: int, block: int, values: tuple,
                 stream: int) -> None:
        data, _, address = self._block()
        self.launch._launch(description, function, n, block, stream, data, address, self._tail,
                            self._head.size, values)


@contextlib.contextmanager
def stage(description: str, xp=None):
    """Time a block of library calls under ``description`` (when profiling).

    Parameters
    ----------
    description : str
        Name in the profile and in error messages.
    xp : module, optional
        ``numpy`` times with :func:`time.perf_counter`; ``cupy`` with CUDA
        events on the current stream. Default: CUDA events when CuPy is
        loaded and a GPU is usable, else ``perf_counter``.

    Notes
    -----
    With profiling and debug off this yields at once and records nothing.
    """
    global _stage_depth
    profiler = _active_profiler
    if profiler is None and not _debug:
        yield
        return
    nested = _stage_depth > 0
    use_events = _use_events(xp)
    start = end = None
    t0 = 0.0
    if profiler is not None:
        if use_events:
            import cupy

            start = cupy.cuda.Event()
            start.record()
        else:
            t0 = time.perf_counter()
    _stage_depth += 1
    try:
        yield
    finally:
        _stage_depth -= 1
    try:
        if _debug and use_events:
            import cupy

            cupy.cuda.get_current_stream().synchronize()
    except Exception as exc:
        raise LaunchError(f"stage {description!r} failed: {type(exc).__name__}: {exc}") from exc
    if profiler is not None:
        if use_events:
            import cupy

            end = cupy.cuda.Event()
            end.record()
            profiler.add_events(description, start, end, nested=nested)
        else:
            profiler.add_time(description, 1000.0 * (time.perf_counter() - t0), nested=nested)


def _use_events(xp) -> bool:
    if xp is not None:
        return getattr(xp, "__name__", "") == "cupy"
    if "cupy" not in sys.modules:
        return False
    from .device import gpu_available

    return gpu_available()
