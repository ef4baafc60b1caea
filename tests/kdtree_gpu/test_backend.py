"""Backend selection without and with a GPU."""

import numpy as np
import pytest

from kdtree_gpu import backend
from kdtree_gpu.backend import gpu_available

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")
no_gpu = pytest.mark.skipif(gpu_available(), reason="needs a machine without a usable GPU")


def test_gpu_available_is_a_cached_bool():
    first = backend.gpu_available()
    assert isinstance(first, bool)
    assert backend.gpu_available() is first
    assert (backend.unavailable_reason() is None) == first


def test_resolve_device_choices():
    assert backend.resolve_device("cpu") == "cpu"
    assert backend.resolve_device("CPU") == "cpu"
    assert backend.resolve_device("auto") == ("cuda" if gpu_available() else "cpu")
    for bad in ("tpu", "", None, 0):
        with pytest.raises(ValueError, match="device must be one of"):
            backend.resolve_device(bad)


@no_gpu
@pytest.mark.parametrize("device", ["cuda", "gpu"])
def test_resolve_device_without_gpu_says_why_and_how(device):
    with pytest.raises(RuntimeError) as info:
        backend.resolve_device(device)
    message = str(info.value)
    assert "needs a CUDA GPU" in message and "kdtree-gpu[cuda13]" in message
    assert "\n" not in message


@no_gpu
def test_require_gpu_and_memory_info_without_gpu():
    with pytest.raises(RuntimeError, match="the GPU builder needs a CUDA GPU"):
        backend.require_gpu("the GPU builder")
    with pytest.raises(RuntimeError, match="device_memory_info"):
        backend.device_memory_info()


def test_host_arrays():
    a = np.arange(3)
    assert backend.get_xp(a) is np
    assert backend.get_xp(a, None, [1, 2]) is np
    assert backend.get_xp() is np
    assert not backend.is_device_array(a)
    assert not backend.is_device_array([1, 2])
    assert backend.to_host(a) is a
    assert backend.to_host(None) is None
    assert backend.to_host([1, 2]).tolist() == [1, 2]


@pytest.mark.gpu
@needs_gpu
def test_device_arrays():
    import cupy

    d = cupy.arange(4)
    assert backend.is_device_array(d)
    assert backend.get_xp(d) is cupy
    assert backend.get_xp(d, None) is cupy
    with pytest.raises(TypeError, match="mixed CuPy and NumPy"):
        backend.get_xp(d, np.arange(4))
    h = backend.to_host(d)
    assert isinstance(h, np.ndarray) and h.tolist() == [0, 1, 2, 3]
    assert backend.to_device(d) is d
    assert backend.to_device(h).get().tolist() == [0, 1, 2, 3]
    assert backend.resolve_device("gpu") == "cuda"
    info = backend.device_memory_info()
    assert 0 < info["free"] <= info["total"]
    assert info["name"]
