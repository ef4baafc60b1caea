"""Structures of arrays: allocation, views, kernel arguments and their C structs."""

import dataclasses

import numpy as np
import pytest

from kdtree_gpu import kernels
from kdtree_gpu.builder.soa import CUDA_STRUCTS, EventSoA, LevelScratch, LoopSettings, NodeSoA
from kdtree_gpu.soa import cuda_struct, struct_dtype


def test_allocate_uses_each_fields_row_rule():
    nodes = NodeSoA.allocate(np, 4)
    assert nodes.node_lo.shape == (4, 3) and nodes.node_lo.dtype == np.float32
    assert nodes.node_ref_offset.shape == (5,)
    assert nodes.seg_event_offset.shape == (13,)
    assert nodes.size == 4
    assert NodeSoA.allocate(np, 4, seg_event_offset=0).seg_event_offset.shape == (0,)
    prefix = nodes.prefix(2)
    assert prefix.node_lo.shape == (2, 3) and prefix.seg_event_offset.shape == (7,)
    assert np.shares_memory(prefix.node_lo, nodes.node_lo)


def test_args_take_and_struct_follow_declaration_order():
    events = EventSoA.allocate(np, 5, zero=True)
    events.event_pos[:] = np.arange(5)
    assert [a is b for a, b in zip(events.args(), (events.event_pos, events.event_kind,
                                                   events.event_ref, events.event_seg))] == [True] * 4
    taken = events.take(np.array([4, 0]))
    assert taken.event_pos.tolist() == [4.0, 0.0]
    value = events.struct()
    # opaque bytes of the struct's size; read back through the struct's dtype
    assert value.shape == (1,) and value.dtype.kind == "V"
    fields = value.view(struct_dtype(EventSoA))
    assert fields.dtype.names == tuple(f.name for f in dataclasses.fields(EventSoA))
    assert int(fields["event_pos"][0]) == events.event_pos.ctypes.data
    assert int(fields["event_seg"][0]) == events.event_seg.ctypes.data


def test_scalar_struct_values_and_layout():
    settings = LoopSettings(max_level_events=7, max_depth=3, leaf_size=1, longest_only=1,
                            k_traversal=15.0, k_intersect=20.0, empty_bonus=0.8,
                            small_refs=4, clip_segment=9)
    value = settings.fields()
    dtype = struct_dtype(LoopSettings)
    assert value.dtype == dtype and dtype.isalignedstruct
    raw = settings.struct()
    assert raw.dtype.kind == "V" and raw.tobytes() == value.tobytes()
    assert dtype.fields["k_traversal"][1] % 8 == 0
    assert value["max_level_events"][0] == 7 and value["empty_bonus"][0] == 0.8
    assert value["small_refs"][0] == 4 and dtype.fields["small_refs"][1] % 8 == 0
    assert value["clip_segment"][0] == 9


def test_cuda_struct_text_checks_every_offset():
    text = cuda_struct(LevelScratch)
    assert text.startswith("struct KdLevelScratch {")
    assert "    unsigned long long* seg_argmin;" in text
    assert "    bool* node_split;" in text
    for f in dataclasses.fields(LevelScratch):
        assert f"__builtin_offsetof(KdLevelScratch, {f.name})" in text
    assert "double k_traversal;" in cuda_struct(LoopSettings)


def test_every_cuda_struct_is_in_the_preamble():
    preamble = kernels.cuda_preamble()
    for cls in CUDA_STRUCTS:
        assert f"struct {cls.c_name} {{" in preamble


@pytest.mark.skipif(kernels.find_nvcc() is None, reason="nvcc not installed")
def test_a_struct_that_disagrees_with_its_dtype_does_not_compile(tmp_path):
    # the static_asserts catch a C layout that differs from the NumPy dtype
    source = tmp_path / "bad_layout.cu"
    text = cuda_struct(LoopSettings).replace("double k_traversal;", "double k_traversal, extra;")
    source.write_text(text.replace("struct KdLoopSettings", "struct KdOther").replace(
        "KdLoopSettings", "KdOther") + 'extern "C" __global__ void kd_use(KdOther s) {}\n')
    failures = kernels.check_sources(sources=[source], ptx=True)
    assert "bad_layout.cu" in failures and "offset differs" in failures["bad_layout.cu"]
