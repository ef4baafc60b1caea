// The nodes of a subtree level (build_small.cu, build_small_grid.cu): a warp
// per node of more than KD_SMALL_TINY_REFS references, a thread per smaller
// one, with the rules of the level stages (build_stages.cuh).
#pragma once
#include "medium_node.cuh"

// v's exclusive prefix over the warp's lanes plus what one atomicAdd of the
// warp's total to *counter returned (every lane calls it): a slot per lane for
// one atomic per warp, not one per node on the level's few shared counters.
__device__ __forceinline__ unsigned long long kd_warp_take(unsigned long long* counter,
                                                           unsigned long long v)
{
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const unsigned long long x = kd_warp_inclusive_scan(v);
    const unsigned long long total = __shfl_sync(full, x, 31);
    unsigned long long base = 0;
    if (lane == 0 && total) base = atomicAdd(counter, total);
    return __shfl_sync(full, base, 0) + x - v;
}

// A node of more than KD_SMALL_TINY_REFS references (or a deferred one of at
// most KD_SMALL_MAX_REFS), one warp: lane l holds references l and l + 32.
__device__ __forceinline__ void kd_small_wide_node(const KdSmallLevel& L, const int* rec_words,
                                                   const KdLoopSettings& cfg)
{
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const unsigned lanes_below = (1u << lane) - 1u;
    const KdSmallRecord rec = kd_small_read_record(rec_words);
    const int r = rec.count;
    if (r > KD_SMALL_MAX_REFS) return;  // a deferred medium node: a block takes it
    int tri[KD_SMALL_PER_LANE];
    float blo[KD_SMALL_PER_LANE][3], bhi[KD_SMALL_PER_LANE][3];
    for (int q = 0; q < KD_SMALL_PER_LANE; ++q) {
        int j = lane + 32 * q;
        tri[q] = j < r ? L.in_refs[rec.start + j] : -1;
        for (int k = 0; k < 3; ++k) {
            blo[q][k] = tri[q] >= 0 ? L.tri_lo[3 * tri[q] + k] : 0.0f;
            bhi[q][k] = tri[q] >= 0 ? L.tri_hi[3 * tri[q] + k] : 0.0f;
        }
    }
    KdSmallSplit best = kd_small_no_split();
    if (rec.depth < cfg.max_depth && r > cfg.leaf_size)
        best = kd_small_best_split(tri, blo, bhi, r, rec.lo, rec.hi, cfg);
    const bool split = best.axis < 3 && best.cost < __dmul_rn(cfg.k_intersect, (double)r);
    // a root's level-loop leaf is replaced: its entries become unused
    if (lane == 0 && L.level == 0) atomicAdd(L.counters + KD_SMALL_HOLES, (unsigned long long)r);
    if (!split) {
        unsigned long long first = 0;
        if (lane == 0)
            first = L.leaves_before + atomicAdd(L.row + KD_SMALL_LEVEL_LEAVES,
                                                (unsigned long long)r);
        first = __shfl_sync(full, first, 0);
        if (first + r > (unsigned long long)L.leaf_capacity) {
            if (lane == 0) kd_small_full(L, KD_SMALL_FULL_LEAVES);
            return;  // (warp-uniform: the level's other nodes still count their needs)
        }
        for (int q = 0; q < KD_SMALL_PER_LANE; ++q)
            if (tri[q] >= 0) *L.tree.leaf(first + lane + 32 * q) = tri[q];
        if (lane == 0) {
            L.tree.set_node(rec.node, KD_AXIS_LEAF, 0.0f, (int)first, r);
            atomicMax(L.counters + KD_SMALL_DEPTH, (unsigned long long)rec.depth);
        }
        return;
    }
    // classify_triangles (R9)
    unsigned cls[KD_SMALL_PER_LANE];
    int num_left = 0, num_right = 0;
    for (int q = 0; q < KD_SMALL_PER_LANE; ++q) {
        cls[q] = tri[q] >= 0 ? kd_class_of(kd_pick3(blo[q], best.axis), kd_pick3(bhi[q], best.axis),
                                           best.pos, best.side)
                             : 0;
        num_left += __popc(__ballot_sync(full, cls[q] & KD_CLASS_LEFT));
        num_right += __popc(__ballot_sync(full, cls[q] & KD_CLASS_RIGHT));
    }
    const int live = (num_left > 0) + (num_right > 0);
    const int back = (num_left > 0 && num_left <= KD_SMALL_TINY_REFS)
                     + (num_right > 0 && num_right <= KD_SMALL_TINY_REFS);
    unsigned long long child = 0, slot = 0, first = 0;
    if (lane == 0) {
        child = L.nodes_before + atomicAdd(L.row + KD_SMALL_LEVEL_NODES, 2ull);
        if (live) {
            slot = atomicAdd(L.next + KD_SMALL_LEVEL_RECORDS,
                             (unsigned long long)(live - back)
                                 | (unsigned long long)back << KD_SMALL_RECORDS_BACK_SHIFT);
            first = atomicAdd(L.next + KD_SMALL_LEVEL_REFS,
                              (unsigned long long)(num_left + num_right));
        }
    }
    child = __shfl_sync(full, child, 0);
    slot = __shfl_sync(full, slot, 0);
    first = __shfl_sync(full, first, 0);
    const unsigned long long full_bits =
        kd_small_split_full(L, child, slot, live, 0, first + num_left + num_right, 0);
    if (full_bits) {
        if (lane == 0) kd_small_full(L, full_bits);
        return;
    }
    int l = 0, rr = 0;
    for (int q = 0; q < KD_SMALL_PER_LANE; ++q) {
        unsigned to_left = __ballot_sync(full, cls[q] & KD_CLASS_LEFT);
        unsigned to_right = __ballot_sync(full, cls[q] & KD_CLASS_RIGHT);
        if (cls[q] & KD_CLASS_LEFT) L.out_refs[first + l + __popc(to_left & lanes_below)] = tri[q];
        if (cls[q] & KD_CLASS_RIGHT)
            L.out_refs[first + num_left + rr + __popc(to_right & lanes_below)] = tri[q];
        l += __popc(to_left);
        rr += __popc(to_right);
    }
    if (lane == 0) {
        const int deepest = kd_small_children(L, rec, best.axis, best.pos, (long long)child, slot,
                                               0, 0, first, num_left, num_right);
        if (deepest >= 0) atomicMax(L.counters + KD_SMALL_DEPTH, (unsigned long long)deepest);
    }
}

// Up to 32 nodes of at most KD_SMALL_TINY_REFS references, a thread each
// (live: this lane has one; rec_words: its record). Every lane of the warp
// calls it: they take their slots together (kd_warp_take). The choices are
// kd_small_wide_node's, rule for rule.
__device__ __forceinline__ void kd_small_tiny_node(const KdSmallLevel& L, bool live,
                                                   const int* rec_words,
                                                   const KdLoopSettings& cfg)
{
    KdSmallRecord rec = {0, 0, 0, 0, {0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f}};
    if (live) rec = kd_small_read_record(rec_words);
    const int r = rec.count;
    int tri[KD_SMALL_TINY_REFS];
#pragma unroll
    for (int q = 0; q < KD_SMALL_TINY_REFS; ++q) tri[q] = q < r ? L.in_refs[rec.start + q] : -1;
    KdSmallSplit best = kd_small_no_split();
    if (live && rec.depth < cfg.max_depth && r > cfg.leaf_size)
        best = kd_tiny_best_split(tri, L.tri_lo, L.tri_hi, r, rec.lo, rec.hi, cfg);
    const bool split = live && best.axis < 3 && best.cost < __dmul_rn(cfg.k_intersect, (double)r);
    const bool leaf = live && !split;
    // classify_triangles (R9)
    unsigned cls[KD_SMALL_TINY_REFS];
    int num_left = 0, num_right = 0;
#pragma unroll
    for (int q = 0; q < KD_SMALL_TINY_REFS; ++q) {
        cls[q] = split && q < r ? kd_class_of(L.tri_lo[3 * tri[q] + best.axis],
                                              L.tri_hi[3 * tri[q] + best.axis], best.pos,
                                              best.side)
                                : 0;
        num_left += (cls[q] & KD_CLASS_LEFT) != 0;
        num_right += (cls[q] & KD_CLASS_RIGHT) != 0;
    }
    // children of a tiny node are tiny: every record goes to the back
    const int kids = split ? (num_left > 0) + (num_right > 0) : 0;
    const unsigned long long leaf_at =
        L.leaves_before + kd_warp_take(L.row + KD_SMALL_LEVEL_LEAVES, leaf ? r : 0);
    const unsigned long long child =
        L.nodes_before + kd_warp_take(L.row + KD_SMALL_LEVEL_NODES, split ? 2 : 0);
    const unsigned long long slot =
        kd_warp_take(L.next + KD_SMALL_LEVEL_RECORDS,
                     (unsigned long long)kids << KD_SMALL_RECORDS_BACK_SHIFT);
    const unsigned long long first =
        kd_warp_take(L.next + KD_SMALL_LEVEL_REFS, split ? num_left + num_right : 0);
    int deepest = -1;
    unsigned long long full_bits = 0;
    if (leaf) {
        if (leaf_at + r > (unsigned long long)L.leaf_capacity) {
            full_bits = KD_SMALL_FULL_LEAVES;
        } else {
#pragma unroll
            for (int q = 0; q < KD_SMALL_TINY_REFS; ++q)
                if (q < r) *L.tree.leaf(leaf_at + q) = tri[q];
            L.tree.set_node(rec.node, KD_AXIS_LEAF, 0.0f, (int)leaf_at, r);
            deepest = rec.depth;
        }
    } else if (split) {
        full_bits = kd_small_split_full(L, child, slot, kids, 0, first + num_left + num_right, 0);
        if (!full_bits) {
            int l = 0, rr = num_left;
#pragma unroll
            for (int q = 0; q < KD_SMALL_TINY_REFS; ++q) {
                if (cls[q] & KD_CLASS_LEFT) L.out_refs[first + l++] = tri[q];
                if (cls[q] & KD_CLASS_RIGHT) L.out_refs[first + rr++] = tri[q];
            }
            deepest = kd_small_children(L, rec, best.axis, best.pos, (long long)child, slot, 0,
                                        0, first, num_left, num_right);
        }
    }
    if (full_bits) kd_small_full(L, full_bits);
    deepest = __reduce_max_sync(0xffffffffu, deepest);
    if ((threadIdx.x & 31) == 0 && deepest >= 0)
        atomicMax(L.counters + KD_SMALL_DEPTH, (unsigned long long)deepest);
}

// The tree nodes and leaf entries the levels before `level` took, in before[0]
// and before[1] (shared memory); false when a level found a buffer full: the
// block skips this level's nodes (a launch per level returns; in one grid the
// block still reaches the level's barrier). Every thread of the block calls it.
__device__ __forceinline__ bool kd_small_level_start(unsigned long long* counters, int level,
                                                     unsigned long long* before)
{
    __shared__ int stop;
    if (threadIdx.x == 0) {
        stop = *(volatile unsigned long long*)(counters + KD_SMALL_OVERFLOW) != 0;
        before[0] = counters[KD_SMALL_NODES];
        before[1] = counters[KD_SMALL_LEAVES];
    }
    __syncthreads();
    for (int j = threadIdx.x; j < level && !stop; j += blockDim.x) {
        const unsigned long long* r = counters + KD_SMALL_COUNTERS + KD_SMALL_LEVEL_ROW * j;
        atomicAdd(&before[0], r[KD_SMALL_LEVEL_NODES]);
        atomicAdd(&before[1], r[KD_SMALL_LEVEL_LEAVES]);
    }
    __syncthreads();
    return !stop;
}

#define KD_SMALL_TREE_PARAMS                                                                 \
    KdTreeNodes out, int *leaf_tris, KdTreeNodes out_more, int *leaf_more,                   \
        long long node_split, long long leaf_split, long long node_capacity,                 \
        long long leaf_capacity
#define KD_SMALL_TREE_ARGS \
    out, leaf_tris, out_more, leaf_more, node_split, leaf_split, node_capacity, leaf_capacity

// Level `level` of the subtrees: reads in_refs, writes out_rec/out_refs
// (rec_capacity, ref_capacity rows) and, for the medium nodes' children,
// out_medium with their events out_events (medium_capacity records,
// events_capacity events; a medium node's own events are in_events), after the
// tree nodes and leaf entries `before` (kd_small_level_start's).
__device__ __forceinline__ KdSmallLevel kd_small_level(
    const float* tri_lo, const float* tri_hi, const int* in_refs,
    unsigned long long* counters, int level, int* out_rec, int* out_refs, long long rec_capacity,
    long long ref_capacity, int* out_medium, const unsigned short* in_events,
    unsigned short* out_events, long long medium_capacity, long long events_capacity,
    const unsigned long long* before, KD_SMALL_TREE_PARAMS)
{
    unsigned long long* row = counters + KD_SMALL_COUNTERS + (long long)KD_SMALL_LEVEL_ROW * level;
    return {tri_lo, tri_hi, in_refs, counters, row, row + KD_SMALL_LEVEL_ROW, out_rec, out_refs,
            out_medium, in_events, out_events, rec_capacity, ref_capacity, medium_capacity,
            events_capacity, node_capacity, leaf_capacity, before[0], before[1],
            {out, out_more, leaf_tris, leaf_more, node_split, leaf_split}, level};
}

// A level of warp and thread nodes (their children are never medium).
__device__ __forceinline__ KdSmallLevel kd_small_warp_level(
    const float* tri_lo, const float* tri_hi, const int* in_refs,
    unsigned long long* counters, int level, int* out_rec, int* out_refs, long long rec_capacity,
    long long ref_capacity, const unsigned long long* before, KD_SMALL_TREE_PARAMS)
{
    return kd_small_level(tri_lo, tri_hi, in_refs, counters, level, out_rec, out_refs,
                          rec_capacity, ref_capacity, nullptr, nullptr, nullptr, 0, 0, before,
                          KD_SMALL_TREE_ARGS);
}

// The nodes of level L.level: the front records of in_rec (more than
// KD_SMALL_TINY_REFS references) a warp each, the back ones (in_capacity
// rows) a thread each, strided over the grid's warps.
__device__ __forceinline__ void kd_small_level_nodes(const KdSmallLevel& L, const int* in_rec,
                                                     long long in_capacity,
                                                     const KdLoopSettings& cfg)
{
    const int lane = threadIdx.x & 31;
    const long long num_warps = (long long)gridDim.x * (blockDim.x >> 5);
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned long long records = L.row[KD_SMALL_LEVEL_RECORDS];
    const long long num_wide = (long long)(records & KD_SMALL_RECORDS_FRONT);
    const long long num_tiny = (long long)(records >> KD_SMALL_RECORDS_BACK_SHIFT);
    for (long long w = warp; w < num_wide; w += num_warps)
        kd_small_wide_node(L, in_rec + w * KD_SMALL_RECORD, cfg);
    for (long long j = 32 * warp + lane; j - lane < num_tiny; j += 32 * num_warps)
        kd_small_tiny_node(L, j < num_tiny, in_rec + (in_capacity - 1 - j) * KD_SMALL_RECORD, cfg);
}
