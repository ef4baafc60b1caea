// The level-loop kernel at one block a multiprocessor: 128 registers and no
// spills, and half the blocks at each grid barrier, against half the warps to
// hide memory latency. Builds whose root level has at most
// GpuSettings.loop_one_block_events events take it (kdtree_gpu/builder/gpu/
// level_loop.py, level_loop_kernel). Measured on an H100, the loop's GPU time:
// bunny 1.96-2.01 -> 1.71 ms, happy Buddha 2.57 -> 2.30 ms, but conference
// 8.2 -> 9.5 ms and armadillo 5.6 -> 6.2 ms (levels of millions of events).
#include "build_loop.cuh"

extern "C" __global__ void __launch_bounds__(KD_LOOP_BLOCK, 1)
kd_build_levels_grid_one_block(KD_LOOP_PARAMS)
{
    kd_build_levels<false>(KD_LOOP_ARGS);
}
