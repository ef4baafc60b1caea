// What every node of a subtree level reads and writes (build_small.cu): the
// tree's pages, the level's buffers and counters, and the helpers that take
// a node's slots and write its children's records, shared by the warp and
// thread nodes (build_small.cu) and the block nodes (medium_node.cuh).
#pragma once
#include "small_split.cuh"
#include "tree_pages.cuh"

// What every node of a subtree level reads and writes (kd_build_small_level).
struct KdSmallLevel {
    const float* __restrict__ tri_lo;
    const float* __restrict__ tri_hi;
    const int* in_refs;  // (not read-only: build_small_grid.cu writes it in the same launch)
    unsigned long long* counters;
    unsigned long long* row;   // this level's counts
    unsigned long long* next;  // its children's
    int* __restrict__ out_rec;
    int* __restrict__ out_refs;
    int* __restrict__ out_medium;  // the children's medium records (KD_MEDIUM_RECORD words)
    const unsigned short* __restrict__ in_events;  // the medium nodes' events (medium_node.cuh)
    unsigned short* __restrict__ out_events;      // the medium children's
    long long rec_capacity, ref_capacity, medium_capacity, events_capacity, node_capacity,
        leaf_capacity;
    unsigned long long nodes_before, leaves_before;  // taken by the levels before this one
    KdSmallTree tree;
    int level;
};

// A buffer found full: its bits, and the first level that found one.
__device__ __forceinline__ void kd_small_full(const KdSmallLevel& L, unsigned long long bits)
{
    atomicOr(L.counters + KD_SMALL_OVERFLOW, bits);
    atomicMin(L.counters + KD_SMALL_FULL_LEVEL, (unsigned long long)L.level);
}

// The buffers a split node's output would overflow (KD_SMALL_FULL_* bits):
// the tree's node pair at `child`, its live children's records (slot: what
// the records word gave, front | back << KD_SMALL_RECORDS_BACK_SHIFT; its
// medium ones up to `medium_end`), their references up to `refs_end` and the
// medium ones' events up to `events_end`.
__device__ __forceinline__ unsigned long long kd_small_split_full(
    const KdSmallLevel& L, unsigned long long child, unsigned long long slot, int live,
    unsigned long long medium_end, unsigned long long refs_end, unsigned long long events_end)
{
    return (child + 2 > (unsigned long long)L.node_capacity ? KD_SMALL_FULL_NODES : 0ull)
           | ((slot & KD_SMALL_RECORDS_FRONT) + (slot >> KD_SMALL_RECORDS_BACK_SHIFT) + live
                          > (unsigned long long)L.rec_capacity
                      || medium_end > (unsigned long long)L.medium_capacity
                  ? KD_SMALL_FULL_RECORDS : 0ull)
           | (refs_end > (unsigned long long)L.ref_capacity ? KD_SMALL_FULL_REFS : 0ull)
           | (events_end > (unsigned long long)L.events_capacity ? KD_SMALL_FULL_EVENTS : 0ull);
}

// make_child_nodes for a node split at (axis, pos) into tree nodes child and
// child + 1 (left hi[axis] = pos, right lo[axis] = pos): a child without
// references is a leaf now, the others the next level's records, whose
// references start at `first` (the left child's, then the right one's). A
// record of KD_SMALL_TINY_REFS or fewer references goes to the back of
// out_rec (a thread takes it), one of at most KD_SMALL_MAX_REFS to the front
// (a warp takes it), a larger one to out_medium from row `medium` on (a
// block takes it; its events in out_events from `events` on, six per
// reference, the left child's first); slot is what the records word gave:
// front | back << 32. Returns the depth of the leaves it made, or -1.
__device__ __forceinline__ int kd_small_children(const KdSmallLevel& L, const KdSmallRecord& rec,
                                                 int axis, float pos, long long child,
                                                 unsigned long long slot, long long medium,
                                                 unsigned long long events,
                                                 unsigned long long first, int num_left,
                                                 int num_right)
{
    L.tree.set_node(rec.node, axis, pos, (int)child, 0);
    float hi_l[3], lo_r[3];  // (selects: an indexed store would put them in local memory)
#pragma unroll
    for (int k = 0; k < 3; ++k) {
        hi_l[k] = k == axis ? pos : rec.hi[k];
        lo_r[k] = k == axis ? pos : rec.lo[k];
    }
    long long front = (long long)(slot & KD_SMALL_RECORDS_FRONT);
    long long back = (long long)(slot >> KD_SMALL_RECORDS_BACK_SHIFT);
    const int counts[2] = {num_left, num_right};
    int deepest = -1;
    for (int side = 0; side < 2; ++side) {
        const int c = (int)child + side;
        if (counts[side] == 0) {
            L.tree.set_node(c, KD_AXIS_LEAF, 0.0f, 0, 0);  // (child: set when packed)
            deepest = rec.depth + 1;
            continue;
        }
        const bool is_medium = counts[side] > KD_SMALL_MAX_REFS;
        int* out = is_medium ? L.out_medium + medium++ * KD_MEDIUM_RECORD
                   : L.out_rec + KD_SMALL_RECORD * (counts[side] <= KD_SMALL_TINY_REFS
                                                        ? L.rec_capacity - 1 - back++
                                                        : front++);
        if (is_medium) {
            out[KD_SMALL_RECORD] = (int)events;
            events += 6 * counts[side];
        }
        kd_small_write_record(out, c, rec.depth + 1,
                              first + (side ? num_left : 0), counts[side],
                              side ? lo_r : rec.lo, side ? rec.hi : hi_l);
    }
    return deepest;
}
