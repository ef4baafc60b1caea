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
measured on H200 machines); a launch whose host time matters goes through
:mod:`kdtree_gpu.packed_launch` instead (4-5 us), with the same descriptions,
profiler and debug switch. With profiling on, each launch records two
events (no synchronization either); event times are read when the profile
is reported. The debug switch (``KDTREE_GPU_DEBUG=1`` or
:func:`set_debug`) synchronizes after every launch and stage and raises an
error that names the one that failed; it is for finding faults, not for
timing.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from typing import Optional

from .encoding import LAUNCH_BLOCK as DEFAULT_BLOCK
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

    def times(self) -> dict:
        """Every recorded time (ms) of each description, in the order recorded
        (waits for pending GPU events): ``{description: [ms, ...]}``."""
        self._resolve()
        return {description: list(times) for description, times in self._times.items()}

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


_NOT_OBSERVED = contextlib.nullcontext()  # reusable: enters and leaves without state


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
    With profiling and debug off this is a shared do-nothing context (a
    build enters about ten stages; a generator context costs each a few
    microseconds of host time).
    """
    if _active_profiler is None and not _debug:
        return _NOT_OBSERVED
    return _observed_stage(description, xp)


@contextlib.contextmanager
def _observed_stage(description: str, xp):
    global _stage_depth
    profiler = _active_profiler
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
