"""Arrays from the caller's library and results back in it."""

import numpy as np
import pytest

from kdtree_gpu import arrays
from kdtree_gpu.device import Device, gpu_available

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")


def test_host_arrays():
    a = np.arange(3)
    assert arrays.library(a) == "numpy"
    assert arrays.library([1, 2]) == "numpy"
    assert not arrays.on_gpu(a)
    assert arrays.device_of(a) is None
    assert arrays.get_xp(a) is np
    assert arrays.get_xp(a, None, [1, 2]) is np
    assert arrays.get_xp() is np
    assert not arrays.is_device_array(a)
    assert arrays.to_numpy(a) is a
    assert arrays.to_numpy(None) is None
    assert arrays.to_numpy([1, 2]).tolist() == [1, 2]
    assert arrays.like(np.arange(2), a).tolist() == [0, 1]


def test_torch_cpu_tensors_are_host_arrays():
    torch = pytest.importorskip("torch")
    t = torch.arange(4, dtype=torch.float32)
    assert arrays.library(t) == "torch" and not arrays.on_gpu(t)
    assert arrays.to_numpy(t).tolist() == [0, 1, 2, 3]
    back = arrays.like(np.array([5.0], np.float32), t)
    assert isinstance(back, torch.Tensor) and back.tolist() == [5.0]


@pytest.mark.gpu
@needs_gpu
def test_device_arrays():
    import cupy

    d = cupy.arange(4)
    assert arrays.library(d) == "cupy" and arrays.on_gpu(d)
    assert arrays.is_device_array(d)
    assert arrays.device_of(d) == Device("cuda", d.device.id)
    assert arrays.get_xp(d) is cupy
    assert arrays.get_xp(d, None) is cupy
    with pytest.raises(TypeError, match="mixed CuPy and NumPy"):
        arrays.get_xp(d, np.arange(4))
    h = arrays.to_numpy(d)
    assert isinstance(h, np.ndarray) and h.tolist() == [0, 1, 2, 3]
    assert arrays.to_cupy(d) is d
    assert arrays.to_cupy(h).get().tolist() == [0, 1, 2, 3]
    assert arrays.like(h, d).device.id == d.device.id
    assert isinstance(arrays.like(d, h), np.ndarray)


class _CudaArrayInterface:
    """A foreign GPU array: only __cuda_array_interface__ (as Numba's device arrays)."""

    def __init__(self, base):
        self.base = base
        self.__cuda_array_interface__ = base.__cuda_array_interface__


@pytest.mark.gpu
@needs_gpu
def test_cuda_array_interface_is_zero_copy():
    import cupy

    base = cupy.arange(6, dtype=cupy.float32)
    foreign = _CudaArrayInterface(base)
    assert arrays.library(foreign) == "cuda" and arrays.on_gpu(foreign)
    view = arrays.to_cupy(foreign)
    assert view.data.ptr == base.data.ptr
    assert arrays.to_numpy(foreign).tolist() == [0, 1, 2, 3, 4, 5]
    assert isinstance(arrays.like(np.zeros(2), foreign), cupy.ndarray)


@pytest.mark.gpu
@needs_gpu
def test_torch_cuda_tensors_are_zero_copy():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    t = torch.arange(4, dtype=torch.float32, device="cuda")
    assert arrays.library(t) == "torch" and arrays.on_gpu(t)
    view = arrays.to_cupy(t)
    assert view.data.ptr == t.data_ptr()
    back = arrays.like(view * 2, t)
    assert isinstance(back, torch.Tensor) and back.is_cuda and back.tolist() == [0, 2, 4, 6]
