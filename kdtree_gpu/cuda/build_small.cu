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
// in between: a level without nodes returns at once. When a buffer would
// overflow, its bit (KD_SMALL_FULL_*) is set in counters[KD_SMALL_OVERFLOW]
// and the level in counters[KD_SMALL_FULL_LEVEL], every later launch
// returns, and the host makes room and runs the levels again from that one
// (the levels before it are done, and its input is only read).
// The tree nodes and leaf entries the levels before `level` took, in before[0]
// and before[1] (shared memory); false when a level found a buffer full
// (every later launch returns). Every thread of the block calls it.
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

extern "C" __global__ void __launch_bounds__(KD_SMALL_BLOCK)
kd_build_small_level(const float* __restrict__ tri_lo, const float* __restrict__ tri_hi,
                     const int* __restrict__ in_rec, const int* __restrict__ in_refs,
                     long long in_capacity, int level, unsigned long long* counters,
                     int* __restrict__ out_rec, int* __restrict__ out_refs,
                     long long rec_capacity, long long ref_capacity, KD_SMALL_TREE_PARAMS,
                     KdLoopSettings cfg)
{
    const int lane = threadIdx.x & 31;
    const long long num_warps = (long long)gridDim.x * (blockDim.x >> 5);
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    unsigned long long* row = counters + KD_SMALL_COUNTERS + (long long)KD_SMALL_LEVEL_ROW * level;
    __shared__ unsigned long long before[2];
    if (!kd_small_level_start(counters, level, before)) return;
    // (a warp's node has no medium children)
    const KdSmallLevel L = {tri_lo, tri_hi, in_refs, counters, row, row + KD_SMALL_LEVEL_ROW,
                            out_rec, out_refs, nullptr, nullptr, nullptr, rec_capacity,
                            ref_capacity, 0, 0, node_capacity, leaf_capacity, before[0],
                            before[1],
                            {out, out_more, leaf_tris, leaf_more, node_split, leaf_split}, level};
    const unsigned long long records = row[KD_SMALL_LEVEL_RECORDS];
    const long long num_wide = (long long)(records & KD_SMALL_RECORDS_FRONT);
    const long long num_tiny = (long long)(records >> KD_SMALL_RECORDS_BACK_SHIFT);
    for (long long w = warp; w < num_wide; w += num_warps)
        kd_small_wide_node(L, in_rec + w * KD_SMALL_RECORD, cfg);
    for (long long j = 32 * warp + lane; j - lane < num_tiny; j += 32 * num_warps)
        kd_small_tiny_node(L, j < num_tiny, in_rec + (in_capacity - 1 - j) * KD_SMALL_RECORD, cfg);
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
    unsigned long long* row = counters + KD_SMALL_COUNTERS + (long long)KD_SMALL_LEVEL_ROW * level;
    __shared__ unsigned long long before[2];
    if (!kd_small_level_start(counters, level, before)) return;
    const KdSmallLevel L = {tri_lo, tri_hi, in_refs, counters, row, row + KD_SMALL_LEVEL_ROW,
                            out_rec, out_refs, out_medium, in_events, out_events, rec_capacity,
                            ref_capacity, medium_capacity, events_capacity, node_capacity,
                            leaf_capacity, before[0], before[1],
                            {out, out_more, leaf_tris, leaf_more, node_split, leaf_split}, level};
    const long long num = (long long)row[KD_SMALL_LEVEL_MEDIUM];
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

// Leaf sizes for the scan that packs leaf_tris: counts[i + 1] = node i's
// triangles if it is a leaf, else 0, after a leading 0 (nodes in the pages
// of KdSmallTree).
extern "C" __global__ void kd_leaf_counts(KdTreeNodes lo, KdTreeNodes hi, long long node_split,
                                          long long num_nodes, long long* __restrict__ counts)
{
    const KdSmallTree tree = {lo, hi, nullptr, nullptr, node_split, 0};
    long long i = kd_tid();
    if (i == 0) counts[0] = 0;
    if (i < num_nodes) {
        const KdTreeNodes& t = tree.page(i);
        const long long k = tree.page_index(i);
        counts[i + 1] = t.node_axis[k] == KD_AXIS_LEAF ? t.node_count[k] : 0;
    }
}

// Copy every leaf's triangles to its packed offset (the scan of kd_leaf_counts)
// and point the leaf there: the deferred nodes' level-loop leaves, replaced by
// their subtrees, leave no unused entries behind.
extern "C" __global__ void kd_pack_leaves(KdTreeNodes lo, KdTreeNodes hi, long long node_split,
                                          long long num_nodes,
                                          const long long* __restrict__ offsets, int* leaf_lo,
                                          int* leaf_hi, long long leaf_split,
                                          int* __restrict__ leaf_out)
{
    const KdSmallTree tree = {lo, hi, leaf_lo, leaf_hi, node_split, leaf_split};
    long long i = kd_tid();
    if (i >= num_nodes) return;
    const KdTreeNodes& t = tree.page(i);
    const long long k = tree.page_index(i);
    if (t.node_axis[k] != KD_AXIS_LEAF) return;
    long long src = t.node_child[k], dst = offsets[i];
    for (int j = 0; j < t.node_count[k]; ++j) leaf_out[dst + j] = *tree.leaf(src + j);
    t.node_child[k] = (int)dst;
}
