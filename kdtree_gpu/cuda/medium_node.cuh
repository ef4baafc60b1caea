// The best plane of a medium node of the subtree stage (SMALL_MAX_REFS + 1 ..
// KD_MEDIUM_MAX_REFS references), and the node's whole step, one block per
// node (KD_MEDIUM_BLOCK threads). Part of build_small.cu, which includes it.
//
// The counts are small_split.cuh's, for each candidate p of an axis:
//   N_L = #{t : lo_t < p},  N_P = #{t : lo_t == hi_t == p},  N_R = N - #{t : hi_t <= p}
// which a warp finds by comparing p with every reference (quadratic: 64
// references are 8k comparisons, 1024 are two million an axis). Here the
// block sorts the lows, the highs and the planar positions of the axis into
// KD_MEDIUM_BUCKETS buckets by a monotone function of the position (the
// range of the axis' candidates cut into equal parts, the values below it in
// the first bucket, those above it in the last): a count is the number of
// values in the buckets below p's plus those below p (or at p) in p's own
// bucket, which the thread compares one by one. Values that compare equal
// share a bucket, so the counts are exact; a bucket holds a few values, all
// of them when every value is equal (then the work is the warp's quadratic
// one). The range is the candidates', not the node's: a surface's references
// often span a sliver of their node on an axis. The
// candidates and the choice (lowest (cost, axis, position)) are
// small_split.cuh's, so the plane is the one the level stages choose
// (small_split.cuh says why).
#pragma once
#include "small_level.cuh"

#define KD_MEDIUM_INF __int_as_float(0x7f800000)
#define KD_MEDIUM_PER_THREAD (KD_MEDIUM_MAX_REFS / KD_MEDIUM_BLOCK)
// the three counts of a bucket in one word, as the scan adds them: lows, highs
// and planar positions
#define KD_MEDIUM_FIELD 21
#define KD_MEDIUM_MASK ((1ull << KD_MEDIUM_FIELD) - 1)

// A medium node in shared memory: its references (triangle, box), and the
// values of the axis being searched by bucket.
struct KdMediumShared {
    int tri[KD_MEDIUM_MAX_REFS];
    float lo[3][KD_MEDIUM_MAX_REFS];
    float hi[3][KD_MEDIUM_MAX_REFS];
    float by_lo[KD_MEDIUM_MAX_REFS];
    float by_hi[KD_MEDIUM_MAX_REFS];
    float by_planar[KD_MEDIUM_MAX_REFS];  // lo of the planar references
    // per bucket: its lows' and highs' counts (low and high 16 bits) and its
    // planar positions', then (after the scan) where they begin
    unsigned count[KD_MEDIUM_BUCKETS + 1];
    unsigned count_planar[KD_MEDIUM_BUCKETS + 1];
    KdSmallSplit warp_best[KD_MEDIUM_BLOCK / 32];
    int warp_count[2][KD_MEDIUM_BLOCK / 32];
    float range[2 * (KD_MEDIUM_BLOCK / 32)];
    unsigned long long slots[4];  // what the node's atomics gave, for every thread
};

// The bucket of position v for candidates in [m0, m1]: 0 below m0, the last
// above m1, the equal parts of [m0, m1] between (scale: their number over
// m1 - m0). Non-decreasing in v (each rounded step is), so v < w wherever
// bucket(v) < bucket(w); NaN (v == m0 with an infinite scale) takes the
// first part.
__device__ __forceinline__ int kd_medium_bucket(float v, float m0, float m1, float scale)
{
    if (v < m0) return 0;
    if (v > m1) return KD_MEDIUM_BUCKETS - 1;
    const float x = __fmul_rn(__fsub_rn(v, m0), scale);
    constexpr int last = KD_MEDIUM_BUCKETS - 3;  // the last part
    return 1 + (x > 0.0f ? (x < (float)last ? (int)x : last) : 0);
}

// Bucket b's values begin at `start` (packed as the scan adds them: lows,
// highs and planar positions in KD_MEDIUM_FIELD bits each).
__device__ __forceinline__ void kd_medium_set_start(KdMediumShared& sh, int b,
                                                    unsigned long long start)
{
    sh.count[b] = (unsigned)(start & KD_MEDIUM_MASK)
                  | (unsigned)(start >> KD_MEDIUM_FIELD & KD_MEDIUM_MASK) << 16;
    sh.count_planar[b] = (unsigned)(start >> (2 * KD_MEDIUM_FIELD));
}

// The least and the greatest of each thread's a and b over the block.
__device__ __forceinline__ void kd_block_min_max(float& a, float& b, float* scratch)
{
    const unsigned full = 0xffffffffu;
    for (int offset = 16; offset > 0; offset >>= 1) {
        a = fminf(a, __shfl_xor_sync(full, a, offset));
        b = fmaxf(b, __shfl_xor_sync(full, b, offset));
    }
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) {
        scratch[2 * warp] = a;
        scratch[2 * warp + 1] = b;
    }
    __syncthreads();
    for (int w = 0; w < KD_MEDIUM_BLOCK / 32; ++w) {
        a = fminf(a, scratch[2 * w]);
        b = fmaxf(b, scratch[2 * w + 1]);
    }
    __syncthreads();  // (scratch is written again)
}

// The node's best plane (every thread gets it): the references are in sh
// (r of them), the node's box nlo, nhi.
__device__ __forceinline__ KdSmallSplit kd_medium_best_split(KdMediumShared& sh, int r,
                                                              const float* nlo, const float* nhi,
                                                              const KdLoopSettings& cfg)
{
    const unsigned full = 0xffffffffu;
    KdSmallSplit best = {__longlong_as_double((long long)KD_INF_BITS), 3, 0.0f, KD_SIDE_LEFT};
    double ext[3];
    for (int k = 0; k < 3; ++k) ext[k] = __dsub_rn((double)nhi[k], (double)nlo[k]);
    const double area = kd_half_area(ext[0], ext[1], ext[2]);
    const int longest = kd_longest_axis(nlo, nhi, 0);
#pragma unroll 1
    for (int axis = 0; axis < 3; ++axis) {
        if (cfg.longest_only && axis != longest) continue;
        const float lo_k = kd_pick3(nlo, axis), hi_k = kd_pick3(nhi, axis);
        const float* lo_a = sh.lo[axis];
        const float* hi_a = sh.hi[axis];
        // the candidates' range (a node without candidates on the axis skips it)
        float m0 = KD_MEDIUM_INF, m1 = -KD_MEDIUM_INF;
        for (int i = threadIdx.x; i < r; i += KD_MEDIUM_BLOCK) {
            const float a = lo_a[i], b = hi_a[i];
            if (a > lo_k && a < hi_k) m0 = fminf(m0, a), m1 = fmaxf(m1, a);
            if (b > lo_k && b < hi_k) m0 = fminf(m0, b), m1 = fmaxf(m1, b);
        }
        for (int b = threadIdx.x; b <= KD_MEDIUM_BUCKETS; b += KD_MEDIUM_BLOCK)
            sh.count[b] = sh.count_planar[b] = 0;
        kd_block_min_max(m0, m1, sh.range);
        if (!(m0 <= m1)) continue;  // (uniform)
        const float span = __fsub_rn(m1, m0);
        const float scale = span > 0.0f
                                ? __fdiv_rn((float)(KD_MEDIUM_BUCKETS - 2), span) : 0.0f;
        // each value's place in its bucket (lows | highs << 16, planar positions)
        unsigned at[KD_MEDIUM_PER_THREAD], at_planar[KD_MEDIUM_PER_THREAD];
        int b_lo[KD_MEDIUM_PER_THREAD], b_hi[KD_MEDIUM_PER_THREAD];
#pragma unroll
        for (int q = 0; q < KD_MEDIUM_PER_THREAD; ++q) {
            const int i = threadIdx.x + q * KD_MEDIUM_BLOCK;
            at[q] = at_planar[q] = 0;
            b_lo[q] = b_hi[q] = 0;
            if (i < r) {
                const float a = lo_a[i], b = hi_a[i];
                b_lo[q] = kd_medium_bucket(a, m0, m1, scale);
                b_hi[q] = kd_medium_bucket(b, m0, m1, scale);
                at[q] = (atomicAdd(&sh.count[b_lo[q]], 1u) & 0xffffu)
                        | (atomicAdd(&sh.count[b_hi[q]], 1u << 16) & 0xffff0000u);
                if (a == b) at_planar[q] = atomicAdd(&sh.count_planar[b_lo[q]], 1u);
            }
        }
        __syncthreads();
        // where each bucket's values begin: an exclusive scan of the three
        // counts packed in a word (no field carries: each sums to at most r),
        // stored back as the counts were
        constexpr int PER = KD_MEDIUM_BUCKETS / KD_MEDIUM_BLOCK;
        unsigned long long c[PER], sum = 0;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const unsigned w = sh.count[PER * threadIdx.x + j];
            c[j] = (w & 0xffffu) | (unsigned long long)(w >> 16) << KD_MEDIUM_FIELD
                   | (unsigned long long)sh.count_planar[PER * threadIdx.x + j]
                         << (2 * KD_MEDIUM_FIELD);
            sum += c[j];
        }
        long long total;
        unsigned long long before =
            (unsigned long long)kd_block_exclusive_scan<KD_MEDIUM_BLOCK>((long long)sum, &total);
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            kd_medium_set_start(sh, PER * threadIdx.x + j, before);
            before += c[j];
        }
        if (threadIdx.x == 0) kd_medium_set_start(sh, KD_MEDIUM_BUCKETS, total);
        __syncthreads();
#pragma unroll
        for (int q = 0; q < KD_MEDIUM_PER_THREAD; ++q) {
            const int i = threadIdx.x + q * KD_MEDIUM_BLOCK;
            if (i >= r) continue;
            const float a = lo_a[i], b = hi_a[i];
            sh.by_lo[(sh.count[b_lo[q]] & 0xffffu) + (at[q] & 0xffffu)] = a;
            sh.by_hi[(sh.count[b_hi[q]] >> 16) + (at[q] >> 16)] = b;
            if (a == b) sh.by_planar[sh.count_planar[b_lo[q]] + at_planar[q]] = a;
        }
        __syncthreads();
        for (int c2 = threadIdx.x; c2 < 2 * r; c2 += KD_MEDIUM_BLOCK) {
            const int t = c2 >> 1;
            const float p = c2 & 1 ? hi_a[t] : lo_a[t];
            if ((c2 & 1) && p == lo_a[t]) continue;  // planar: one event
            if (!(p > lo_k && p < hi_k)) continue;
            const int bp = kd_medium_bucket(p, m0, m1, scale);
            const unsigned s0 = sh.count[bp], s1 = sh.count[bp + 1];
            int n_left = (int)(s0 & 0xffffu);
            for (int j = n_left; j < (int)(s1 & 0xffffu); ++j) n_left += sh.by_lo[j] < p;
            int n_closed = (int)(s0 >> 16);
            for (int j = n_closed; j < (int)(s1 >> 16); ++j) n_closed += sh.by_hi[j] <= p;
            int n_planar = 0;
            for (int j = sh.count_planar[bp]; j < (int)sh.count_planar[bp + 1]; ++j)
                n_planar += sh.by_planar[j] == p;
            kd_small_consider(best, ext, area, axis, lo_k, hi_k, p, n_left, n_planar,
                              (long long)(r - n_closed), cfg);
        }
        __syncthreads();  // (the next axis fills the buckets again)
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        KdSmallSplit other = {__shfl_xor_sync(full, best.cost, offset),
                              __shfl_xor_sync(full, best.axis, offset),
                              __shfl_xor_sync(full, best.pos, offset),
                              __shfl_xor_sync(full, best.side, offset)};
        if (kd_small_better(other.cost, other.axis, other.pos, best.cost, best.axis, best.pos))
            best = other;
    }
    if ((threadIdx.x & 31) == 0) sh.warp_best[threadIdx.x >> 5] = best;
    __syncthreads();
    best = sh.warp_best[0];
    for (int w = 1; w < KD_MEDIUM_BLOCK / 32; ++w) {
        const KdSmallSplit other = sh.warp_best[w];
        if (kd_small_better(other.cost, other.axis, other.pos, best.cost, best.axis, best.pos))
            best = other;
    }
    return best;
}

// A node of KD_SMALL_MAX_REFS + 1 .. KD_MEDIUM_MAX_REFS references (or a
// deferred one), one block: kd_small_wide_node's steps, rule for rule, with
// the references in shared memory. Every thread of the block calls it.
__device__ __forceinline__ void kd_medium_node(const KdSmallLevel& L, const int* rec_words,
                                               const KdLoopSettings& cfg, KdMediumShared& sh)
{
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned lanes_below = (1u << lane) - 1u;
    const KdSmallRecord rec = kd_small_read_record(rec_words);
    const int r = rec.count;
    __syncthreads();  // (the previous node's threads are done with sh)
    for (int i = threadIdx.x; i < r; i += KD_MEDIUM_BLOCK) {
        const int t = L.in_refs[rec.start + i];
        sh.tri[i] = t;
        for (int k = 0; k < 3; ++k) {
            sh.lo[k][i] = L.tri_lo[3 * t + k];
            sh.hi[k][i] = L.tri_hi[3 * t + k];
        }
    }
    __syncthreads();
    KdSmallSplit best = {0.0, 3, 0.0f, KD_SIDE_LEFT};
    if (rec.depth < cfg.max_depth && r > cfg.leaf_size)
        best = kd_medium_best_split(sh, r, rec.lo, rec.hi, cfg);
    const bool split = best.axis < 3 && best.cost < __dmul_rn(cfg.k_intersect, (double)r);
    // a root's level-loop leaf is replaced: its entries become unused
    if (threadIdx.x == 0 && L.level == 0)
        atomicAdd(L.counters + KD_SMALL_HOLES, (unsigned long long)r);
    if (!split) {
        if (threadIdx.x == 0)
            sh.slots[0] = L.leaves_before + atomicAdd(L.row + KD_SMALL_LEVEL_LEAVES,
                                                      (unsigned long long)r);
        __syncthreads();
        const unsigned long long first = sh.slots[0];
        if (first + r > (unsigned long long)L.leaf_capacity) {
            if (threadIdx.x == 0) kd_small_full(L, KD_SMALL_FULL_LEAVES);
            return;  // (block-uniform: the level's other nodes still count their needs)
        }
        for (int i = threadIdx.x; i < r; i += KD_MEDIUM_BLOCK) *L.tree.leaf(first + i) = sh.tri[i];
        if (threadIdx.x == 0) {
            L.tree.set_node(rec.node, KD_AXIS_LEAF, 0.0f, (int)first, r);
            atomicMax(L.counters + KD_SMALL_DEPTH, (unsigned long long)rec.depth);
        }
        return;
    }
    // classify_triangles (R9)
    const float* lo_a = sh.lo[best.axis];
    const float* hi_a = sh.hi[best.axis];
    int num_left = 0, num_right = 0;
    for (int base = 0; base < r; base += KD_MEDIUM_BLOCK) {
        const int i = base + threadIdx.x;
        const unsigned cls = i < r ? kd_class_of(lo_a[i], hi_a[i], best.pos, best.side) : 0;
        num_left += __syncthreads_count(cls & KD_CLASS_LEFT);
        num_right += __syncthreads_count(cls & KD_CLASS_RIGHT);
    }
    const int counts[2] = {num_left, num_right};
    int live = 0, back = 0, medium = 0;
    for (int side = 0; side < 2; ++side) {
        medium += counts[side] > KD_SMALL_MAX_REFS;
        live += counts[side] > 0 && counts[side] <= KD_SMALL_MAX_REFS;
        back += counts[side] > 0 && counts[side] <= KD_SMALL_TINY_REFS;
    }
    if (threadIdx.x == 0) {
        sh.slots[0] = L.nodes_before + atomicAdd(L.row + KD_SMALL_LEVEL_NODES, 2ull);
        sh.slots[1] = live ? atomicAdd(L.next + KD_SMALL_LEVEL_RECORDS,
                                       (unsigned long long)(live - back)
                                           | (unsigned long long)back
                                                 << KD_SMALL_RECORDS_BACK_SHIFT)
                           : 0ull;
        sh.slots[2] = medium ? atomicAdd(L.next + KD_SMALL_LEVEL_MEDIUM, (unsigned long long)medium)
                             : 0ull;
        sh.slots[3] = atomicAdd(L.next + KD_SMALL_LEVEL_REFS,
                                (unsigned long long)(num_left + num_right));
    }
    __syncthreads();
    const unsigned long long child = sh.slots[0], slot = sh.slots[1], first = sh.slots[3];
    const long long medium_at = (long long)sh.slots[2];
    const unsigned long long full_bits = kd_small_split_full(
        L, child, slot, live, medium_at + medium, first + num_left + num_right);
    if (full_bits) {
        if (threadIdx.x == 0) kd_small_full(L, full_bits);
        return;
    }
    // the children's references in the node's order: the left ones, then the right ones
    int left = 0, right = 0;
    for (int base = 0; base < r; base += KD_MEDIUM_BLOCK) {
        const int i = base + threadIdx.x;
        const unsigned cls = i < r ? kd_class_of(lo_a[i], hi_a[i], best.pos, best.side) : 0;
        const unsigned to_left = __ballot_sync(full, cls & KD_CLASS_LEFT);
        const unsigned to_right = __ballot_sync(full, cls & KD_CLASS_RIGHT);
        if (lane == 0) {
            sh.warp_count[0][warp] = __popc(to_left);
            sh.warp_count[1][warp] = __popc(to_right);
        }
        __syncthreads();
        int at_left = left + __popc(to_left & lanes_below);
        int at_right = right + __popc(to_right & lanes_below);
        for (int w = 0; w < KD_MEDIUM_BLOCK / 32; ++w) {
            const int a = sh.warp_count[0][w], b = sh.warp_count[1][w];
            at_left += w < warp ? a : 0;
            at_right += w < warp ? b : 0;
            left += a;
            right += b;
        }
        if (cls & KD_CLASS_LEFT) L.out_refs[first + at_left] = sh.tri[i];
        if (cls & KD_CLASS_RIGHT) L.out_refs[first + num_left + at_right] = sh.tri[i];
        __syncthreads();  // (the counts are written again)
    }
    if (threadIdx.x == 0) {
        const int deepest = kd_small_children(L, rec, best.axis, best.pos, (long long)child, slot,
                                               medium_at, first, num_left, num_right);
        if (deepest >= 0) atomicMax(L.counters + KD_SMALL_DEPTH, (unsigned long long)deepest);
    }
}
