"""The SoA queues and their buffers (kdtree_gpu.render.queues)."""

import numpy as np

from kdtree_gpu.render.compaction import Compactor
from kdtree_gpu.render.queues import LightSampleQueue, PathQueue, QueueBuffers, ShadowQueue


def test_soa_allocate_and_take_keep_fields_together():
    q = PathQueue.allocate(np, 5)
    assert q.ray_origin.shape == (5, 3) and q.ray_origin.dtype == np.float32
    assert q.path_key.dtype == np.uint32 and q.path_alive.dtype == np.uint8
    q.path_pixel[:] = np.arange(5)
    q.ray_origin[:, 0] = np.arange(5)
    sub = q.take(np.array([4, 1]))
    assert sub.size == 2
    np.testing.assert_array_equal(sub.path_pixel, [4, 1])
    np.testing.assert_array_equal(sub.ray_origin[:, 0], [4, 1])


def test_queue_buffers_hold_what_each_setting_needs():
    # array-expression stages: zeroed buffers, no compactor, a second path buffer with compaction
    twins = QueueBuffers.allocate(np, 8, use_kernels=False, compaction=True)
    assert twins.compactor is None and twins.path_tables is None
    assert twins.paths[1].size == 8 and not twins.paths[0].ray_tmax.any()
    assert isinstance(twins.light_samples, LightSampleQueue)
    masked = QueueBuffers.allocate(np, 8, use_kernels=False, compaction=False)
    assert masked.paths[1] is None and masked.shadow_compact is None
    # kernels with compaction: field tables from each path buffer to the other, a compactor
    compactor = Compactor(np, block=1)
    kernels = QueueBuffers.allocate(np, 8, use_kernels=True, compaction=True, compactor=compactor)
    assert kernels.compactor is compactor
    first, second = (table.reshape(-1, 3) for table in kernels.path_tables)
    assert first[0, 0] == kernels.paths[0].ray_origin.ctypes.data
    assert second[0, 0] == kernels.paths[1].ray_origin.ctypes.data == first[0, 1]
    assert kernels.shadow_table.shape == (3 * len(kernels.shadow.arrays()),)
    assert isinstance(kernels.shadow_compact, ShadowQueue)
    assert kernels.ray_tmin.shape == (8,) and not kernels.ray_tmin.any()
    assert QueueBuffers.allocate(np, 8, use_kernels=True, compaction=False).compactor is None
