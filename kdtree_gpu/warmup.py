"""Compiling numba code once per process, and saying so when it takes long.

Every numba kernel of the project is ``cache=True``: numba compiles it on
the first call on a machine (about half a minute for the CPU builder, as
much for the CPU ray queries) and loads it from its on-disk cache
(``NUMBA_CACHE_DIR``, else ``__pycache__`` beside the sources) in later
processes. :func:`compile_once` runs a warm-up once per process and name
(the CPU builder's, :func:`cpu_reference.warm_up`; the ray queries',
:func:`kdtree_gpu.trace.api.warm_up_cpu`) and prints one line on stderr
when (and only when) numba really compiles.

numba tells the two apart with its event API: a dispatcher first tries its
cache and broadcasts a ``"numba:compile"`` event only after a miss, when it
starts the compiler (``Dispatcher.compile`` in numba 0.68; its
``stats.cache_hits`` and ``stats.cache_misses`` count the same outcomes).
A listener installed for the warm-up sees that event for the first kernel
that misses, before its compilation, so the message comes before the wait.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import NamedTuple

from numba.core import event

_lock = threading.RLock()  # a warm-up may call code that warms up too
_warm: set = set()  # names of the warm-ups done in this process
_announced: set = set()  # their messages printed


class _Running(threading.local):
    depth = 0  # warm-ups running in this thread


_running = _Running()


class WarmUp(NamedTuple):
    """What :func:`compile_once` did.

    Attributes
    ----------
    seconds : float
        Time the call took (about 0 once the process is warm).
    compiled : bool
        Whether numba compiled anything, rather than loading it all from its cache.
    """

    seconds: float
    compiled: bool


class _CompileListener(event.Listener):
    """Notes (and announces once per process) a compilation of one package's code."""

    def __init__(self, package, message):
        self.compiled = False
        self.package, self.message = package, message

    def on_start(self, ev):
        dispatcher = ev.data.get("dispatcher") if isinstance(ev.data, dict) else None
        module = getattr(getattr(dispatcher, "py_func", None), "__module__", "") or ""
        if module.split(".")[0] != self.package:
            return
        self.compiled = True
        if self.message not in _announced:
            _announced.add(self.message)
            print(self.message, file=sys.stderr, flush=True)

    def on_end(self, ev):
        pass


def compile_once(work, name: str, package: str, message: str) -> WarmUp:
    """Run ``work()`` once per process and ``name``, saying so on stderr if numba compiles.

    ``work`` makes the calls whose kernels must be ready (the builder's
    :func:`cpu_reference.warm_up` passes small builds through its own code
    path; :func:`kdtree_gpu.trace.api.warm_up_cpu` the ray queries').
    ``message`` is printed before numba starts compiling code of the
    top-level package ``package``, if it has to (at most once per process);
    later calls return at once. A warm-up called from inside another one
    prints nothing of its own: the outer message already covers its compiles.

    Returns
    -------
    WarmUp
        ``(seconds, compiled)``.
    """
    start = time.perf_counter()
    with _lock:
        if name in _warm:
            return WarmUp(time.perf_counter() - start, False)
        if _running.depth:
            # a warm-up inside another one: the outer one's message covers its compiles
            work()
            _warm.add(name)
            return WarmUp(time.perf_counter() - start, False)
        listener = _CompileListener(package, message)
        _running.depth += 1
        try:
            with event.install_listener("numba:compile", listener):
                work()
        finally:
            _running.depth -= 1
        _warm.add(name)
    return WarmUp(time.perf_counter() - start, listener.compiled)
