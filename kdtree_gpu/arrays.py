"""Arrays from the caller's library, and results back in it.

The public API accepts NumPy arrays (and anything ``numpy.asarray`` takes),
CuPy arrays, PyTorch tensors, and any GPU array that exposes
``__cuda_array_interface__`` (Numba, CuPy, PyTorch) or DLPack with a CUDA
device (JAX, PyTorch, CuPy). Host/device conversion happens here and
nowhere else: GPU inputs stay on their GPU (zero-copy views where the
library allows), and results go back to the caller in the library and on
the device of a template argument.

Importing this module never imports CuPy or PyTorch.
"""

from __future__ import annotations

import sys

import numpy as np

from .device import Device, require_gpu

# DLPack device types (dlpack.h): kDLCUDA and kDLCUDAManaged
_DLPACK_CUDA = (2, 13)


def library(x) -> str:
    """Which library an array belongs to.

    Returns
    -------
    str
        ``"cupy"``, ``"torch"``, ``"cuda"`` (another GPU array: it has
        ``__cuda_array_interface__`` or a CUDA DLPack device), or ``"numpy"``
        (NumPy and everything else, read with ``numpy.asarray``).
    """
    module = type(x).__module__
    if module.startswith("cupy"):
        return "cupy"
    if module.startswith("torch"):
        return "torch"
    if hasattr(x, "__cuda_array_interface__"):
        return "cuda"
    if hasattr(x, "__dlpack_device__") and not isinstance(x, np.ndarray):
        try:
            if int(x.__dlpack_device__()[0]) in _DLPACK_CUDA:
                return "cuda"
        except Exception:
            pass
    return "numpy"


def on_gpu(x) -> bool:
    """Whether ``x`` lives in GPU memory (CuPy, CUDA tensors, CUDA array interface, DLPack)."""
    kind = library(x)
    if kind == "torch":
        return bool(x.is_cuda)
    return kind in ("cupy", "cuda")


def is_device_array(a) -> bool:
    """Whether ``a`` is a CuPy array (without importing CuPy when it is not loaded)."""
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(a, cupy.ndarray)


def device_of(x):
    """The CUDA device holding ``x`` as a :class:`~kdtree_gpu.device.Device`, or ``None``."""
    kind = library(x)
    if kind == "cupy":
        return Device("cuda", int(x.device.id))
    if kind == "torch":
        return Device("cuda", int(x.device.index)) if x.is_cuda else None
    if kind == "cuda":
        if hasattr(x, "__dlpack_device__"):
            try:
                dev_type, dev_id = x.__dlpack_device__()
                if int(dev_type) in _DLPACK_CUDA:
                    return Device("cuda", int(dev_id))
            except Exception:
                pass
        import cupy

        return Device("cuda", int(cupy.asarray(x).device.id))
    return None


def get_xp(*arrays):
    """Array module (``numpy`` or ``cupy``) of the given arrays.

    Parameters
    ----------
    *arrays : array_like or None
        ``None`` entries are ignored. Scalars and lists count as host data.

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
            "move them to one side first (cupy.asarray or kdtree_gpu.arrays.to_numpy)")
    return sys.modules["cupy"]


def to_numpy(x):
    """``x`` as a NumPy array (a copy from the GPU for device arrays); ``None`` stays ``None``."""
    if x is None:
        return None
    kind = library(x)
    if kind == "cupy":
        return x.get()
    if kind == "torch":
        return x.detach().cpu().numpy()
    if kind == "cuda":
        return to_cupy(x).get()
    return np.asarray(x)


def to_cupy(x):
    """``x`` as a CuPy array: a zero-copy view of GPU arrays, an upload of host data.

    A GPU array stays on its own device; host data goes to CuPy's current
    device.

    Raises
    ------
    RuntimeError
        No GPU is usable.
    """
    kind = library(x)
    if kind == "cupy":
        return x
    require_gpu("moving data to the GPU")
    import cupy

    if kind == "torch":
        if x.is_cuda:
            return cupy.from_dlpack(x.detach())
        return cupy.asarray(x.detach().numpy())
    if kind == "cuda":
        if hasattr(x, "__cuda_array_interface__"):
            return cupy.asarray(x)
        return cupy.from_dlpack(x)
    return cupy.asarray(np.asarray(x))


def like(result, template):
    """``result`` (NumPy or CuPy) in the library and on the device of ``template``.

    NumPy templates get NumPy arrays; CuPy and other GPU arrays get CuPy
    arrays on the template's device; PyTorch tensors get tensors on the
    template's device (zero-copy from CuPy through DLPack).
    """
    kind = library(template)
    if kind == "numpy":
        return result.get() if library(result) == "cupy" else np.asarray(result)
    if kind in ("cupy", "cuda"):
        import cupy

        device = device_of(template)
        if library(result) == "cupy" and result.device.id == device.index:
            return result
        with device.use():
            return cupy.asarray(result)
    import torch

    if library(result) == "cupy":
        out = torch.from_dlpack(result)
    else:
        out = torch.from_numpy(np.ascontiguousarray(result))
    return out.to(template.device)
