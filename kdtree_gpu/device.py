"""Where work runs: is a GPU usable, and which device a user's choice means.

This is the one device resolver of the package: ``kd.build``, the ray
queries, the path tracer and the command line all turn a user's ``device=``
into a :class:`Device` here, so they accept the same names and fail with
the same messages.

Device names (case is ignored)
------------------------------
``"auto"``      the current GPU when one is usable, else the CPU
``"cpu"``       the CPU
``"cuda"``,     the current CUDA device (CuPy's current device, usually 0);
``"gpu"``       an error naming the reason when no GPU is usable
``"cuda:N"``,   CUDA device ``N``
``"gpu:N"``

Importing this module never imports CuPy. CuPy is imported the first time a
GPU is asked about, and a missing or broken CUDA setup becomes ``False``
from :func:`gpu_available` and a one-line ``RuntimeError`` from
:func:`require_gpu`, never an ``ImportError`` at ``import kdtree_gpu``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from typing import Optional

DEVICE_NAMES = "auto, cpu, gpu, cuda or cuda:N"
INSTALL_HINT = "pip install kdtree-gpu[cuda13] (or kdtree-gpu[cuda12] for a CUDA 12 driver)"
_DEVICE_RE = re.compile(r"^(auto|cpu|gpu|cuda)(?::(\d+))?$")

# Why the GPU is not usable (None while usable or not yet probed).
_unavailable_reason: Optional[str] = None


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    """Whether GPU work can run: CuPy imports, a device exists, the driver works.

    The probe runs once per process (the answer is cached) and never raises.
    It runs one small kernel on the current device, so a driver that is
    installed but unusable (too old, no permission on ``/dev/nvidia*``)
    counts as unavailable.

    Returns
    -------
    bool
    """
    global _unavailable_reason
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA library at import
        _unavailable_reason = f"CuPy cannot be imported ({type(exc).__name__}: {exc})"
        return False
    try:
        num_devices = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        _unavailable_reason = f"the CUDA driver reports no usable device ({_one_line(exc)})"
        return False
    if num_devices < 1:
        _unavailable_reason = "no CUDA device is present"
        return False
    try:
        # a real allocation and kernel launch: catches a driver that lists
        # devices but cannot create a context
        probe = cupy.arange(4, dtype=cupy.int32) + 1
        if int(probe.sum()) != 10:
            raise RuntimeError("a test kernel returned a wrong result")
    except Exception as exc:
        _unavailable_reason = f"the CUDA device cannot run a kernel ({_one_line(exc)})"
        return False
    _unavailable_reason = None
    return True


def unavailable_reason() -> Optional[str]:
    """Why :func:`gpu_available` is ``False`` (``None`` when a GPU is usable)."""
    gpu_available()
    return _unavailable_reason


def require_gpu(what: str) -> None:
    """Raise a one-line ``RuntimeError`` unless a GPU is usable.

    Parameters
    ----------
    what : str
        The work that needs the GPU (``"device='cuda'"``, ``"the GPU
        builder"``); it starts the message.

    Raises
    ------
    RuntimeError
        ``"<what> needs a CUDA GPU, but <reason>; install CuPy with ..."``.
    """
    if gpu_available():
        return
    raise RuntimeError(
        f"{what} needs a CUDA GPU, but {_unavailable_reason}; "
        f"on a machine with an NVIDIA GPU install CuPy with `{INSTALL_HINT}`, "
        "or use device='cpu'"
    )


@dataclasses.dataclass(frozen=True)
class Device:
    """A resolved device: the CPU, or one CUDA device.

    Attributes
    ----------
    kind : {"cpu", "cuda"}
    index : int or None
        The CUDA device number (``None`` for the CPU).
    """

    kind: str
    index: Optional[int] = None

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    def use(self):
        """Context manager that makes this device CuPy's current one (no-op on the CPU)."""
        if not self.is_cuda:
            return contextlib.nullcontext()
        import cupy

        return cupy.cuda.Device(self.index)

    @property
    def xp(self):
        """The array module of this device: ``numpy`` or ``cupy``."""
        if not self.is_cuda:
            import numpy

            return numpy
        import cupy

        return cupy


CPU = Device("cpu")


def parse_device(device) -> tuple:
    """Check a device name without touching any GPU.

    Parameters
    ----------
    device : str or Device

    Returns
    -------
    (str, int or None)
        ``("auto" | "cpu" | "cuda", index)``; ``"gpu"`` is read as ``"cuda"``.

    Raises
    ------
    ValueError
        Anything but the names in the module docstring.
    """
    if isinstance(device, Device):
        return device.kind, device.index
    match = _DEVICE_RE.match(device.strip().lower()) if isinstance(device, str) else None
    if match is None:
        raise ValueError(f"device must be one of {DEVICE_NAMES}, got {device!r}")
    kind, index = match.group(1), match.group(2)
    if kind in ("auto", "cpu") and index is not None:
        raise ValueError(f"device must be one of {DEVICE_NAMES}, got {device!r}")
    return ("cuda" if kind == "gpu" else kind), (None if index is None else int(index))


def resolve_device(device="auto") -> Device:
    """Turn a user's device choice into a :class:`Device`.

    Parameters
    ----------
    device : str or Device
        See the module docstring.

    Returns
    -------
    Device

    Raises
    ------
    ValueError
        An unknown name, or a CUDA device number the machine does not have.
    RuntimeError
        A GPU asked for and none is usable.
    """
    kind, index = parse_device(device)
    if kind == "cpu":
        return CPU
    if kind == "auto":
        if not gpu_available():
            return CPU
    else:
        require_gpu(f"device={str(device)!r}")
    import cupy

    if index is None:
        index = cupy.cuda.runtime.getDevice()
    count = cupy.cuda.runtime.getDeviceCount()
    if not 0 <= index < count:
        raise ValueError(f"device {device!r}: there is no CUDA device {index} "
                         f"(this machine has {count}: cuda:0 .. cuda:{count - 1})")
    return Device("cuda", index)


def device_memory_info(device="cuda") -> dict:
    """Memory of a CUDA device and of CuPy's memory pool on it, in bytes.

    Returns
    -------
    dict
        ``{"device_id", "name", "free", "total", "pool_used", "pool_total"}``.

    Raises
    ------
    RuntimeError
        No GPU is usable.
    """
    dev = resolve_device(device)
    if not dev.is_cuda:
        raise ValueError("device_memory_info() needs a CUDA device")
    import cupy

    with dev.use():
        free, total = cupy.cuda.runtime.memGetInfo()
        pool = cupy.get_default_memory_pool()
        used, pool_total = pool.used_bytes(), pool.total_bytes()
    return {
        "device_id": dev.index,
        "name": device_name(dev),
        "free": int(free),
        "total": int(total),
        "pool_used": int(used),
        "pool_total": int(pool_total),
    }


def device_name(device="auto") -> str:
    """A readable name: the GPU's product name, or ``"cpu"``."""
    dev = resolve_device(device)
    if not dev.is_cuda:
        return "cpu"
    return _gpu_product_name(dev.index)


@functools.lru_cache(maxsize=None)
def _gpu_product_name(index: int) -> str:
    # asked once per GPU and process: getDeviceProperties takes about a
    # millisecond, and a batch names the GPU in every mesh's record
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(index)["name"]
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


@functools.lru_cache(maxsize=None)
def multiprocessors(index: int) -> int:
    """GPU ``index``'s multiprocessor count, asked once per GPU and process
    (CuPy's ``Device.attributes`` asks the driver for every attribute: tens
    of microseconds in each build that launches a grid sized from it)."""
    import cupy

    runtime = cupy.cuda.runtime
    return int(runtime.deviceGetAttribute(runtime.cudaDevAttrMultiProcessorCount, index))


@functools.lru_cache(maxsize=None)
def cooperative_launch(index: int) -> bool:
    """Whether GPU ``index`` runs cooperative launches (grid-wide barriers),
    asked once per GPU and process; nothing is compiled."""
    import cupy

    runtime = cupy.cuda.runtime
    return bool(runtime.deviceGetAttribute(runtime.cudaDevAttrCooperativeLaunch, index))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
