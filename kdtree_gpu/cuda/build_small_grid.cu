// The subtree stage's levels in one cooperative launch
// (kdtree_gpu/builder/gpu/small.py, build_small_subtrees).
//
// build_small.cu's kd_build_small_level is launched once per level that can
// exist (a build's depth limit: about 30 launches), most of them for levels
// without nodes, and each costs the host a launch. Small and mid-size builds
// are bound by that host work. This kernel runs the same levels, node for
// node, in one launch of as many blocks as fit on the device at once, with a
// grid barrier between levels; it stops after the last level with nodes, or
// after a level that found a buffer full (the host then makes room and runs
// the levels again from that one, as it does for the launches per level).
// Builds that give medium nodes a block (small_refs > KD_SMALL_MAX_REFS)
// keep the launches per level.
#include <cooperative_groups.h>

#include "small_nodes.cuh"

namespace cg = cooperative_groups;

// Levels first .. levels - 1. Level 0 reads the deferred records
// (deferred_rows rows) and their references deferred_refs; level L > 0 reads
// buffer 1 - L % 2 and writes buffer L % 2 (records and references of
// rec_rows and ref_rows rows each), as the launches per level do. The
// buffers are not read-only: a level reads what the one before it wrote in
// this launch.
extern "C" __global__ void __launch_bounds__(KD_SMALL_BLOCK)
kd_build_small_levels(const float* __restrict__ tri_lo, const float* __restrict__ tri_hi,
                      const int* deferred, long long deferred_rows, const int* deferred_refs,
                      int* rec0, int* refs0, long long rec_rows0, long long ref_rows0, int* rec1,
                      int* refs1, long long rec_rows1, long long ref_rows1, int first, int levels,
                      unsigned long long* counters, KD_SMALL_TREE_PARAMS, KdLoopSettings cfg)
{
    cg::grid_group grid = cg::this_grid();
    __shared__ unsigned long long before[2];
    for (int level = first; level < levels; ++level) {
        // (a block that sees a buffer found full skips the level's nodes but
        // reaches the barrier: every block takes the same path through it)
        if (kd_small_level_start(counters, level, before)) {
            const bool odd = level & 1;
            const int* in_rec = level == 0 ? deferred : odd ? rec0 : rec1;
            const long long in_rows = level == 0 ? deferred_rows : odd ? rec_rows0 : rec_rows1;
            const int* in_refs = level == 0 ? deferred_refs : odd ? refs0 : refs1;
            const KdSmallLevel L = kd_small_warp_level(
                tri_lo, tri_hi, in_refs, counters, level, odd ? rec1 : rec0, odd ? refs1 : refs0,
                odd ? rec_rows1 : rec_rows0, odd ? ref_rows1 : ref_rows0, before,
                KD_SMALL_TREE_ARGS);
            kd_small_level_nodes(L, in_rec, in_rows, cfg);
        }
        grid.sync();
        // Both words are final for this level at the barrier, and what the next
        // level may write to them before a slow block reads them changes no
        // block's choice: the next level's records only this level counts,
        // and the first full level only falls, to a level past this one.
        const volatile unsigned long long* c = counters;
        const unsigned long long next_records =
            c[KD_SMALL_COUNTERS + (long long)KD_SMALL_LEVEL_ROW * (level + 1)
              + KD_SMALL_LEVEL_RECORDS];
        if (c[KD_SMALL_FULL_LEVEL] <= (unsigned long long)level || next_records == 0) break;
    }
}
