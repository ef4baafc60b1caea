"""kdtree_gpu.device: the GPU's product name, asked of the driver once per GPU."""

from __future__ import annotations

import sys
import types

import pytest

from kdtree_gpu import device


@pytest.fixture
def fresh_names():
    device._gpu_product_name.cache_clear()
    yield
    device._gpu_product_name.cache_clear()  # no stand-in's name outlives the test


def test_a_gpu_product_name_is_asked_once_per_gpu(monkeypatch, fresh_names):
    # a stand-in CuPy that counts the driver calls (this machine may have no GPU)
    asked = []

    def properties(index):
        asked.append(index)
        return {"name": b"Stand-in GPU %d" % index}

    runtime = types.SimpleNamespace(getDeviceProperties=properties)
    monkeypatch.setitem(sys.modules, "cupy",
                        types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime)))
    names = [device._gpu_product_name(i) for i in (0, 0, 1, 0, 1)]
    assert names == ["Stand-in GPU 0", "Stand-in GPU 0", "Stand-in GPU 1", "Stand-in GPU 0",
                     "Stand-in GPU 1"]
    assert asked == [0, 1]


def test_cpu_is_named_cpu():
    assert device.device_name("cpu") == "cpu"


@pytest.mark.gpu
def test_device_name_is_the_driver_s_name(fresh_names):
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    assert device.device_name("cuda:0") == device.device_name("gpu") == name
