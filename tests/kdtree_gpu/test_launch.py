"""Launch helper and profiler: bookkeeping on the CPU, real launches on a GPU."""

import sys
import time

import numpy as np
import pytest

from kdtree_gpu import launch as L
from kdtree_gpu import packed_launch as P
from kdtree_gpu.device import gpu_available

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")


class FakeKernel:
    name = "kd_fake"

    def __init__(self, fail=False):
        self.calls = []
        self.fail = fail

    def __call__(self, grid, block, args, shared_mem=0):
        if self.fail:
            raise ValueError("invalid argument")
        self.calls.append((grid, block, args, shared_mem))


def test_launch_computes_grid_and_skips_empty():
    k = FakeKernel()
    L.launch("fill", k, 1000, (1, 2))
    L.launch("fill", k, 256, (), block=128, shared_mem=64)
    L.launch("fill", k, 0, ())
    L.launch("fill", k, np.int64(1), ())
    assert [c[0] for c in k.calls] == [(4,), (2,), (1,)]
    assert k.calls[1][1:] == ((128,), (), 64)


def test_launch_rejects_bad_arguments_and_names_failures():
    k = FakeKernel()
    with pytest.raises(TypeError, match="host integer"):
        L.launch("fill", k, 3.0, ())
    with pytest.raises(ValueError, match="n must be >= 0"):
        L.launch("fill", k, -1, ())
    with pytest.raises(ValueError, match="block"):
        L.launch("fill", k, 5, (), block=2048)
    with pytest.raises(L.LaunchError, match="launch 'split events' \\(kernel kd_fake, n=5"):
        L.launch("split events", FakeKernel(fail=True), 5, ())


def test_profiling_off_records_nothing():
    assert L.active_profiler() is None
    with L.stage("sort", np):
        pass
    L.launch("fill", FakeKernel(), 10, ())
    assert L.active_profiler() is None
    # unobserved stages cost a shared do-nothing context, not a new one each
    assert L.stage("sort", np) is L.stage("emit")
    with L.profiling():
        assert L.stage("sort", np) is not L.stage("sort", np)


def test_cpu_stages_fill_the_profile_table():
    with L.profiling() as prof:
        assert L.active_profiler() is prof
        for _ in range(3):
            with L.stage("sort events", np):
                time.sleep(0.002)
        with L.stage("count", np):
            pass
        with L.profiling() as inner:
            with L.stage("inner", np):
                pass
        assert L.active_profiler() is prof
    assert L.active_profiler() is None
    stats = prof.as_dict()
    assert list(stats) == ["sort events", "count"]
    s = stats["sort events"]
    assert s["launches"] == 3
    assert s["min_ms"] <= s["avg_ms"] <= s["max_ms"]
    assert s["total_ms"] == pytest.approx(3 * s["avg_ms"])
    assert s["min_ms"] >= 1.5
    assert sum(v["share"] for v in stats.values()) == pytest.approx(1.0)
    assert list(inner.as_dict()) == ["inner"]
    table = prof.report()
    assert "sort events" in table and "launches" in table and "total" in table.splitlines()[-1]
    prof.reset()
    assert prof.as_dict() == {}


def test_nested_records_are_listed_but_not_totalled():
    with L.profiling() as prof:
        with L.stage("build level", np):
            with L.stage("sort", np):
                time.sleep(0.001)
            L.launch("fill", FakeKernel(), 0, ())  # n == 0: nothing recorded
        with L.stage("emit", np):
            pass
    stats = prof.as_dict()
    assert stats["sort"]["nested"] and not stats["build level"]["nested"]
    assert "fill" not in stats
    assert stats["build level"]["share"] + stats["emit"]["share"] == pytest.approx(1.0)
    assert prof.total_ms == pytest.approx(stats["build level"]["total_ms"] + stats["emit"]["total_ms"])
    assert "\n  sort" in prof.report()


def test_the_profile_keeps_every_time_in_order():
    prof = L.Profiler()
    for ms in (3.0, 1.0, 2.0):
        prof.add_time("level", ms, nested=True)
    prof.add_time("pack", 0.5)
    times = prof.times()
    assert times == {"level": [3.0, 1.0, 2.0], "pack": [0.5]}
    times["level"].append(9.0)  # a copy: the profile is unchanged
    assert prof.times()["level"] == [3.0, 1.0, 2.0]
    assert prof.as_dict()["level"]["launches"] == 3


def test_set_active_profiler_and_debug_switch():
    prof = L.Profiler()
    assert L.set_active_profiler(prof) is None
    try:
        with L.stage("a", np):
            pass
    finally:
        assert L.set_active_profiler(None) is prof
    assert prof.as_dict()["a"]["launches"] == 1
    before = L.debug_enabled()
    L.set_debug(True)
    try:
        assert L.debug_enabled()
        with L.stage("checked", np):  # no GPU work: nothing to synchronize
            pass
    finally:
        L.set_debug(before)


@pytest.mark.gpu
@needs_gpu
def test_gpu_launch_profile_and_debug():
    import cupy

    from kdtree_gpu.kernels import get_function

    kernel = get_function("primitives.cu", "kd_segmented_min_u32")
    n = 10000
    key = cupy.arange(n, 0, -1, dtype=cupy.int64).astype(cupy.uint32)
    segment = cupy.zeros(n, dtype=cupy.int32)
    out = cupy.full(1, 0xFFFFFFFF, dtype=cupy.uint32)
    with L.profiling() as prof:
        for _ in range(4):
            L.launch("segmented min", kernel, n, (key, segment, np.int64(n), out))
        with L.stage("cumsum", cupy):
            cupy.cumsum(key)
    assert int(out[0]) == 1
    stats = prof.as_dict()
    assert stats["segmented min"]["launches"] == 4
    assert stats["cumsum"]["launches"] == 1
    assert all(v["min_ms"] >= 0 for v in stats.values())
    L.set_debug(True)
    try:
        L.launch("segmented min", kernel, n, (key, segment, np.int64(n), out))
        with pytest.raises(L.LaunchError, match="launch 'bad block'"):
            L.launch("bad block", kernel, n, (key, segment, np.int64(n), out), block=1024,
                     shared_mem=1 << 30)
    finally:
        L.set_debug(False)


def _packed_oracle(parameters, values):
    """The parameters' bytes as NumPy lays out the aligned structs (the C layout)."""
    from kdtree_gpu.soa import struct_dtype

    dtypes = [(name, np.dtype(kind) if not hasattr(kind, "__dataclass_fields__")
               else struct_dtype(kind)) for name, kind in parameters]
    block = np.zeros(1, np.dtype(dtypes, align=True))
    it = iter(values)
    for name, dt in dtypes:
        block[name] = tuple(next(it) for _ in dt.names) if dt.names else next(it)
    return block.view(np.uint8), [block.dtype.fields[name][1] for name, _ in dtypes]


def mixed_parameters() -> tuple:
    """A parameter list with padding before a struct, between scalars and at the end,
    and values for it (struct fields flattened)."""
    from kdtree_gpu.trace.soa import HitSoA, RaySoA, TraceParams

    parameters = (("a", np.int8), ("p", TraceParams), ("b", np.int32), ("rays", RaySoA),
                  ("c", np.float64), ("hits", HitSoA), ("d", np.uint8))
    values = (-3, 0.5, -1.25, 2.0, 3.5, 4.0, 5.0, 0.125, 0.0, np.inf, 2_000_000_000_000,
              7, 11, 13, 0, 17, -2.5, *range(100, 107), 255)
    return parameters, values


def test_packed_launch_lays_parameters_out_as_the_c_structs():
    parameters, values = mixed_parameters()
    packed = P.PackedLaunch("kd_test", parameters)
    expected, offsets = _packed_oracle(parameters, values)
    assert packed.offsets == tuple(offsets)
    assert packed.pack(values).tobytes() == expected.tobytes()
    with pytest.raises(Exception):  # a value missing
        packed.pack(values[:-1])


def test_a_bound_launch_packs_its_fixed_values_once_and_the_rest_at_each_launch(monkeypatch):
    """Head packed into each thread's block once, tail at every launch: the block the
    driver gets equals the whole list packed at once, for every split point."""
    parameters, values = mixed_parameters()
    packed = P.PackedLaunch("kd_test", parameters)
    expected = packed.pack(values).tobytes()
    seen = []

    class Driver:
        @staticmethod
        def launchKernel(function, gx, gy, gz, bx, by, bz, shared, stream, address, extra):
            # the block is the uint8 array whose pointer table is at `address`
            seen.append(address)

    monkeypatch.setitem(sys.modules, P._DRIVER, Driver)
    for count in range(len(values) + 1):
        bound = packed.bound(values[:count])
        for _ in range(2):  # the second launch reuses the block with the head in it
            bound("test", function=1, n=10, block=4, values=values[count:], stream=0)
            data, _, address = bound._block()
            assert seen[-1] == address and data.tobytes() == expected, count
    with pytest.raises(ValueError, match="26 fixed values, the block holds 25"):
        packed.bound(values + (1,))


def test_packed_launch_reads_the_parameter_list_from_the_cuda_source():
    from kdtree_gpu.trace.soa import HitSoA, RaySoA, TraceParams

    packed = P.PackedLaunch.of_kernel("primitives.cu", "kd_segmented_min_u32")
    assert packed.parameters == (("key", np.uint64), ("segment", np.uint64), ("n", np.int64),
                                 ("segment_key", np.uint64))
    with pytest.raises(ValueError, match="'p' has type 'KdTraceParams'"):
        P.PackedLaunch.of_kernel("traverse.cu", "kd_trace", structs=(RaySoA, HitSoA))
    with pytest.raises(ValueError, match="no definition of kernel 'kd_nothing'"):
        P.PackedLaunch.of_kernel("traverse.cu", "kd_nothing", structs=(TraceParams,))


def test_packed_launch_skips_empty_launches():
    packed = P.PackedLaunch("kd_test", (("n", np.int64),))
    packed("nothing", function=0, n=0, block=128, values=(0,), stream=0)  # no driver call


@pytest.mark.gpu
@needs_gpu
def test_gpu_packed_launch_profile_and_debug():
    import cupy

    from kdtree_gpu.kernels import get_function_pointer

    function = get_function_pointer("primitives.cu", "kd_segmented_min_u32")
    packed = P.PackedLaunch.of_kernel("primitives.cu", "kd_segmented_min_u32")
    n = 10000
    key = cupy.arange(n, 0, -1, dtype=cupy.int64).astype(cupy.uint32)
    segment = cupy.zeros(n, dtype=cupy.int32)
    out = cupy.full(1, 0xFFFFFFFF, dtype=cupy.uint32)
    values = (key.data.ptr, segment.data.ptr, n, out.data.ptr)
    stream = cupy.cuda.get_current_stream().ptr
    packed("segmented min", function, n, 256, values, stream)
    assert int(out[0]) == 1  # the kernel read every parameter where the C signature has it
    out.fill(0xFFFFFFFF)
    with L.profiling() as prof:
        for _ in range(3):
            packed("segmented min", function, n, 256, values, stream)
    assert prof.as_dict()["segmented min"]["launches"] == 3 and int(out[0]) == 1
    out.fill(0xFFFFFFFF)
    again = packed.prepared(function, n, 256, values, stream)
    again()
    assert int(out[0]) == 1
    L.set_debug(True)
    try:
        with pytest.raises(L.LaunchError, match="launch 'bad block'"):
            packed("bad block", function, n, 4096, values, stream)
    finally:
        L.set_debug(False)
    packed("segmented min", function, n, 256, values, stream)  # the GPU is usable after it
    cupy.cuda.get_current_stream().synchronize()


def test_every_kernel_parameter_list_is_read_from_its_source():
    """Each kd_* kernel of every .cu file packs from its definition (the builder's too),
    a list shared through a macro of its file included."""
    import re

    from kdtree_gpu import kernels
    from kdtree_gpu.builder.soa import CUDA_STRUCTS as build_structs
    from kdtree_gpu.trace.soa import CUDA_STRUCTS as trace_structs

    structs = build_structs + trace_structs
    read, macro = 0, 0
    for path in kernels.cuda_sources():
        text = path.read_text()
        names = set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?"
                               r"(kd_\w+)\s*\(", text))
        for name in sorted(names):
            packed = P.PackedLaunch.of_kernel(path.name, name, structs=structs)
            offsets = packed.offsets
            assert len(offsets) == len(packed.parameters) >= 1, (path.name, name)
            assert all(a < b for a, b in zip(offsets, offsets[1:])), (path.name, name)
            read += 1
            macro += bool(re.search(r"\b" + name + r"\s*\(\s*KD_\w+_PARAMS\s*\)", text))
    assert read >= 46 and macro >= 4, (read, macro)
