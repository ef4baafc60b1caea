"""The build's device memory (kdtree_gpu/builder/gpu/workspace.py).

What a GPU build leaves behind is its result and nothing else of size: the
workspace pool is empty after every build (levels in the loop, relaunched
loops, levels by stages), and the caller's pool holds the tree, its layout,
the mesh and small cached blocks. Trees stay identical to the reference.
"""

import numpy as np
import pytest

import cpu_reference
import kdtree_gpu as kd
from kdtree_gpu.builder import GpuSettings
from kdtree_gpu.builder.gpu.output import VIEW_SLACK
from kdtree_gpu.builder.gpu.workspace import ALIGN, size_class
from kdtree_gpu.testing.meshes import assert_same_tree, soup, tight_loop_capacity

gpu = pytest.mark.gpu


@pytest.mark.parametrize("n", [1, 100, 511, 512, 513, 4 << 20, (4 << 20) + 1, 10 ** 9 + 7,
                               3 * 2 ** 33])
def test_size_classes_round_up_by_at_most_a_ninth(n):
    size = size_class(n)
    assert size >= n and size % 512 == 0
    if n > 1 << 16:
        assert size <= n * 1.0906 + 512
    # a size of a class is its own class: a freed block serves its class again
    assert size_class(size) == size


def test_size_class_table_is_the_search():
    # size_class looks sizes up in a table up to 2**48 bytes and searches beyond
    # it: both give the smallest class size that holds n
    from kdtree_gpu.builder.gpu.workspace import _class_size

    rng = np.random.default_rng(5)
    for n in [*rng.integers(1, 1 << 48, 2000), 1 << 48, (1 << 48) + 1, 1 << 50]:
        n = int(n)
        k = max(0, int(np.floor(8 * np.log2(n))) - 2)
        while _class_size(k) < n:
            k += 1
        assert size_class(n) == _class_size(k), n


def test_size_classes_are_monotone():
    sizes = np.unique(np.geomspace(1, 1e12, 4000).astype(np.int64))
    classes = [size_class(int(n)) for n in sizes]
    assert classes == sorted(classes)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_workspace_block_setting_is_checked(bad):
    with pytest.raises(ValueError, match="workspace_block"):
        GpuSettings(workspace_block=bad)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "256"])
def test_workspace_budget_setting_is_checked(bad):
    with pytest.raises(ValueError, match="workspace_budget"):
        GpuSettings(workspace_budget=bad)
    assert GpuSettings(workspace_budget=0).workspace_budget == 0  # (0: trim at every new mark)


@pytest.mark.parametrize("bad", [1, 0, "yes", None])
def test_keep_workspace_setting_is_checked(bad):
    with pytest.raises(ValueError, match="keep_workspace"):
        GpuSettings(keep_workspace=bad)


class _FakePool:
    """The two numbers of a CuPy pool that the workspace's rule reads, and its trim."""

    def __init__(self, used, cached):
        self.used, self.cached, self.trims = used, cached, 0

    def total_bytes(self):
        return self.used + self.cached

    def free_bytes(self):
        return self.cached

    def free_all_blocks(self):
        self.trims += 1
        self.cached = 0


def _fake_workspace(**fields):
    """The fields ``Workspace.before_device_allocation`` reads, over three fake pools
    (180 bytes held, 70 of them cached)."""
    from types import SimpleNamespace

    pools = (_FakePool(100, 50), _FakePool(10, 0), _FakePool(0, 20))
    ws = SimpleNamespace(pools=pools, **fields)
    ws.footprint = lambda: sum(p.total_bytes() for p in pools)
    return ws, pools


@pytest.mark.parametrize("keep", [False, True])
def test_cached_blocks_go_back_only_before_an_allocation_that_would_raise_the_peak(keep):
    from kdtree_gpu.builder.gpu.workspace import Workspace

    ws, pools = _fake_workspace(keep=keep, high_water=300, budget=0)
    # 180 held (70 of them cached): below the mark, nothing goes back
    Workspace.before_device_allocation(ws)
    assert [p.trims for p in pools] == [0, 0, 0] and ws.high_water == 300
    # a request the pool already counts takes the footprint past the mark
    pools[1].used += 200
    Workspace.before_device_allocation(ws)
    if keep:  # (a kept workspace gives nothing back; the mark still follows)
        assert [p.trims for p in pools] == [0, 0, 0] and ws.high_water == 380
    else:
        assert [p.trims for p in pools] == [1, 1, 1] and ws.high_water == 310
    # with nothing cached, a new peak is only recorded
    pools[0].used += 500
    Workspace.before_device_allocation(ws)
    assert ws.high_water == ws.footprint()
    assert pools[0].trims == (0 if keep else 1)


def test_cached_blocks_stay_while_the_footprint_is_within_the_budget():
    from kdtree_gpu.builder.gpu.workspace import Workspace

    ws, pools = _fake_workspace(keep=False, high_water=100, budget=400)
    # 180 held: past the mark, within the budget: kept, and the mark follows
    Workspace.before_device_allocation(ws)
    assert [p.trims for p in pools] == [0, 0, 0] and ws.high_water == 180
    # past both: the cached blocks go back first
    pools[1].used += 300
    Workspace.before_device_allocation(ws)
    assert [p.trims for p in pools] == [1, 1, 1] and ws.high_water == 410


@pytest.mark.parametrize("keep", [False, True])
def test_room_is_made_only_for_an_allocation_that_would_raise_the_peak(keep):
    from kdtree_gpu.builder.gpu.workspace import Workspace

    ws, pools = _fake_workspace(keep=keep, high_water=300, budget=0)
    ws.trim = lambda: [p.free_all_blocks() for p in pools]
    # 180 held (70 of them cached) and 120 more: at the mark, nothing goes back
    Workspace.make_room(ws, 120)
    assert [p.trims for p in pools] == [0, 0, 0]
    # 121 more would pass it: the cached blocks go back first (unless kept)
    Workspace.make_room(ws, 121)
    assert [p.trims for p in pools] == ([0, 0, 0] if keep else [1, 1, 1])
    assert ws.high_water == 300  # (the allocation itself records its footprint)
    # within the budget, nothing goes back
    ws, pools = _fake_workspace(keep=keep, high_water=100, budget=400)
    ws.trim = lambda: [p.free_all_blocks() for p in pools]
    Workspace.make_room(ws, 200)
    assert [p.trims for p in pools] == [0, 0, 0]


def test_module_calls_reach_the_running_build_only():
    from kdtree_gpu.builder.gpu import workspace

    calls = []

    class Running:
        def make_room(self, nbytes):
            calls.append(("make_room", nbytes))

        def release_tree_blocks(self):
            calls.append(("release_tree_blocks",))

    workspace.make_room(64)  # no build running: nothing happens
    workspace.release_tree_blocks()
    assert calls == []
    workspace._active.workspace = Running()
    try:
        workspace.make_room(64)
        workspace.release_tree_blocks()
    finally:
        workspace._active.workspace = None
    assert calls == [("make_room", 64), ("release_tree_blocks",)]


@gpu
def test_pooled_routes_every_size_to_the_running_build_only():
    import cupy

    from kdtree_gpu.builder.gpu import workspace

    # outside a build: nothing changes
    with workspace.pooled():
        a = cupy.empty(100, dtype=np.int32)
    assert workspace.held_bytes() == 0
    del a
    with workspace.Workspace(cupy, 1 << 20) as ws:
        small = cupy.empty(1000, dtype=np.int32)
        assert ws.pool.used_bytes() == 0  # below min_block: the caller's
        with workspace.pooled():
            pooled = cupy.empty(1000, dtype=np.int32)
        assert ws.pool.used_bytes() >= pooled.nbytes
        after = cupy.empty(1000, dtype=np.int32)  # the context is left: the caller's again
        assert ws.pool.used_bytes() < pooled.nbytes + after.nbytes
        del small, pooled, after
    assert workspace.held_bytes() == 0


def _result_bytes(tree):
    from kdtree_gpu.trace.gpu import traversal_layout

    layout = traversal_layout(tree)
    names = ("node_axis", "node_split", "node_child", "node_count", "leaf_tris", "vertices",
             "faces")
    return sum(int(tree.device_array(name).nbytes) for name in names) + int(
        layout.nodes.nbytes) + int(layout.refs.nbytes) + int(layout.tris.nbytes)


@gpu
@pytest.mark.parametrize("settings", [
    GpuSettings(),
    GpuSettings(workspace_block=1),  # every allocation from the workspace
    GpuSettings(loop_capacity=tight_loop_capacity, workspace_block=1),  # the loop relaunched per level
    GpuSettings(level_loop=False, workspace_block=1),  # every level by stages
    GpuSettings(small_min_refs=0),  # small nodes deferred: the output in the workspace pool
    GpuSettings(small_min_refs=0, loop_capacity=tight_loop_capacity),  # and relaunched
    # the first levels by stages, then the loop from a level moved aside (at
    # small_refs=64 the stages would defer every node of that level themselves)
    GpuSettings(loop_max_events=4096, workspace_block=1, small_min_refs=0, small_refs=8),
], ids=["default", "all-workspace", "relaunched", "stages", "deferred", "deferred-relaunched",
        "stages-then-loop"])
def test_a_build_leaves_its_result_and_gives_the_workspace_back(settings):
    import cupy

    from kdtree_gpu.builder.gpu import workspace

    V, F = soup(np.random.default_rng(7), 3000, scale=0.02)
    pool = cupy.get_default_memory_pool()
    kd.build(V, F, device="cuda", settings=settings)  # compile, warm the pool
    pool.free_all_blocks()
    before = pool.used_bytes()
    tree = kd.build(V, F, device="cuda", settings=settings)
    cupy.cuda.Device().synchronize()
    assert workspace.held_bytes() == 0
    result = _result_bytes(tree)
    # in use in the caller's pool: the tree, its layout and the mesh (each
    # array rounded up to the pool's 512-byte unit), small records, and the
    # tail of tree arrays kept as views of their output buffers; no level buffer
    assert 0 <= pool.used_bytes() - before - result <= (1 << 16) + VIEW_SLACK
    # the peak counts the result and the level buffers (several times the
    # result on this scene, far less than a hundred)
    assert result < tree.build_info["peak_device_bytes"] < 100 * result
    assert_same_tree(cpu_reference.build(V, F), tree)
    if settings.loop_max_events == 4096:
        info = tree.build_info
        assert info["stage_levels"] and info["loop_launches"] >= 1


@gpu
def test_a_level_moved_aside_is_a_copy_in_the_second_pool_that_goes_back():
    import cupy

    from kdtree_gpu.builder.gpu import workspace
    from kdtree_gpu.builder.gpu.level_loop import moved_aside
    from kdtree_gpu.builder.soa import EventSoA, NodeSoA, RefSoA

    rng = np.random.default_rng(3)
    with workspace.Workspace(cupy, 1) as ws:
        events = EventSoA(cupy.asarray(rng.random(1000, dtype=np.float32)),
                          cupy.asarray(rng.integers(0, 3, 1000).astype(np.int8)),
                          cupy.arange(1000, dtype=np.int32), cupy.zeros(1000, dtype=np.int32))
        refs = RefSoA(cupy.arange(300, dtype=np.int32), cupy.zeros(300, dtype=np.int32))
        big = cupy.arange(100, dtype=np.int64)
        nodes = NodeSoA(cupy.ones((7, 3), dtype=np.float32), cupy.full((7, 3), 2, np.float32),
                        big[:8], big[10:32])  # views, as the stages leave them
        moved = moved_aside(cupy, ws, events, refs, nodes)
        for before, after in zip([*events.args(), *refs.args(), *nodes.args()],
                                 [*moved[0].args(), *moved[1].args(), *moved[2].args()]):
            assert after.shape == before.shape and after.dtype == before.dtype
            assert bool((after == before).all())
        held = ws.aside_pool.used_bytes()
        assert held >= sum(a.nbytes for g in moved for a in g.args())
        # a level without stored segments (from the loop's buffers) moves without them
        loop_level = moved_aside(cupy, ws, EventSoA(*events.args()[:3], None), refs, nodes)
        assert loop_level[0].event_seg is None
        assert bool((loop_level[0].event_ref == events.event_ref).all())
        del loop_level
        assert ws.footprint() >= ws.pool.total_bytes() + held
        del moved, events, refs, nodes, big, after, before
        ws.trim()
        assert ws.aside_pool.total_bytes() == 0
    assert workspace.held_bytes() == 0


class _HostBlocks:
    """A stand-in for CuPy's allocation and ndarray over host bytes (the layout is
    arithmetic on addresses; the GPU test below checks it on the device)."""

    class Pointer:
        def __init__(self, data, offset=0):
            self.data, self.offset = data, offset
            self.ptr = 1 << 40 | offset  # a device-like address: base + offset

        def __add__(self, offset):
            return type(self)(self.data, self.offset + offset)

    def __init__(self):
        import types

        self.cuda = types.SimpleNamespace(alloc=lambda n: self.Pointer(bytearray(n)))

    @staticmethod
    def ndarray(shape, dtype, memptr):
        count = int(np.prod(shape))
        return np.frombuffer(memptr.data, dtype=dtype, count=count,
                             offset=memptr.offset).reshape(shape)


def test_arrays_cut_from_one_block_are_aligned_disjoint_and_shaped():
    # (NumPy stands in for CuPy: outside a build, pooled() changes nothing)
    from kdtree_gpu.builder.gpu.workspace import aligned_offsets, arrays_in_one_block

    assert aligned_offsets([1, ALIGN, 0, 3]) == ([0, ALIGN, 2 * ALIGN, 2 * ALIGN], 3 * ALIGN)
    assert aligned_offsets([]) == ([], ALIGN)
    fields = [((5,), np.int8), ((3, 4), np.float32), ((0,), np.int64), ((7,), np.int64)]
    arrays = arrays_in_one_block(np, fields)
    assert [(a.shape, a.dtype) for a in arrays] == [(s, np.dtype(d)) for s, d in fields]
    base = arrays[0].ctypes.data
    assert all(a.base is arrays[0].base for a in arrays)  # one block
    held = [a for a in arrays if a.size]  # (an empty view's address means nothing)
    for a, b in zip(held, held[1:]):
        assert (b.ctypes.data - base) % ALIGN == 0 and a.ctypes.data + a.nbytes <= b.ctypes.data
    for i, a in enumerate(arrays):
        a[...] = i
    assert [int(a.sum()) for a in arrays] == [0, 12, 0, 21]


@pytest.mark.parametrize("cap_new", [0, 400])
def test_a_block_layout_gives_aligned_disjoint_fields_and_their_structs(cap_new):
    from kdtree_gpu.builder.gpu.level_loop import LevelBuffers
    from kdtree_gpu.builder.soa import EventSoA, LevelScratch, NodeSoA, RefSoA

    buffers = LevelBuffers(_HostBlocks(), 1000, 300, 50, cap_new)
    groups = [buffers.events, buffers.refs, buffers.nodes, buffers.scratch]
    assert [type(g) for g in groups] == [EventSoA, RefSoA, NodeSoA, LevelScratch]
    # each field has its declared shape: two levels of each capacity, the scratch rows
    assert buffers.events.event_pos.shape == (2000,) and buffers.refs.ref_tri.shape == (600,)
    assert buffers.nodes.node_lo.shape == (100, 3)
    assert buffers.nodes.seg_event_offset.shape == (2 * (6 * 50 + 1),)
    # the perfect splits' rows only when the loop clips (cap_new > 0)
    assert buffers.scratch.child_count.shape == ((8 * 50 + 2,) if cap_new else (0,))
    assert buffers.scratch.new_key.shape == (cap_new,)
    assert buffers.scratch.copy_lo.shape == ((6 * 300,) if cap_new else (0,))
    assert buffers.scratch.new_offset.shape == ((6 * 50 + 1,) if cap_new else (0,))
    # aligned, apart, inside the block
    spans = sorted((a.ctypes.data, a.nbytes) for g in groups for a in g.args())
    base = spans[0][0]
    for (start, nbytes), (next_start, _) in zip(spans, spans[1:]):
        assert (start - base) % ALIGN == 0 and start + nbytes <= next_start
    assert spans[-1][0] + spans[-1][1] - base <= buffers.block.layout.nbytes
    # the kernel structs: the block's address plus each field's offset, in declaration order
    for group, struct in zip(groups, buffers.structs()):
        addresses = np.frombuffer(struct.tobytes(), dtype=np.uint64)
        offsets = [a.ctypes.data - base for a in group.args()]
        assert addresses.tolist() == [(1 << 40) + o for o in offsets]


@gpu
@pytest.mark.parametrize("cap_new", [0, 400])
def test_a_level_loop_buffer_block_is_cut_into_aligned_arrays(cap_new):
    import cupy

    from kdtree_gpu.builder.gpu.level_loop import LevelBuffers

    buffers = LevelBuffers(cupy, 1000, 300, 50, cap_new)
    arrays = [*buffers.events.args(), *buffers.refs.args(), *buffers.nodes.args(),
              *buffers.scratch.args()]
    starts = sorted((a.data.ptr, a.nbytes) for a in arrays)
    for (ptr, nbytes), (next_ptr, _) in zip(starts, starts[1:]):
        assert ptr % ALIGN == 0 and ptr + nbytes <= next_ptr  # aligned, no overlap
    # the structs the kernel gets hold the views' addresses
    views = [buffers.events, buffers.refs, buffers.nodes, buffers.scratch]
    for group, struct in zip(views, buffers.structs()):
        assert np.frombuffer(struct.tobytes(), np.uint64).tolist() == [
            a.data.ptr for a in group.args()]
    # every array is usable: write each, read back
    for i, a in enumerate(arrays):
        a[...] = i % 2
    # (without clipping, the clipping fields and the child counts have no rows;
    # event_seg never has: the kernel derives the segments)
    assert all(int(a.max()) == i % 2 for i, a in enumerate(arrays) if a.size)
    assert buffers.events.event_seg.size == 0
    assert sum(a.size == 0 for a in arrays) == (1 if cap_new else 11)


@gpu
def test_carved_allocations_come_from_the_region_in_order_then_as_before():
    import cupy

    from kdtree_gpu.builder.gpu import workspace
    from kdtree_gpu.builder.gpu.level_loop import LevelBuffers

    buffers = LevelBuffers(cupy, 1000, 300, 50)
    start, nbytes = buffers.block.tail(1)  # the references onwards
    assert start.ptr == buffers.refs.ref_tri.data.ptr
    assert start.ptr + nbytes == buffers.block.memory.ptr + buffers.block.layout.nbytes
    with workspace.carved(cupy, start, nbytes):
        a = cupy.arange(100, dtype=np.int64)
        b = cupy.empty(10, dtype=np.int8)
        c = cupy.empty(nbytes, dtype=np.int8)  # does not fit: made as before
    assert a.data.ptr == start.ptr and b.data.ptr == start.ptr + ALIGN * 4
    assert not start.ptr <= c.data.ptr < start.ptr + nbytes
    assert int(a.sum()) == 4950
    d = cupy.empty(10, dtype=np.int8)  # after the context: as before
    assert not start.ptr <= d.data.ptr < start.ptr + nbytes


@gpu
def test_the_root_events_leave_the_loop_buffers_tail_free_for_their_sort():
    import cupy

    from kdtree_gpu.builder.gpu.level_loop import root_loop_buffers
    from kdtree_gpu.builder.settings import GpuSettings
    from kdtree_gpu.config import SAHConfig

    num_refs = 100_000
    num_events = 6 * num_refs
    buffers, events, (start, nbytes) = root_loop_buffers(
        cupy, SAHConfig(), GpuSettings(), num_events, num_refs, 0)
    # the root's events are the first slot's rows; the free part begins at the
    # second slot's event references and runs to the block's end
    for whole, root in zip(buffers.events.args()[:3], events.args()[:3]):
        assert root.data.ptr == whole.data.ptr and root.size == num_events
        assert root.data.ptr + root.nbytes <= start.ptr
    second = buffers.events.event_ref.data.ptr + 4 * buffers.cap_events
    assert second <= start.ptr < second + ALIGN and start.ptr % ALIGN == 0
    assert start.ptr + nbytes == buffers.block.memory.ptr + buffers.block.layout.nbytes
    # room for the keys and a radix sort's second buffer (8 bytes per event each)
    assert nbytes >= 2 * 8 * num_events


def test_an_out_of_memory_build_frees_its_arrays_before_the_caches(monkeypatch):
    # The failed build's frames hold its arrays while the error propagates: the
    # caches are released only once they are gone, so nothing stays cached.
    import types
    import weakref

    from kdtree_gpu.builder import api
    from kdtree_gpu.builder.gpu import workspace

    class OutOfMemory(Exception):
        pass

    freed_first = []
    arrays = []
    xp = types.SimpleNamespace(
        cuda=types.SimpleNamespace(memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemory)),
        get_default_memory_pool=lambda: types.SimpleNamespace(
            free_all_blocks=lambda: freed_first.append(arrays[0]() is None)))
    monkeypatch.setattr(workspace, "release_cached",
                        lambda: freed_first.append(arrays[0]() is None))

    class Array:
        pass

    def build():
        block = Array()
        arrays.append(weakref.ref(block))
        raise OutOfMemory("out of memory allocating 4,096 bytes")

    with pytest.raises(MemoryError, match="does not fit in GPU memory .out of memory allocating"):
        with api._out_of_memory_is_memory_error(xp, 7):
            build()
    assert freed_first == [True, True]


@gpu
def test_a_pool_limit_covers_the_workspace():
    import cupy

    V, F = soup(np.random.default_rng(3), 20000, scale=0.01)
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    pool.set_limit(size=4 << 20)  # the build holds about 7 MiB at its peak
    try:
        with pytest.raises(MemoryError, match="does not fit in GPU memory"):
            kd.build(V, F, device="cuda", settings=GpuSettings(workspace_block=1 << 20))
    finally:
        pool.set_limit(size=0)
    from kdtree_gpu.builder.gpu import workspace

    assert workspace.held_bytes() == 0
    tree = kd.build(V, F, device="cuda")
    assert_same_tree(cpu_reference.build(V, F), tree)


@gpu
def test_a_kept_workspace_serves_the_next_build_and_can_be_released():
    import cupy

    from kdtree_gpu.builder.gpu import workspace

    V, F = soup(np.random.default_rng(9), 3000, scale=0.02)
    keep = GpuSettings(keep_workspace=True, workspace_block=1 << 16)
    first = kd.build(V, F, device="cuda", settings=keep)
    cupy.cuda.Device().synchronize()
    held = workspace.held_bytes()
    assert held > 0
    # Later builds take their blocks from the kept ones; the pool's best fit
    # may split a larger block for a request the first build met with a new
    # one, so the set grows a little before it settles, and stays bounded.
    for _ in range(4):
        second = kd.build(V, F, device="cuda", settings=keep)
    assert held <= workspace.held_bytes() <= 3 * held
    assert second.compare(first) is None
    workspace.release_cached()
    assert workspace.held_bytes() == 0
    assert_same_tree(cpu_reference.build(V, F), second)
