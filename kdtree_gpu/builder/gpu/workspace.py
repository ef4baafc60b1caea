"""The build's device memory: large temporaries in a pool of their own, given back at the end.

CuPy's memory pool keeps every block a program frees, to hand it out again.
For a build that is the wrong policy twice over: its level buffers are
large and short-lived (a build would leave the process holding several
times the tree's size), and a level with one launch per stage allocates
arrays larger than every block it freed before, so the pool grows by the
sum of the levels instead of their maximum (measured on an H200 for a
5.5M-triangle mesh: 5.0 KB per triangle held after the build, 0.76 KB in
use at the peak).

:class:`Workspace` routes the build's allocations of at least
``GpuSettings.workspace_block`` bytes to a pool that only the builder uses
and that returns its memory to the device when the build ends, and before
a device allocation that would otherwise raise the build's peak
(:meth:`Workspace.before_device_allocation`). Smaller allocations (many,
cheap to keep, about a millisecond per build to make anew) and the tree
itself go to the caller's allocator (CuPy's default pool unless the caller
set another), as before; inside
:func:`pooled` every size goes to the workspace pool (the triangles' boxes,
the root level, the deferral records and the subtree stage's buffers, which
go back with the build; the children of a large level run by stages come
from a second pool, :meth:`Workspace.aside`, and the tree output's blocks
from a third, :func:`tree_blocks`), and :func:`carved` cuts a phase's
temporaries from a buffer not in use yet (the root's sort, from the level
loop's buffers). Between phases :meth:`Workspace.release_unused` gives the
blocks the next phase cannot use back to the device.

The footprint it reports (:attr:`Workspace.high_water`) is what the device
had to provide: the three pools' blocks (in use or cached) plus what
the caller's pool grew by since the build began, taken at each device
allocation of the three pools and sampled where the caller's pool may have
grown (after each launch of the level loop, after each level run by stages,
before memory is given back, at the end).
"""

from __future__ import annotations

import bisect
import contextlib
import math
import threading

import numpy as np

ALIGN = 256  # bytes: arrays cut from one block start at multiples of this

# (device id, kind) -> a workspace pool (kept: its cached blocks are what we free);
# kind "" is the build's pool, "aside" holds levels that outlive the blocks around them
# (Workspace.aside), "tree" the tree's output blocks (Workspace.tree_blocks)
_pools: dict = {}
_active = threading.local()  # the workspace of the build running on this thread, if any


def _aligned(nbytes: int) -> int:
    return -(-int(nbytes) // ALIGN) * ALIGN


def _class_size(k: int) -> int:
    return -(-math.ceil(2.0 ** (k / 8)) // 512) * 512


# every class size up to 2**48 bytes, ascending (size_class looks them up)
_CLASS_SIZES = [_class_size(k) for k in range(8 * 48)]


def size_class(nbytes: int) -> int:
    """The smallest of the sizes ``2**(k / 8)`` (steps of 9%, each rounded up to
    a multiple of 512 bytes) that holds ``nbytes``.

    Large workspace blocks are made in these sizes, so that a level a few
    percent larger than the one before fits in the blocks that one freed.
    (Looked up: a staged level makes dozens of workspace arrays, and the
    search below took 1.6 microseconds of host time each.)
    """
    nbytes = max(int(nbytes), 1)
    k = bisect.bisect_left(_CLASS_SIZES, nbytes)
    if k < len(_CLASS_SIZES):
        return _CLASS_SIZES[k]
    k = max(0, math.floor(8 * math.log2(nbytes)) - 2)
    while _class_size(k) < nbytes:
        k += 1
    return _class_size(k)


def device_pool(cp, kind: str = ""):
    """The workspace pool of the current device (made on first use); ``kind="aside"``:
    the pool of :meth:`Workspace.aside`. Its device allocations go through
    :meth:`Workspace.before_device_allocation` of the running build."""
    key = (cp.cuda.Device().id, kind)
    pool = _pools.get(key)
    if pool is None:
        device_malloc = cp.cuda.memory._malloc

        def malloc(size):
            # (the pool counts the request in its total_bytes before calling this)
            workspace = getattr(_active, "workspace", None)
            if workspace is not None:
                workspace.before_device_allocation()
            return device_malloc(size)

        pool = _pools[key] = cp.cuda.MemoryPool(malloc)
    return pool


def _running_context(name: str):
    """The context the running build's workspace makes with its method ``name``;
    outside a build, a context that changes nothing."""
    workspace = getattr(_active, "workspace", None)
    return getattr(workspace, name)() if workspace is not None else contextlib.nullcontext()


def lasting():
    """A context for arrays that outlive the build (caches kept across builds): the
    caller's allocator while a workspace is active, else nothing changes."""
    return _running_context("outputs")


def tree_blocks():
    """A context for the tree output's large blocks: the running build's tree pool
    (:meth:`Workspace.tree_blocks`); outside a build nothing changes."""
    return _running_context("tree_blocks")


def _on_running(method: str, *args) -> None:
    """Call the running build's :class:`Workspace` method ``method`` with ``args``;
    outside a build nothing happens."""
    workspace = getattr(_active, "workspace", None)
    if workspace is not None:
        getattr(workspace, method)(*args)


def make_room(nbytes: int) -> None:
    """:meth:`Workspace.make_room` of the running build; outside a build nothing
    happens."""
    _on_running("make_room", nbytes)


def release_tree_blocks() -> None:
    """Give the tree pool's free blocks back (the output's block it outgrew), if a
    build is running."""
    _on_running("release_tree_blocks")


def pooled():
    """A context in which the running build's allocations of every size come from
    its workspace pool; outside a build nothing changes.

    For the subtree stage's buffers and its growth of the tree: below
    ``min_block`` on small meshes, they would stay in the caller's pool
    after the build (or be cut there from blocks the build cannot give
    back); from the workspace pool they go back with the build. What
    outlives the build must then be copied out of them
    (:meth:`.output.TreeOutput.finish`).
    """
    return _running_context("every_size")


@contextlib.contextmanager
def carved(cp, memptr, nbytes: int):
    """A context in which allocations are cut, in order and aligned, from the
    ``nbytes`` at ``memptr`` while they last, then made as before.

    For temporaries that fit in a buffer not in use yet: the root's sort
    runs in the level loop's buffers before the loop does (its keys and the
    sort's own buffer would otherwise stay cached beside them: 97 bytes per
    triangle). Nothing is reused within the region; pointers into it keep
    ``memptr``'s memory.
    """
    outer = cp.cuda.get_allocator()
    taken = 0

    def malloc(size):
        nonlocal taken
        end = taken + _aligned(size)
        if end > nbytes:
            return outer(size)
        start, taken = taken, end
        return memptr + start

    with cp.cuda.using_allocator(malloc):
        yield


def release_cached() -> None:
    """Give every workspace pool's unused blocks back to the device (after an error)."""
    import cupy

    for (device, _), pool in _pools.items():
        with cupy.cuda.Device(device):
            pool.free_all_blocks()


def held_bytes() -> int:
    """Device bytes the workspace pools hold now (0 between builds)."""
    import cupy

    total = 0
    for (device, _), pool in _pools.items():
        with cupy.cuda.Device(device):
            total += pool.total_bytes()
    return total


class Workspace:
    """Allocations of a build: large ones from the workspace pool, the rest as the caller's.

    Use as a context manager around the build's temporaries; allocate what
    outlives the build inside :meth:`outputs`. Leaving the context gives the
    workspace's free blocks back to the device.
    """

    def __init__(self, cp, min_block: int, keep: bool = False, budget: int = 0):
        self.cp = cp
        self.pool = device_pool(cp)
        self.aside_pool = device_pool(cp, "aside")
        self.tree_pool = device_pool(cp, "tree")
        self.pools = (self.pool, self.aside_pool, self.tree_pool)  # the build's own
        self._aside = 0  # depth of aside() contexts
        self._tree = 0  # depth of tree_blocks() contexts
        self.min_block = int(min_block)
        self.keep = bool(keep)
        self.user = cp.cuda.get_allocator()
        owner = getattr(self.user, "__self__", None)
        # the caller's pool, when it is one CuPy can measure
        self.user_pool = owner if isinstance(owner, cp.cuda.MemoryPool) else None
        self.user_base = self.user_pool.total_bytes() if self.user_pool is not None else 0
        # (read once: the limit of the caller's pool is asked at every allocation)
        self.limit = self.user_pool.get_limit() if self.user_pool is not None else 0
        self.high_water = 0
        self.budget = int(budget)  # bytes the footprint may reach with blocks cached
        self._context = None
        self._every_size = 0  # depth of every_size() contexts
        self._count_read = None

    def _malloc(self, size: int):
        if self._aside:
            pool, size = self.aside_pool, size_class(size)
        elif size < self.min_block and not self._every_size:
            return self.user(size)
        elif self._tree:
            pool = self.tree_pool  # at its size: nothing else is cut from it
        else:
            pool, size = self.pool, size_class(size)
        limit = self.limit
        if limit and self._held() + size > limit:
            # A limit set on the caller's pool covers the build's workspace too.
            self.pool.free_all_blocks()
            if self._held() + size > limit:
                raise self.cp.cuda.memory.OutOfMemoryError(size, self._held(), limit)
        try:
            return pool.malloc(size)
        except self.cp.cuda.memory.OutOfMemoryError:
            if self.user_pool is None:
                raise
            # blocks the caller's pool keeps for later may be what is missing
            self.user_pool.free_all_blocks()
            return pool.malloc(size)

    def _held(self) -> int:
        return self.user_pool.total_bytes() + self._own_bytes()

    def _own_bytes(self) -> int:
        """Device bytes the build's own pools hold (in use or cached)."""
        return sum(pool.total_bytes() for pool in self.pools)

    def __enter__(self):
        self._context = self.cp.cuda.using_allocator(self._malloc)
        self._context.__enter__()
        _active.workspace = self
        return self

    def __exit__(self, *exc):
        _active.workspace = None
        self._context.__exit__(*exc)
        self._context = None
        if self.keep and exc[0] is None:
            self.sample()  # cached for the next build
        else:
            self.trim()
        return False

    @contextlib.contextmanager
    def _within(self, depth: str):
        """A context that counts itself in the attribute ``depth`` (contexts nest)."""
        setattr(self, depth, getattr(self, depth) + 1)
        try:
            yield self
        finally:
            setattr(self, depth, getattr(self, depth) - 1)

    def every_size(self):
        """A context in which allocations of every size come from the workspace pool."""
        return self._within("_every_size")

    def aside(self):
        """A context in which allocations of every size come from a second pool.

        For arrays that must outlive the blocks they were cut from: the pool
        splits its cached blocks, and a split block goes back to the device
        only once all its parts are free (CuPy's ``free_all_blocks``). The
        per-stage path makes each large level's children here
        (:meth:`begin_level`), and a level it hands to the level loop is
        copied here in one block, so that the blocks it was cut from go back
        before the loop's block is made (on an H100, 1.38M triangles: 214
        bytes per triangle of the footprint at the peak held no live array).
        """
        return self._within("_aside")

    def tree_blocks(self):
        """A context in which large allocations come from a third pool, the tree
        output's (:class:`.output.TreeOutput`): it grows by making a larger
        block and copying, and the block it outgrew, cached in the workspace
        pool, stayed there beside the next ones, since no array of a level
        has its size (H100, armadillo subdivided twice: four blocks, 192
        bytes per triangle of the footprint at the peak).
        :meth:`release_tree_blocks` gives the outgrown block back."""
        return self._within("_tree")

    def release_tree_blocks(self) -> None:
        """Give the tree pool's free blocks back (after the output grew)."""
        self.sample()
        self.tree_pool.free_all_blocks()

    def before_device_allocation(self) -> None:
        """A workspace pool is about to ask the device for a block (its total
        already counts it): if the footprint would then pass the build's
        high-water mark, the pools' unused blocks go back first, unless the
        build keeps them (``keep``). Then the mark takes the footprint.

        The pools keep what a level frees for the next levels, which mostly
        fit in it, and give it back only where it would raise the peak. They
        used to give everything back whenever a level of a larger size class
        began or the tree output grew (about once a level): on an H100,
        armadillo subdivided twice made 168 device allocations (11 GB) and
        35 trims a build, 34 ms of host time in cudaMalloc and cudaFree while
        the GPU waited, for a peak of 1.5 GB. Those trims kept the peak low
        (413 bytes per triangle without them, 283 with them); this one does
        the same where it matters, since the peak is a device allocation.
        Below the build's ``budget`` (``GpuSettings.workspace_budget`` bytes
        per triangle) they are kept: with nothing else to lift the mark,
        each trim gave back blocks the same level needed again, and the
        next allocation passed the mark anew (H100, armadillo subdivided
        twice, once the events' route scan was no longer stored: 46 trims
        and 293 device allocations a build, against 8 and 52).
        """
        footprint = self.footprint()
        if footprint <= max(self.high_water, self.budget):
            self.high_water = max(self.high_water, footprint)
            return
        if not self.keep and any(pool.free_bytes() for pool in self.pools):
            for pool in self.pools:
                pool.free_all_blocks()
        self.high_water = max(self.high_water, self.footprint())

    def make_room(self, nbytes: int) -> None:
        """Give the pools' unused blocks back before ``nbytes`` more are allocated,
        where holding them beside those bytes would pass the build's
        high-water mark (and its ``budget``), unless the build keeps them:
        for allocations :meth:`before_device_allocation` does not see (the
        caller's pool's), or that would be cut from a cached block and keep
        all of it alive. (The end of the subtree stage: its freed buffers
        stayed cached while the leaf packing's offsets were cut from them and
        the packed leaf list was made beside them, the peak of conference
        subdivided twice and of the bunny subdivided twice, H200: 406 and
        405 bytes per triangle.)"""
        if not self.keep and self.footprint() + int(nbytes) > max(self.high_water, self.budget):
            self.trim()

    def outputs(self):
        """A context in which allocations are the caller's (what the build returns)."""
        return self.cp.cuda.using_allocator(self.user)

    def footprint(self) -> int:
        """Device bytes held for the build now: the workspace pool's blocks and the
        caller's pool's growth since the build began."""
        grown = 0
        if self.user_pool is not None:
            grown = max(0, self.user_pool.total_bytes() - self.user_base)
        return self._own_bytes() + grown

    def count_read(self) -> CountRead:
        """The build's :class:`CountRead` (made on first use)."""
        if self._count_read is None:
            self._count_read = CountRead(self.cp)
        return self._count_read

    def sample(self) -> None:
        """Record the footprint (call where the build holds the most)."""
        self.high_water = max(self.high_water, self.footprint())

    def trim(self) -> None:
        """Give the workspace's unused blocks back to the device (synchronizes)."""
        self.sample()
        for pool in self.pools:
            pool.free_all_blocks()

    def release_unused(self) -> None:
        """Give the unused blocks back now, unless the build keeps them (``keep``):
        where a phase of the build ends whose blocks the next one cannot
        use (they would sit beside its buffers)."""
        if not self.keep:
            self.trim()

    def large(self, nbytes: int) -> bool:
        """Whether an allocation of ``nbytes`` comes from the workspace pool."""
        return int(nbytes) >= self.min_block

    def begin_level(self, num_items: int, itemsize: int = 8) -> bool:
        """A level run by stages, of ``num_items`` events, begins: whether it is
        large (its ``itemsize``-byte arrays per event come from the workspace
        pool).

        A large level's children (what outlives it) are made in the aside
        pool (:meth:`aside`), its temporaries in the workspace pool, so that
        no block holds parts of both: CuPy's pool cuts a new array from any
        free block large enough, and a block goes back only once all its
        parts are free. Cut from the blocks its parent's temporaries freed,
        each level's children held them beyond the level, and the next
        level's arrays needed new blocks beside them (H100, armadillo
        subdivided twice: 760 bytes per triangle at the peak). Both pools
        make blocks in size classes: the next level's arrays of the same
        classes take the blocks the last one freed (its temporaries; the
        children of the level before it); a level of a larger class makes
        new ones, and :meth:`before_device_allocation` gives the cached
        ones back first where they would raise the peak.
        """
        return self.large(int(num_items) * int(itemsize))


def uploaded(cp, host):
    """A device copy of a small host array (made with the current allocator),
    queued on the current stream without waiting for it.

    A copy from pageable memory first waits for the work queued before it
    (CUDA's rule for pageable uploads); from pinned memory it is queued like
    a launch (the subtree stage's counters, behind the tree's copy: about
    0.1 ms of host time on an H100).

    Returns
    -------
    (device array, pinned host array)
        Keep the second until the stream has passed the copy (a later read
        of the stream, or a synchronize).
    """
    import cupyx

    pinned = cupyx.empty_pinned(host.shape, dtype=host.dtype)
    pinned[...] = host
    device = cp.empty(host.shape, dtype=host.dtype)
    device.set(pinned, stream=cp.cuda.get_current_stream())
    return device, pinned


class CountRead:
    """A read of a few int64 counts into pinned host memory, queued on the
    current stream: the host waits for the work before the copy only, not
    for what is queued after it. One read at a time (the buffer is reused).
    """

    def __init__(self, cp, size: int = 8):
        import cupyx

        self.cp = cp
        self.host = cupyx.empty_pinned(size, dtype=np.int64)
        self.event = cp.cuda.Event(block=False, disable_timing=True)
        self.count = 0

    def start(self, device) -> None:
        """Queue the copy of ``device`` (int64, at most ``size`` counts)."""
        cp, n = self.cp, int(device.size)
        assert device.dtype == np.int64 and n <= self.host.size and device.flags.c_contiguous
        stream = cp.cuda.get_current_stream()
        cp.cuda.runtime.memcpyAsync(self.host.ctypes.data, device.data.ptr, 8 * n,
                                    cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        self.event.record(stream)
        self.count = n

    def result(self) -> list:
        """Wait for the copy; the counts as Python ints."""
        self.event.synchronize()
        return [int(c) for c in self.host[:self.count]]


def aligned_offsets(nbytes) -> tuple:
    """Where arrays of these byte sizes start when cut in order from one block,
    each at a multiple of :data:`ALIGN`: ``(offsets, the block's size)``."""
    offsets, end = [], 0
    for n in nbytes:
        offsets.append(end)
        end += _aligned(n)
    return offsets, max(end, ALIGN)


def arrays_in_one_block(cp, fields) -> list:
    """Arrays of the given ``(shape, dtype)``, cut in order from one device block
    made with the current allocator (inside :func:`pooled`: one workspace
    allocation, given back in one piece)."""
    sizes = [math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in fields]
    offsets, total = aligned_offsets(sizes)
    block = cp.empty(total, dtype=np.uint8)
    return [block[start:start + size].view(dtype).reshape(shape)
            for (shape, dtype), start, size in zip(fields, offsets, sizes)]


class BlockLayout:
    """Where the fields of some structures of arrays lie in one device block.

    The level-loop buffers live and die together: as one block they come
    from the workspace pool in one piece and go back to the device in one
    piece. The layout (each field's offset, aligned to :data:`ALIGN`) is
    computed once per set of sizes (the level loop keeps one per set of
    capacities); a block made from it gives each SoA's kernel struct as its
    base address plus the offsets (no array objects), and array views only
    where host code asks.

    Parameters
    ----------
    groups : sequence of (SoA class, {field name: (shape, dtype)})
        From :meth:`kdtree_gpu.soa.SoA.shapes`, in the order they are cut.
    """

    def __init__(self, groups):
        groups = [(cls, list(shapes.values())) for cls, shapes in groups]
        offsets, self.nbytes = aligned_offsets(
            math.prod(shape) * np.dtype(dtype).itemsize
            for _, fields in groups for shape, dtype in fields)
        self.groups = []  # (SoA class, [(shape, dtype, offset)], offsets as uint64)
        at = iter(offsets)
        for cls, fields in groups:
            fields = [(shape, dtype, next(at)) for shape, dtype in fields]
            self.groups.append((cls, fields, np.array([f[2] for f in fields], dtype=np.uint64)))

    def allocate(self, cp) -> "LaidOutBlock":
        """A device block of this layout (uninitialized)."""
        return LaidOutBlock(cp, self)


class LaidOutBlock:
    """One device block holding the structures of arrays of a :class:`BlockLayout`."""

    def __init__(self, cp, layout: BlockLayout):
        self.cp = cp
        self.layout = layout
        self.memory = cp.cuda.alloc(layout.nbytes)

    def struct(self, index: int):
        """The by-value kernel struct of group ``index`` (its fields' device addresses)."""
        cls, _, offsets = self.layout.groups[index]
        return cls.struct_of_addresses(offsets + offsets.dtype.type(self.memory.ptr))

    def tail(self, index: int, field: int = 0, skip: int = 0):
        """``(MemoryPointer, nbytes)``: the block from ``skip`` bytes into field
        ``field`` of group ``index`` (rounded up to :data:`ALIGN`, as every
        array cut from a block starts) to its end."""
        offset = _aligned(int(self.layout.groups[index][1][field][2]) + int(skip))
        return self.memory + offset, max(0, self.layout.nbytes - offset)

    def soa(self, index: int):
        """Group ``index`` as an SoA of CuPy views into the block."""
        cls, fields, _ = self.layout.groups[index]
        return cls(*(self.cp.ndarray(shape, dtype=dtype, memptr=self.memory + offset)
                     for shape, dtype, offset in fields))
