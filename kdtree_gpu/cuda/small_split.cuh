// The best plane of a small node of the subtree stage (rules R4-R8 for at most
// KD_SMALL_MAX_REFS references, without events): a warp per node
// (kd_small_best_split) or a thread per node of at most KD_SMALL_TINY_REFS
// (kd_tiny_best_split). Part of build_small.cu, which includes it.
//
// With at most 64 references a node's events need no sort. The run-head
// counts of kd_split_cost_event, for a plane p of an axis, are
//   N_L = opens before p        = #{t : lo_t <  p}
//   N_P = planars at p          = #{t : lo_t == hi_t == p}
//   N_R = N - closes up to p    = N - #{t : hi_t <= p}
// (an event is END at hi, START at lo, or PLANAR at lo == hi), counted for
// each candidate over all the node's references. The candidates are the run
// heads: each distinct event position inside the node's box. The best plane
// is the minimum of (cost, axis, position), which is the level stages'
// choice: the lowest event index of an axis' minimum cost is its lowest
// position, and the lower axis wins ties.
#pragma once
#include "build_stages.cuh"

#define KD_SMALL_PER_LANE (KD_SMALL_MAX_REFS / 32)

__device__ __forceinline__ bool kd_small_better(double c, int axis, float p, double best_c,
                                                int best_axis, float best_p)
{
    return c < best_c || (c == best_c && (axis < best_axis || (axis == best_axis && p < best_p)));
}

// v[k] for a run-time k without an indexed (local-memory) load.
__device__ __forceinline__ float kd_pick3(const float* v, int k)
{
    return k == 0 ? v[0] : (k == 1 ? v[1] : v[2]);
}

struct KdSmallSplit {
    double cost;
    int axis;  // 3: no candidate plane
    float pos;
    int side;
};

// No plane yet: any candidate's cost is below it.
__device__ __forceinline__ KdSmallSplit kd_small_no_split()
{
    return {__longlong_as_double((long long)KD_INF_BITS), 3, 0.0f, KD_SIDE_LEFT};
}

// What every candidate of a node's box needs: its extents and half area (float64)
// and its longest axis.
struct KdSmallBox {
    double ext[3];
    double area;
    int longest;
};

__device__ __forceinline__ KdSmallBox kd_small_box(const float* nlo, const float* nhi)
{
    KdSmallBox b;
    for (int k = 0; k < 3; ++k) b.ext[k] = __dsub_rn((double)nhi[k], (double)nlo[k]);
    b.area = kd_half_area(b.ext[0], b.ext[1], b.ext[2]);
    b.longest = kd_longest_axis(nlo, nhi, 0);
    return b;
}

// The best of the warp's lanes' planes, in every lane.
__device__ __forceinline__ KdSmallSplit kd_small_warp_best(KdSmallSplit best)
{
    const unsigned full = 0xffffffffu;
    for (int offset = 16; offset > 0; offset >>= 1) {
        KdSmallSplit other = {__shfl_xor_sync(full, best.cost, offset),
                              __shfl_xor_sync(full, best.axis, offset),
                              __shfl_xor_sync(full, best.pos, offset),
                              __shfl_xor_sync(full, best.side, offset)};
        if (kd_small_better(other.cost, other.axis, other.pos, best.cost, best.axis, best.pos))
            best = other;
    }
    return best;
}

// A plane's cost and side against the best so far: the lowest (cost, axis,
// position) wins, whichever order the candidates come in.
__device__ __forceinline__ void kd_small_take(KdSmallSplit& best, double cost, int axis, float p,
                                              int side)
{
    if ((unsigned long long)__double_as_longlong(cost) == KD_INF_BITS) return;
    if (kd_small_better(cost, axis, p, best.cost, best.axis, best.pos))
        best = {cost, axis, p, side};
}

// Plane p of an axis with its run-head counts, against the best so far.
__device__ __forceinline__ void kd_small_consider(KdSmallSplit& best, const double* ext,
                                                  double area, int axis, float lo_k, float hi_k,
                                                  float p, long long n_left, long long n_planar,
                                                  long long n_right, const KdLoopSettings& cfg)
{
    int side;
    const double cost = kd_plane_cost(ext, area, axis, lo_k, hi_k, p, n_left, n_planar, n_right,
                                      cfg.k_traversal, cfg.k_intersect, cfg.empty_bonus, &side);
    kd_small_take(best, cost, axis, p, side);
}

// The run-head counts of this lane's candidates on one axis over the node's r
// references: candidate c is lo (c even) or hi (c odd) of reference c / 2 of
// the lane's NQ (lo_a, hi_a: the references' bounds on the axis, lane l
// holding references l + 32 q; row[j]: reference j's pair, in shared memory).
// n_lo_cl[c]: opens before p in the low 16 bits,
// closes up to p in the high ones (r <= 64); n_pl[c]: planars at p, counted
// only when some reference of the node is planar on the axis (PLANAR). The
// source loop runs over valid references only, and its body is a few
// instructions: it is the kernel's hot loop, unrolled four times as measured
// fastest against the compiler's own choice and two or eight (H200, profiled
// subtree stage, two fresh processes each: conference 1.85-1.92 to 1.57-1.62
// ms, armadillo subdivided twice 12.35-12.38 to 11.27-11.33, the bunny 0.93
// to 0.94-0.95, and 0.93 to 0.90 in four more rounds; twice: 1.66-1.69,
// 11.44-11.51, 0.90-0.92; eight times: 1.79-1.88, 11.66-11.68, 0.93-0.99;
// benchmarks/results/subtree_count_unroll_h200.md).
template <int NQ, bool PLANAR>
__device__ __forceinline__ void kd_small_count(const float* lo_a, const float* hi_a, int r,
                                               const float2* row, int* n_lo_cl, int* n_pl)
{
#pragma unroll
    for (int c = 0; c < 2 * NQ; ++c) n_lo_cl[c] = n_pl[c] = 0;
#pragma unroll
    for (int q = 0; q < NQ; ++q) {
        const int count = min(32, r - 32 * q);
#pragma unroll 4
        for (int src = 0; src < count; ++src) {
            // (every lane reads the same word: one broadcast load for both bounds)
            const float2 t = row[32 * q + src];
            const float t_lo = t.x, t_hi = t.y;
#pragma unroll
            for (int c = 0; c < 2 * NQ; ++c) {
                const float p = c & 1 ? hi_a[c >> 1] : lo_a[c >> 1];
                n_lo_cl[c] += (t_lo < p ? 1 : 0) + (t_hi <= p ? 0x10000 : 0);
                if (PLANAR) n_pl[c] += t_lo == t_hi && t_lo == p;
            }
        }
    }
}

// compute_split_costs and select_best_splits (R4-R8) for one node of r <= 64
// references, lane l holding references l and l + 32 (tri < 0: none). Every
// lane of the warp calls it and gets the node's best plane. The axis loop is
// not unrolled (the kernel's code must fit the instruction cache: with three
// copies of the counting loops its warps mostly waited for instructions);
// values of the axis are picked with selects, not indexed loads.
__device__ __forceinline__ KdSmallSplit kd_small_best_split(
    const int* tri, const float (*blo)[3], const float (*bhi)[3], int r, const float* nlo,
    const float* nhi, const KdLoopSettings& cfg)
{
    const unsigned full = 0xffffffffu;
    KdSmallSplit best = kd_small_no_split();
    const KdSmallBox box = kd_small_box(nlo, nhi);
    const bool two = r > 32;  // the same in every lane
    // the node's bounds on the axis, (lo, hi) of reference j at row[j], for the
    // count: one broadcast load where two shuffles an iteration were (H200,
    // subtree stage 1-3% faster: benchmarks/results/subtree_row_h200.md)
    __shared__ float2 rows[KD_SMALL_BLOCK / 32][KD_SMALL_MAX_REFS];
    float2* row = rows[threadIdx.x >> 5];
#pragma unroll 1
    for (int axis = 0; axis < 3; ++axis) {
        if (cfg.longest_only && axis != box.longest) continue;
        float lo_a[KD_SMALL_PER_LANE], hi_a[KD_SMALL_PER_LANE];
        bool planar = false;
        __syncwarp();  // (the last axis's count has read the row)
#pragma unroll
        for (int q = 0; q < KD_SMALL_PER_LANE; ++q) {
            lo_a[q] = kd_pick3(blo[q], axis);
            hi_a[q] = kd_pick3(bhi[q], axis);
            planar |= tri[q] >= 0 && lo_a[q] == hi_a[q];
            row[32 * q + (threadIdx.x & 31)] = make_float2(lo_a[q], hi_a[q]);
        }
        __syncwarp();  // (the row's stores before the count's loads)
        planar = __any_sync(full, planar);
        int n_lo_cl[2 * KD_SMALL_PER_LANE], n_pl[2 * KD_SMALL_PER_LANE];
        if (two) {
            if (planar) kd_small_count<2, true>(lo_a, hi_a, r, row, n_lo_cl, n_pl);
            else kd_small_count<2, false>(lo_a, hi_a, r, row, n_lo_cl, n_pl);
        } else {
            if (planar) kd_small_count<1, true>(lo_a, hi_a, r, row, n_lo_cl, n_pl);
            else kd_small_count<1, false>(lo_a, hi_a, r, row, n_lo_cl, n_pl);
            n_lo_cl[2] = n_lo_cl[3] = n_pl[2] = n_pl[3] = 0;
        }
        const float lo_k = kd_pick3(nlo, axis), hi_k = kd_pick3(nhi, axis);
#pragma unroll
        for (int c = 0; c < 2 * KD_SMALL_PER_LANE; ++c) {
            const int q = c >> 1;
            if (tri[q] < 0) continue;
            const float p = c & 1 ? hi_a[q] : lo_a[q];
            if ((c & 1) && p == lo_a[q]) continue;  // planar: one event
            if (!(p > lo_k && p < hi_k)) continue;
            kd_small_consider(best, box.ext, box.area, axis, lo_k, hi_k, p, n_lo_cl[c] & 0xffff,
                              n_pl[c], (long long)r - (n_lo_cl[c] >> 16), cfg);
        }
    }
    return kd_small_warp_best(best);
}

// v[k] of an array of KD_SMALL_TINY_REFS for a run-time k, by selects on k's
// bits: a tree three deep, not a chain of seven (each select waits for the last).
static_assert(KD_SMALL_TINY_REFS == 8, "kd_pick_tiny selects on three bits");
__device__ __forceinline__ float kd_pick_tiny(const float* v, int k)
{
    const bool b0 = k & 1, b1 = k & 2, b2 = k & 4;
    const float a0 = b0 ? v[1] : v[0], a1 = b0 ? v[3] : v[2];
    const float a2 = b0 ? v[5] : v[4], a3 = b0 ? v[7] : v[6];
    return b2 ? (b1 ? a3 : a2) : (b1 ? a1 : a0);
}

// The run-head counts of plane p over a tiny node's references (those past r
// are +inf: they count nowhere), as kd_small_count's.
struct KdTinyCounts {
    int left, closed, planar;
};

__device__ __forceinline__ KdTinyCounts kd_tiny_count(const float* lo_a, const float* hi_a,
                                                      float p)
{
    KdTinyCounts n = {0, 0, 0};
#pragma unroll
    for (int t = 0; t < KD_SMALL_TINY_REFS; ++t) {
        n.left += lo_a[t] < p;
        n.closed += hi_a[t] <= p;
        n.planar += lo_a[t] == hi_a[t] && lo_a[t] == p;
    }
    return n;
}

// The same choice for a node of r <= KD_SMALL_TINY_REFS references held by one
// thread (tri[q], q < r): the counts of each candidate over all r references,
// as kd_small_count's. Most of a tree's small nodes hold two to six references
// (H100, 5.5M triangles: 2.5-6.5 on average from the sixth subtree level on),
// and a warp per such node left most of its lanes idle. Only the count over
// the references is unrolled: with the candidates unrolled too, the kernel's
// warps mostly waited for instructions (H100: 63% of their stalls).
__device__ __forceinline__ KdSmallSplit kd_tiny_best_split(const int* tri,
                                                           const float* __restrict__ tri_lo,
                                                           const float* __restrict__ tri_hi,
                                                           int r, const float* nlo,
                                                           const float* nhi,
                                                           const KdLoopSettings& cfg)
{
    KdSmallSplit best = kd_small_no_split();
    const KdSmallBox box = kd_small_box(nlo, nhi);
#pragma unroll 1
    for (int axis = 0; axis < 3; ++axis) {
        if (cfg.longest_only && axis != box.longest) continue;
        // references past r are +inf on both ends (bits: NVRTC has no INFINITY): they count nowhere
        float lo_a[KD_SMALL_TINY_REFS], hi_a[KD_SMALL_TINY_REFS];
#pragma unroll
        for (int q = 0; q < KD_SMALL_TINY_REFS; ++q) {
            lo_a[q] = q < r ? tri_lo[3 * tri[q] + axis] : __int_as_float(0x7f800000);
            hi_a[q] = q < r ? tri_hi[3 * tri[q] + axis] : __int_as_float(0x7f800000);
        }
        const float lo_k = kd_pick3(nlo, axis), hi_k = kd_pick3(nhi, axis);
        // The candidates first, as bits 2q (lo) and 2q + 1 (hi) of reference q:
        // a plane strictly inside the box, and a planar reference's one event.
        // A thread then visits its own candidates only: most of a tiny node's
        // bounds lie on or outside its box, and a loop over all 2r of them ran
        // its body with 7 of a warp's 32 lanes (H100, ncu, 5.5M triangles).
        unsigned todo = 0;
#pragma unroll
        for (int q = 0; q < KD_SMALL_TINY_REFS; ++q) {
            const bool live = q < r;
            todo |= (unsigned)(live && lo_a[q] > lo_k && lo_a[q] < hi_k) << (2 * q);
            todo |= (unsigned)(live && hi_a[q] != lo_a[q] && hi_a[q] > lo_k && hi_a[q] < hi_k)
                    << (2 * q + 1);
        }
        // Two candidates an iteration (the second a copy of the first where
        // none is left): their counts and float64 costs are two independent
        // chains of dependent instructions, which one thread's node otherwise
        // runs one after the other (the kernel's warps mostly waited on
        // fixed-latency dependencies: H100, ncu, 5.5M triangles). Measured
        // gain small: the stage 2% faster at 5.5M triangles, the same below
        // (H200); 114 registers, still four blocks a multiprocessor.
#pragma unroll 1
        while (todo) {
            const int c0 = __ffs(todo) - 1;
            todo &= todo - 1;
            const bool two = todo != 0;
            const int c1 = two ? __ffs(todo) - 1 : c0;
            todo &= todo - 1;
            // (selects: no indexed register array)
            const float p0 = c0 & 1 ? kd_pick_tiny(hi_a, c0 >> 1) : kd_pick_tiny(lo_a, c0 >> 1);
            const float p1 = c1 & 1 ? kd_pick_tiny(hi_a, c1 >> 1) : kd_pick_tiny(lo_a, c1 >> 1);
            const KdTinyCounts n0 = kd_tiny_count(lo_a, hi_a, p0);
            const KdTinyCounts n1 = kd_tiny_count(lo_a, hi_a, p1);
            int side0, side1;
            const double cost0 = kd_plane_cost(box.ext, box.area, axis, lo_k, hi_k, p0, n0.left,
                                               n0.planar, (long long)(r - n0.closed),
                                               cfg.k_traversal, cfg.k_intersect,
                                               cfg.empty_bonus, &side0);
            const double cost1 = kd_plane_cost(box.ext, box.area, axis, lo_k, hi_k, p1, n1.left,
                                               n1.planar, (long long)(r - n1.closed),
                                               cfg.k_traversal, cfg.k_intersect,
                                               cfg.empty_bonus, &side1);
            kd_small_take(best, cost0, axis, p0, side0);
            if (two) kd_small_take(best, cost1, axis, p1, side1);
        }
    }
    return best;
}
