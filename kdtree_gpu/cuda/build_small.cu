// Small-node subtrees of the SAH kd-tree builder
// (kdtree_gpu/builder/gpu/small.py, build_small_subtrees).
//
// The level loop (build_loop.cu) defers every node it would split that holds
// at most small_refs <= KD_MEDIUM_MAX_REFS references: it writes the node as a
// leaf of its references and a record (tree node, level, leaf range, box).
// Here the deferred nodes' subtrees are built level by level, one launch per
// level, a warp per node (a thread per node of at most KD_SMALL_TINY_REFS
// references, most of them; a block per node of more than KD_SMALL_MAX_REFS,
// medium_node.cuh, in a launch of its own before), with the rules of the level stages
// (build_stages.cuh), so the tree is the one the level loop would have built,
// node for node (only the numbering differs). A level costs one launch, not
// the loop's dozen grid barriers and event passes.
//
// The best plane of each node is small_split.cuh's (medium_node.cuh's for
// the medium ones).
#include "small_nodes.cuh"

// One level of the small nodes' subtrees: the nodes of every deferred subtree
// at the same distance below its root (their depths differ). A node is a
// record of KD_SMALL_RECORD int32 (small_record.cuh: tree node, depth, start
// and count of its references in `in_refs`, box): the deferred nodes' records
// with their level-loop leaves in leaf_tris first (level 0), then the
// children this kernel writes to `out_rec`/`out_refs` (ping-pong buffers of
// in_capacity and rec_capacity records). A record of more than
// KD_SMALL_TINY_REFS references is at the front of its buffer and takes a
// warp; one of fewer is at the back and takes a thread. counters
// (encoding.SMALL_*) holds the run's counters and a row per level: level L
// reads its numbers of records from row L (front | back << 32), takes rows
// for its children's records and references from row L + 1, and counts the
// tree nodes and leaf entries it takes in row L, placed after those of the
// levels before it. The host launches it once per possible level with no read
// in between (or runs the levels in one cooperative launch,
// build_small_grid.cu): a level without nodes returns at once. When a buffer would
// overflow, its bit (KD_SMALL_FULL_*) is set in counters[KD_SMALL_OVERFLOW]
// and the level in counters[KD_SMALL_FULL_LEVEL], every later launch
// returns, and the host makes room and runs the levels again from that one
// (the levels before it are done, and its input is only read).
extern "C" __global__ void __launch_bounds__(KD_SMALL_BLOCK)
kd_build_small_level(const float* __restrict__ tri_lo, const float* __restrict__ tri_hi,
                     const int* __restrict__ in_rec, const int* __restrict__ in_refs,
                     long long in_capacity, int level, unsigned long long* counters,
                     int* __restrict__ out_rec, int* __restrict__ out_refs,
                     long long rec_capacity, long long ref_capacity, KD_SMALL_TREE_PARAMS,
                     KdLoopSettings cfg)
{
    __shared__ unsigned long long before[2];
    if (!kd_small_level_start(counters, level, before)) return;
    const KdSmallLevel L = kd_small_warp_level(tri_lo, tri_hi, in_refs, counters, level, out_rec,
                                               out_refs, rec_capacity, ref_capacity, before,
                                               KD_SMALL_TREE_ARGS);
    kd_small_level_nodes(L, in_rec, in_capacity, cfg);
}

// One level's medium nodes (SMALL_MAX_REFS + 1 .. MEDIUM_MAX_REFS references),
// a block each: kd_build_small_level's level, launched before it, for the
// records in_medium (KD_MEDIUM_RECORD words; level 0: kd_medium_records's
// copies of the deferred ones), their references in in_refs and their events
// in in_events. Their children go to out_rec (small) or out_medium (medium,
// medium_capacity records, with their events in out_events) and out_refs,
// as that kernel's do.
extern "C" __global__ void __launch_bounds__(KD_MEDIUM_BLOCK, 16)
kd_build_medium_level(const float* __restrict__ tri_lo, const float* __restrict__ tri_hi,
                      const int* __restrict__ in_medium, const int* __restrict__ in_refs,
                      const unsigned short* __restrict__ in_events, int level,
                      unsigned long long* counters, int* __restrict__ out_rec,
                      int* __restrict__ out_refs, int* __restrict__ out_medium,
                      unsigned short* __restrict__ out_events, long long rec_capacity,
                      long long ref_capacity, long long medium_capacity,
                      long long events_capacity, KD_SMALL_TREE_PARAMS, KdLoopSettings cfg)
{
    __shared__ KdMediumShared sh;
    __shared__ unsigned long long before[2];
    if (!kd_small_level_start(counters, level, before)) return;
    const KdSmallLevel L = kd_small_level(tri_lo, tri_hi, in_refs, counters, level, out_rec,
                                          out_refs, rec_capacity, ref_capacity, out_medium,
                                          in_events, out_events, medium_capacity,
                                          events_capacity, before, KD_SMALL_TREE_ARGS);
    const long long num = (long long)L.row[KD_SMALL_LEVEL_MEDIUM];
    for (long long m = blockIdx.x; m < num; m += gridDim.x)
        kd_medium_node(L, in_medium + m * KD_MEDIUM_RECORD, cfg, sh);
}

// Level 0's medium records: the deferred records of more than SMALL_MAX_REFS
// references copied to `medium` (KD_MEDIUM_RECORD words: without events, -1),
// counted in row 0 (kd_small_wide_node skips them at level 0).
extern "C" __global__ void kd_medium_records(const int* __restrict__ deferred, long long num,
                                             unsigned long long* counters,
                                             int* __restrict__ medium)
{
    const long long i = kd_tid();
    if (i >= num) return;
    const int* rec = deferred + i * KD_SMALL_RECORD;
    if (kd_small_record_count(rec) <= KD_SMALL_MAX_REFS) return;
    const unsigned long long at =
        atomicAdd(counters + KD_SMALL_COUNTERS + KD_SMALL_LEVEL_MEDIUM, 1ull);
    for (int k = 0; k < KD_SMALL_RECORD; ++k) medium[at * KD_MEDIUM_RECORD + k] = rec[k];
    medium[at * KD_MEDIUM_RECORD + KD_SMALL_RECORD] = -1;
}
