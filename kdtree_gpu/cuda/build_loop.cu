// The level-loop kernel's entry points at two blocks a multiprocessor (64
// registers; the body spills some of them): builds whose levels are large
// (build_loop.cuh has the loop; build_loop_one_block.cu the entry point for
// builds of small levels).
#include "build_loop.cuh"

extern "C" __global__ void __launch_bounds__(KD_LOOP_BLOCK, 2)
kd_build_levels_grid(KD_LOOP_PARAMS)
{
    kd_build_levels<false>(KD_LOOP_ARGS);
}

extern "C" __global__ void __launch_bounds__(KD_LOOP_BLOCK, 2)
kd_build_levels_grid_clip(KD_LOOP_PARAMS)
{
    kd_build_levels<true>(KD_LOOP_ARGS);
}
