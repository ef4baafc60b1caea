"""Backend selection: is a GPU usable, which array module, host/device moves.

This is the one place that decides between the CuPy (GPU) and the NumPy (CPU)
backend. Importing it never imports CuPy; CuPy is imported the first time a
GPU is asked about, and a missing or broken CUDA setup is turned into a
``False`` from :func:`gpu_available` and a one-line ``RuntimeError`` from
:func:`require_gpu`, never into an ``ImportError`` at ``import kdtree_gpu``.
"""

from __future__ import annotations

import functools
import sys
from typing import Optional

import numpy as np

DEVICE_CHOICES = ("auto", "cuda", "gpu", "cpu")
INSTALL_HINT = "pip install kdtree-gpu[cuda13] (or kdtree-gpu[cuda12] for a CUDA 12 driver)"

# Why the GPU is not usable (None while usable or not yet probed).
_unavailable_reason: Optional[str] = None


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    """Whether GPU work can run: CuPy imports, a device exists, the driver works.

    The probe runs once per process (the answer is cached) and never raises.
    It allocates one small array on device 0, so a driver that is installed but
    unusable (version too old, no permission on ``/dev/nvidia*``) counts as
    unavailable.

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
        # a real allocation and kernel launch: catches a driver that lists devices
        # but cannot create a context
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
        The work that needs the GPU, e.g. ``"the GPU builder"``; it starts the
        message.

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


def is_device_array(a) -> bool:
    """Whether ``a`` is a CuPy array (without importing CuPy when it is not loaded).

    Parameters
    ----------
    a : object

    Returns
    -------
    bool
    """
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(a, cupy.ndarray)


def get_xp(*arrays):
    """Array module (``numpy`` or ``cupy``) of the given arrays.

    Parameters
    ----------
    *arrays : array_like or None
        ``None`` entries are ignored. Scalars and lists count as host data.

    Returns
    -------
    module
        ``cupy`` when any array is a CuPy array, else ``numpy``.

    Raises
    ------
    TypeError
        CuPy and NumPy arrays mixed in one call (a hidden transfer would
        follow; move the data explicitly instead).
    """
    num_device = sum(1 for a in arrays if is_device_array(a))
    if num_device == 0:
        return np
    num_host = sum(1 for a in arrays if isinstance(a, np.ndarray))
    if num_host:
        raise TypeError(
            f"mixed CuPy and NumPy arrays ({num_device} on the device, {num_host} on the host); "
            "move them to one side first (cupy.asarray or kdtree_gpu.backend.to_host)"
        )
    return sys.modules["cupy"]


def to_host(a):
    """Return ``a`` as a NumPy array (a copy from the device for CuPy arrays).

    Parameters
    ----------
    a : array_like or None

    Returns
    -------
    numpy.ndarray or None
    """
    if a is None:
        return None
    if is_device_array(a):
        return a.get()
    return np.asarray(a)


def to_device(a):
    """Return ``a`` as a CuPy array on the current device (no copy if it is one).

    Raises
    ------
    RuntimeError
        No GPU is usable (see :func:`require_gpu`).
    """
    if is_device_array(a):
        return a
    require_gpu("moving data to the GPU")
    import cupy

    return cupy.asarray(a)


def resolve_device(device: str) -> str:
    """Turn a user's device choice into ``"cuda"`` or ``"cpu"``.

    Parameters
    ----------
    device : {"auto", "cuda", "gpu", "cpu"}
        ``"auto"`` picks ``"cuda"`` when :func:`gpu_available`, else ``"cpu"``.
        Case is ignored.

    Returns
    -------
    str
        ``"cuda"`` or ``"cpu"``.

    Raises
    ------
    ValueError
        Any other value.
    RuntimeError
        ``"cuda"``/``"gpu"`` asked for and no GPU is usable.
    """
    if not isinstance(device, str) or device.lower() not in DEVICE_CHOICES:
        raise ValueError(f"device must be one of {DEVICE_CHOICES}, got {device!r}")
    device = device.lower()
    if device == "cpu":
        return "cpu"
    if device == "auto":
        return "cuda" if gpu_available() else "cpu"
    require_gpu(f"device={device!r}")
    return "cuda"


def device_memory_info() -> dict:
    """Memory of the current CUDA device and of CuPy's memory pool, in bytes.

    Returns
    -------
    dict
        ``{"device_id", "name", "free", "total", "pool_used", "pool_total"}``.

    Raises
    ------
    RuntimeError
        No GPU is usable.
    """
    require_gpu("device_memory_info()")
    import cupy

    device = cupy.cuda.Device()
    free, total = cupy.cuda.runtime.memGetInfo()
    props = cupy.cuda.runtime.getDeviceProperties(device.id)
    name = props["name"]
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    pool = cupy.get_default_memory_pool()
    return {
        "device_id": int(device.id),
        "name": str(name),
        "free": int(free),
        "total": int(total),
        "pool_used": int(pool.used_bytes()),
        "pool_total": int(pool.total_bytes()),
    }


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
