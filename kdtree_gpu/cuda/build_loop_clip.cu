// The level-loop kernel with perfect splits (SAHConfig(clip=True)), at two
// blocks a multiprocessor as build_loop.cu's: the loop clips the straddling
// references and merges their new events (build_loop.cuh, clip.cuh). A module
// of its own, so that builds without perfect splits never compile it.
#include "build_loop.cuh"

extern "C" __global__ void __launch_bounds__(KD_LOOP_BLOCK, 2)
kd_build_levels_grid_clip(KD_LOOP_PARAMS)
{
    kd_build_levels<true>(KD_LOOP_ARGS);
}
