"""Order-keeping stream compaction of the queues (GAPT part 11, section 11.1, thread compaction).

On the GPU one compaction is two launches of the kernels in
``cuda/render.cu`` (:class:`Compactor`); its array-expression twin
(:func:`compact_rows_xp`) is :func:`kdtree_gpu.primitives.compact` applied
to every field of a queue. Both move the live rows of a queue to the front
of another buffer of the same type, in order; a row is live by the queue's
``live_field`` (a uint8 flag where nonzero, a float32 one where > 0).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..encoding import (COMPACT_BLOCK, COMPACT_FLAG_F32, COMPACT_FLAG_U8, COMPACT_MAX_FIELDS,
                        COMPACT_MAX_TILES)
from ..primitives import compact
from ..soa import SoA
from ..soa import _address  # the device (or host) address of an array
from .context import i32, launch_kernel

# Slots of the device counters written by the compaction kernel.
COUNTER_LIVE_PATHS = 0  # live paths after the last path compaction
COUNTER_SHADOW_RAYS = 1  # shadow rays after the last shadow-ray compaction
COUNTER_SHADOW_RAYS_TOTAL = 2  # shadow rays traced in this render
NUM_COUNTERS = 4


def compaction_tiles(n: int, block: int = COMPACT_BLOCK, max_tiles: int = COMPACT_MAX_TILES):
    """Tiling of ``n`` rows for the compaction kernels.

    Each block of the move kernel adds up the counts of the tiles before it,
    so fewer, larger tiles keep that sum short.

    Parameters
    ----------
    n : int
    block : int
        Threads per block (``KD_COMPACT_BLOCK`` on the GPU).
    max_tiles : int
        The most tiles (blocks) of one launch.

    Returns
    -------
    tile_size : int
        Rows per tile (block), a multiple of ``block``.
    num_tiles : int
        At most ``max_tiles``.
    """
    per_thread = max(1, -(-int(n) // (block * max_tiles)))
    tile_size = block * per_thread
    return tile_size, -(-int(n) // tile_size)


def field_table(xp, source: SoA, destination: SoA):
    """The compaction kernel's table of (source address, destination address, bytes per row).

    Parameters
    ----------
    source, destination : SoA of one type
        Buffers that do not overlap; their first rows are moved.

    Returns
    -------
    (3 * num_fields,) int64
        On the backend of ``xp``; valid while both buffers live.
    """
    if type(source) is not type(destination):
        raise TypeError(f"source and destination must be of one queue type, got "
                        f"{type(source).__name__} and {type(destination).__name__}")
    fields = dataclasses.fields(source)
    if len(fields) > COMPACT_MAX_FIELDS:
        raise ValueError(f"{type(source).__name__} has {len(fields)} fields; the compaction kernel "
                         f"takes at most {COMPACT_MAX_FIELDS}")
    rows = []
    for f in fields:
        a, b = getattr(source, f.name), getattr(destination, f.name)
        for name, array in (("source", a), ("destination", b)):
            if not array.flags.c_contiguous:
                raise ValueError(f"{name} field {f.name} must be C-contiguous")
        row_bytes = a.dtype.itemsize * (f.metadata["width"] or 1)
        rows += [_address(a), _address(b), row_bytes]
    return xp.asarray(np.array(rows, dtype=np.int64))


def live_mask(queue: SoA):
    """(n,) bool: the live rows of a queue by its ``live_field``."""
    flag = getattr(queue, queue.live_field)
    return flag != 0 if flag.dtype == np.uint8 else flag > 0


def compact_rows_xp(xp, source: SoA, destination: SoA, live=None,
                    dead_to_back: bool = False) -> int:
    """Array-expression twin of :meth:`Compactor.compact`: move the live rows to the front.

    Parameters
    ----------
    xp : module
        The backend of the queues (NumPy or CuPy).
    source : SoA
        ``n`` rows (a view of a buffer).
    destination : SoA of the same type
        At least ``n`` rows, not overlapping ``source``; rows ``[0, num_live)``
        of every field receive the live rows in order.
    live : (n,) bool, optional
        Default: :func:`live_mask` of the source.
    dead_to_back : bool
        Also mark rows ``[num_live, n)`` of the destination's ``live_field``
        dead (0, or -1 for float), as the kernel does.

    Returns
    -------
    int
        ``num_live`` (a device-to-host read on CuPy: it sizes the result).
    """
    if live is None:
        live = live_mask(source)
    arrays = source.arrays()
    num_live, moved = compact(xp.asarray(live, dtype=bool), *arrays.values())
    for name, rows in zip(arrays, moved):
        getattr(destination, name)[:num_live] = rows
    if dead_to_back:
        flag = getattr(destination, source.live_field)
        flag[num_live:source.size] = 0 if flag.dtype == np.uint8 else -1
    return num_live


class Compactor:
    """Order-keeping stream compaction of SoA queues with the kernels of render.cu.

    One compaction is two launches over tiles of rows (see
    :func:`compaction_tiles`): ``kd_render_count_live_tiles`` counts the live
    rows of each tile, and ``kd_render_compact_rows`` ranks the live rows of
    its tile (the counts of the tiles before it plus a block scan) and moves
    every field, described by a :func:`field_table`. The number of live rows
    stays on the device in :attr:`counters` until :meth:`read_counters`.

    Parameters
    ----------
    xp : module
        CuPy (or NumPy, for the kernels compiled for the host in the tests).
    launch : callable, optional
        ``launch(description, kernel_name, n, args, block)``; default
        :func:`~kdtree_gpu.render.context.launch_kernel`.
    block : int
        Threads per block (the host build of the kernels runs blocks of 1).
    max_tiles : int
        The most tiles of one launch.

    Attributes
    ----------
    tile_count : (max_tiles,) int32
    counters : (NUM_COUNTERS,) int64
        See the ``COUNTER_*`` slots.
    """

    def __init__(self, xp, launch=launch_kernel, block: int = COMPACT_BLOCK,
                 max_tiles: int = COMPACT_MAX_TILES):
        self.xp = xp
        self.launch = launch
        self.block = int(block)
        self.max_tiles = int(max_tiles)
        self.tile_count = xp.zeros(self.max_tiles, dtype=np.int32)
        self.counters = xp.zeros(NUM_COUNTERS, dtype=np.int64)
        self.counters_host = self.counters
        if xp is not np:
            # pinned host memory: the per-bounce count read is one small async copy
            memory = xp.cuda.alloc_pinned_memory(NUM_COUNTERS * 8)
            self.counters_host = np.frombuffer(memory, np.int64, NUM_COUNTERS)

    def compact(self, description: str, source: SoA, table, destination: SoA,
                dead_to_back: bool = False, total_slot: int = COUNTER_LIVE_PATHS,
                sum_slot: int = -1) -> None:
        """Move the live rows of ``source`` to the front of ``destination``, order kept.

        Parameters
        ----------
        description : str
            Profile name; the launches are ``"<description>: count tiles"``
            and ``"<description>: move rows"``.
        source : SoA
            ``n`` rows, a view of the first rows of the buffer that ``table``
            was made from; rows are live by the queue's ``live_field``.
        table : (3 * num_fields,) int64
            :func:`field_table` of (source buffer, destination buffer).
        destination : SoA
            The destination buffer.
        dead_to_back : bool
            Mark rows ``[num_live, n)`` of the destination dead as well.
        total_slot : int
            Counter that receives ``num_live``.
        sum_slot : int
            Counter that ``num_live`` is added to (-1: none).
        """
        n = source.size
        if n == 0:
            self.counters[total_slot] = 0
            return
        flag = getattr(source, source.live_field)
        flag_kind = COMPACT_FLAG_U8 if flag.dtype == np.uint8 else COMPACT_FLAG_F32
        tile_size, num_tiles = compaction_tiles(n, self.block, self.max_tiles)
        num_fields = len(dataclasses.fields(source))
        self.launch(description + ": count tiles", "kd_render_count_live_tiles",
                    num_tiles * self.block, (
                        i32(n), i32(tile_size), flag, i32(flag_kind), self.tile_count),
                    block=self.block)
        self.launch(description + ": move rows", "kd_render_compact_rows",
                    num_tiles * self.block, (
                        i32(n), i32(tile_size), i32(num_tiles), flag, i32(flag_kind),
                        self.tile_count, i32(num_fields), table, i32(1 if dead_to_back else 0),
                        getattr(destination, source.live_field), self.counters, i32(total_slot),
                        i32(sum_slot)),
                    block=self.block)

    def read_counters(self) -> np.ndarray:
        """The counters on the host: a device-to-host read, which waits for the GPU.

        Returns
        -------
        (NUM_COUNTERS,) int64
            Valid until the next read.
        """
        if self.xp is np:
            return self.counters
        self.counters.get(out=self.counters_host)
        return self.counters_host
