"""Stream compaction of the queues (kdtree_gpu.render.compaction): kernels against their twin."""

import numpy as np
import pytest

from kdtree_gpu.encoding import COMPACT_BLOCK, COMPACT_MAX_TILES
from kdtree_gpu.render.compaction import (COUNTER_LIVE_PATHS, COUNTER_SHADOW_RAYS,
                                          COUNTER_SHADOW_RAYS_TOTAL, Compactor, compact_rows_xp,
                                          compaction_tiles, field_table)
from kdtree_gpu.render.queues import PathQueue, ShadowQueue


@pytest.mark.parametrize("cls", [PathQueue, ShadowQueue])
@pytest.mark.parametrize("dead_to_back", [False, True])
def test_compaction_twin_equals_boolean_mask_compaction(cls, dead_to_back, render_helpers):
    h = render_helpers
    rng = np.random.default_rng(5)
    for n in (0, 1, 37, 1000):
        source, live = h.random_queue(cls, n, rng)
        destination = h.poisoned(cls, np, n + 5)
        num_live = compact_rows_xp(np, source, destination, dead_to_back=dead_to_back)
        h.assert_compacted(source, live, destination, num_live, dead_to_back, n + 5)


def test_field_table_lists_every_field_with_its_row_bytes():
    a, b = PathQueue.allocate(np, 4), PathQueue.allocate(np, 4)
    table = field_table(np, a, b).reshape(-1, 3)
    assert table.shape[0] == len(a.arrays())
    assert table[0].tolist() == [a.ray_origin.ctypes.data, b.ray_origin.ctypes.data, 12]
    assert table[-1].tolist() == [a.path_alive.ctypes.data, b.path_alive.ctypes.data, 1]
    with pytest.raises(TypeError, match="one queue type"):
        field_table(np, a, ShadowQueue.allocate(np, 4))


def test_compaction_tiles_cover_every_row_with_few_tiles():
    for n in (1, 255, 256, 257, 100_000, 1 << 20, (1 << 21) + 3):
        tile_size, num_tiles = compaction_tiles(n)
        assert tile_size % COMPACT_BLOCK == 0
        assert num_tiles <= COMPACT_MAX_TILES
        assert (num_tiles - 1) * tile_size < n <= num_tiles * tile_size
    # the host build runs blocks of one thread
    assert compaction_tiles(10, block=1, max_tiles=4) == (3, 4)


@pytest.mark.parametrize("max_tiles", [COMPACT_MAX_TILES, 7])
def test_compaction_kernel_compiled_for_the_host_matches_its_twin(host_kernels, render_helpers,
                                                                  max_tiles):
    h = render_helpers
    # blocks of one thread; few tiles: several rows per tile, ranks carried across rows of one block
    compactor = Compactor(np, launch=host_kernels, block=1, max_tiles=max_tiles)
    rng = np.random.default_rng(11)
    expected_sum = 0
    for cls, dead_to_back in ((PathQueue, False), (ShadowQueue, True)):
        for n, fraction in ((1, 1.0), (50, 0.0), (50, 1.0), (333, 0.4)):
            capacity = n + 3
            buffer = cls.allocate(np, capacity)
            source, live = h.random_queue(cls, n, rng, fraction)
            for name, array in source.arrays().items():
                getattr(buffer, name)[:n] = array
            destination = h.poisoned(cls, np, capacity)
            table = field_table(np, buffer, destination)
            compactor.compact("test", buffer.prefix(n), table, destination,
                              dead_to_back=dead_to_back, total_slot=COUNTER_SHADOW_RAYS,
                              sum_slot=COUNTER_SHADOW_RAYS_TOTAL)
            counters = compactor.read_counters()
            expected_sum += int(live.sum())
            assert counters[COUNTER_SHADOW_RAYS_TOTAL] == expected_sum
            h.assert_compacted(source, live, destination, int(counters[COUNTER_SHADOW_RAYS]),
                               dead_to_back, capacity)
            twin = h.poisoned(cls, np, capacity)
            compact_rows_xp(np, source, twin, dead_to_back=dead_to_back)
            h.assert_same_bytes(twin, destination)


@pytest.mark.gpu
@pytest.mark.parametrize("cls", [PathQueue, ShadowQueue])
def test_gpu_compaction_kernel_matches_its_twin(cls, render_helpers):
    cp = pytest.importorskip("cupy")
    h = render_helpers
    rng = np.random.default_rng(3)
    compactor = Compactor(cp)
    dead_to_back = cls is ShadowQueue
    expected_sum = 0
    # one row; all dead; all live; one row per thread; several rows per thread
    for n, fraction in ((1, 1.0), (1000, 0.0), (1000, 1.0), (70_001, 0.3), (600_000, 0.55)):
        capacity = n + 100
        host, live = h.random_queue(cls, n, rng, fraction)
        buffer = cls.allocate(cp, capacity)
        for name, array in host.arrays().items():
            getattr(buffer, name)[:n] = cp.asarray(array)
        destination = h.poisoned(cls, cp, capacity)
        compactor.compact("test", buffer.prefix(n), field_table(cp, buffer, destination),
                          destination, dead_to_back=dead_to_back, total_slot=COUNTER_LIVE_PATHS,
                          sum_slot=COUNTER_SHADOW_RAYS_TOTAL)
        counters = compactor.read_counters()
        expected_sum += int(live.sum())
        assert counters[COUNTER_SHADOW_RAYS_TOTAL] == expected_sum
        num_live = int(counters[COUNTER_LIVE_PATHS])
        gpu = cls(**{name: cp.asnumpy(a) for name, a in destination.arrays().items()})
        h.assert_compacted(host, live, gpu, num_live, dead_to_back, capacity)
        twin = h.poisoned(cls, cp, capacity)
        assert compact_rows_xp(cp, buffer.prefix(n), twin, dead_to_back=dead_to_back) == num_live
        h.assert_same_bytes(twin, gpu)
