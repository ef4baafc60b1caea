// The level-loop kernel's entry point at two blocks a multiprocessor (64
// registers; the body spills some of them): builds whose levels are large
// (build_loop.cuh has the loop; build_loop_one_block.cu the entry point for
// builds of small levels, build_loop_clip.cu the one with perfect splits).
// One entry point a module: a machine's first build compiles only the loop
// it runs (H200, NVRTC: this module with the clipping loop in it took 10.1 s,
// the longest of a first build's compilations).
#include "build_loop.cuh"

extern "C" __global__ void __launch_bounds__(KD_LOOP_BLOCK, 2)
kd_build_levels_grid(KD_LOOP_PARAMS)
{
    kd_build_levels<false>(KD_LOOP_ARGS);
}
