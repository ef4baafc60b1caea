// The split-cost stages of the level-by-level builder (rules R4-R8): each
// event's segment, the SAH cost of every candidate plane with each segment's
// minimum, and the arg-min (part of build_stages.cuh, which includes it; the
// NumPy twins are compute_split_costs and select_best_splits in
// kdtree_gpu/builder/stages.py).
#pragma once
#include "common.cuh"
#include "sah.cuh"
#include "scan.cuh"

// Rule R4: nodes above the leaf size and above the maximum depth search for a split.
__device__ __forceinline__ bool kd_node_active(long long n_all, long long leaf_size,
                                               int level_active)
{
    return level_active && n_all > leaf_size;
}

// Rule R5 with axes="longest": the axis of the largest float64 extent, lowest on ties.
__device__ __forceinline__ int kd_longest_axis(const float* node_lo, const float* node_hi,
                                               long long node)
{
    int best = 0;
    double best_ext = -1.0;
    for (int k = 0; k < 3; ++k) {
        double ext = __dsub_rn((double)node_hi[3 * node + k], (double)node_lo[3 * node + k]);
        if (ext > best_ext) {
            best_ext = ext;
            best = k;
        }
    }
    return best;
}

// Minimum of `key` over each run of equal `seg` among the lanes of a warp
// (events are sorted by segment, so a segment's lanes are contiguous): the
// first lane of each run (run_head) gets its run's minimum. Lanes past the
// end pass seg = -1 and take part in the shuffles only.
__device__ __forceinline__ unsigned long long kd_warp_segmented_min(unsigned long long key,
                                                                    int seg, bool& run_head)
{
    const unsigned full = 0xffffffffu;
    int lane = threadIdx.x & 31;
    for (int offset = 1; offset < 32; offset <<= 1) {
        unsigned long long other = __shfl_down_sync(full, key, offset);
        int other_seg = __shfl_down_sync(full, seg, offset);
        if (lane + offset < 32 && other_seg == seg && other < key) key = other;
    }
    int prev_seg = __shfl_up_sync(full, seg, 1);
    run_head = lane == 0 || prev_seg != seg;
    return key;
}

// The same, each run's head then making one atomicMin of its run's minimum
// into target[seg].
__device__ __forceinline__ void kd_warp_segmented_atomic_min(unsigned long long key, int seg,
                                                             unsigned long long* target)
{
    bool run_head;
    key = kd_warp_segmented_min(key, seg, run_head);
    if (run_head && seg >= 0 && key != KD_NO_INDEX && key < target[seg]) atomicMin(target + seg, key);
}

// An event's segment axis * n + node: stored (seg; the per-stage path) or, seg null
// (the level loop keeps none: 8 bytes per event of capacity), derived: a level's events
// of one axis start at seg_event_offset[axis * n]; an event's node is its reference's.
struct KdEventSegment {
    const int* seg;
    const int* event_ref;
    const int* ref_node;
    const long long* seg_event_offset;
    long long num_nodes;
    __device__ __forceinline__ int axis(long long e) const
    {
        if (seg) return (int)(seg[e] / num_nodes);
        return (int)(e >= seg_event_offset[num_nodes])
               + (int)(e >= seg_event_offset[2 * num_nodes]);
    }
    // event e's segment, its node already known
    __device__ __forceinline__ int of(long long e, int node) const
    {
        return seg ? seg[e] : (int)(axis(e) * num_nodes + node);
    }
    __device__ __forceinline__ int operator()(long long e) const
    {
        return seg ? seg[e] : of(e, ref_node[event_ref[e]]);
    }
};

// The packed (opens, closes) value of event i - 1, and 0 for i = 0, so that the
// inclusive scan of n = E + 1 values is the exclusive scan of the events.
struct KdLoadOpenClose {
    const signed char* kind;
    __device__ long long operator()(long long i) const
    {
        if (i == 0) return 0;
        int k = kind[i - 1];
        return (long long)(k != KD_EVENT_END) | ((long long)(k != KD_EVENT_START) << 32);
    }
};

// A level's per-event costs: each float64 as its two 32-bit halves in two arrays
// of E words. The level loop keeps them in the next level's slot of event_ref and
// event_pos, which hold nothing between a level's cost pass and its scatter: the
// costs take no memory of their own; halves restore the exact bits. The
// per-stage path stores them only for the tests (hi null: not stored).
struct KdEventCosts {
    unsigned int* hi;
    unsigned int* lo;
    __device__ __forceinline__ void store(long long e, double cost) const
    {
        unsigned long long bits = (unsigned long long)__double_as_longlong(cost);
        hi[e] = (unsigned int)(bits >> 32);
        lo[e] = (unsigned int)bits;
    }
    __device__ __forceinline__ unsigned long long bits(long long e) const
    {
        return ((unsigned long long)hi[e] << 32) | lo[e];
    }
    __device__ __forceinline__ double load(long long e) const
    {
        return __longlong_as_double((long long)bits(e));
    }
};

// Part 2: the SAH cost of the plane at every run head (rules R5-R7), where a
// run is a maximal sequence of events at one position in one segment:
//   N_L = opens before the run, N_P = planars in the run,
//   N_R = N - closes up to the end of the run.
// The run's end is found by a binary search in the segment's sorted positions
// (one comparison for the usual run of one or two events).
// planars(0..i) = opens(0..i) + closes(0..i) - i, since each event is exactly
// one of END (closes), START (opens) or PLANAR (both).
struct KdCostArgs {
    const float* event_pos;
    KdEventSegment event_seg;
    KdPackedScan open_close_ex;
    const long long* seg_event_offset;
    const long long* node_ref_offset;
    const float* node_lo;
    const float* node_hi;
    long long num_nodes;
    long long num_events;
    long long leaf_size;
    int level_active;
    int longest_only;
    double k_traversal, k_intersect, empty_bonus;
    KdEventCosts event_cost;   // hi null: not stored
    signed char* event_side;   // null: not stored
    unsigned long long* seg_min_cost;
    // kd_split_cost_tile only: each segment's lowest event index at its minimum
    unsigned long long* seg_best;
};

// Event e's plane cost (+inf where e is no candidate) and side, e live and in
// segment seg.
__device__ __forceinline__ double kd_event_plane_cost(const KdCostArgs& a, long long e, int seg,
                                                      signed char* side_out)
{
    double cost = __longlong_as_double((long long)KD_INF_BITS);  // +inf: not a candidate
    signed char side = KD_SIDE_LEFT;
    int node = (int)(seg % a.num_nodes);
    int axis = (int)(seg / a.num_nodes);
    float p = a.event_pos[e];
    float lo_k = a.node_lo[3 * node + axis];
    float hi_k = a.node_hi[3 * node + axis];
    long long n_all = a.node_ref_offset[node + 1] - a.node_ref_offset[node];
    // a run starts its segment's events or follows another position
    long long seg_start = a.seg_event_offset[seg];
    bool head = e == seg_start || a.event_pos[e - 1] != p;
    if (head && kd_node_active(n_all, a.leaf_size, a.level_active) && p > lo_k && p < hi_k
        && (!a.longest_only || kd_longest_axis(a.node_lo, a.node_hi, node) == axis)) {
        long long seg_end = a.seg_event_offset[seg + 1];
        long long run_end = e + 1;
        if (run_end < seg_end && a.event_pos[run_end] == p) {
            // positions in [e, seg_end) are >= p and sorted: the run is
            // [e, b) with b the first index whose position exceeds p
            long long lo = run_end, hi = seg_end;
            while (hi - lo > 1) {
                long long m = lo + (hi - lo) / 2;
                if (a.event_pos[m] == p) lo = m; else hi = m;
            }
            run_end = hi;
        }
        long long oc_e = a.open_close_ex[e];
        long long oc_s = a.open_close_ex[seg_start];
        long long oc_r = a.open_close_ex[run_end];
        long long planar_e = KD_LOW(oc_e) + KD_HIGH(oc_e) - e;
        long long planar_r = KD_LOW(oc_r) + KD_HIGH(oc_r) - run_end;
        long long n_left = KD_LOW(oc_e) - KD_LOW(oc_s);
        long long n_planar = planar_r - planar_e;
        long long n_right = n_all - (KD_HIGH(oc_r) - KD_HIGH(oc_s));

        double lo[3], ext[3];
        for (int k = 0; k < 3; ++k) {
            lo[k] = (double)a.node_lo[3 * node + k];
            ext[k] = __dsub_rn((double)a.node_hi[3 * node + k], lo[k]);
        }
        double area = kd_half_area(ext[0], ext[1], ext[2]);
        int plane_side;
        cost = kd_plane_cost(ext, area, axis, lo_k, hi_k, p, n_left, n_planar, n_right,
                             a.k_traversal, a.k_intersect, a.empty_bonus, &plane_side);
        side = (signed char)plane_side;
    }
    *side_out = side;
    return cost;
}

// Event e's cost. Every lane of a warp must call it (e >= num_events for
// lanes past the end): they take part in the segmented minimum at the end.
__device__ __forceinline__ void kd_split_cost_event(const KdCostArgs& a, long long e)
{
    bool live = e < a.num_events;
    signed char side = KD_SIDE_LEFT;
    int seg = live ? a.event_seg(e) : -1;
    double cost = __longlong_as_double((long long)KD_INF_BITS);  // +inf: not a candidate
    if (live) {
        cost = kd_event_plane_cost(a, e, seg, &side);
        if (a.event_cost.hi) a.event_cost.store(e, cost);
        if (a.event_side) a.event_side[e] = side;
    }
    unsigned long long bits = (unsigned long long)__double_as_longlong(cost);
    kd_warp_segmented_atomic_min(live && bits != KD_INF_BITS ? bits : KD_NO_INDEX, seg,
                                 a.seg_min_cost);
}

// The cost pass with rule R8's arg-min (each segment's lowest event index at
// its minimum cost) in the same pass, for the tile of BLOCK events
// [t0, t0 + BLOCK) of one block (every thread calls it; thread t takes event
// t0 + t). Events are sorted by segment, so the tile holds runs of
// consecutive segments: the block finds each run's minimum, then its lowest
// index at that minimum, in shared memory. A segment wholly inside the tile
// is done here: its minimum and arg-min are stored (seg_min_cost and
// seg_best start at no candidate: a segment without events keeps that). Only
// the tile's first and last segments can reach past it: such a segment's
// tile minimum goes to seg_min_cost by atomicMin, and (segment, minimum,
// index) to the block's partial rows (two: the first segment's and the last
// one's; segment KD_NO_INDEX where none), which kd_argmin_partial keeps
// where the minimum is the segment's. (Two passes over the events, a cost
// pass and an arg-min pass that computed the near-minima again from stored
// 32-bit keys, took 33 ms of a 5.5M-triangle build on an H100.)
template <int BLOCK>
__device__ __forceinline__ void kd_split_cost_tile(const KdCostArgs& a, long long t0,
                                                   unsigned long long* partial)
{
    __shared__ unsigned long long tile_min[BLOCK];
    __shared__ unsigned long long tile_best[BLOCK];
    __shared__ int tile_seg[BLOCK];
    __shared__ int warp_heads[BLOCK / 32];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const long long e = t0 + t;
    const bool live = e < a.num_events;
    const int seg = live ? a.event_seg(e) : -1;
    signed char side = KD_SIDE_LEFT;
    double cost = __longlong_as_double((long long)KD_INF_BITS);  // +inf: not a candidate
    if (live) {
        cost = kd_event_plane_cost(a, e, seg, &side);
        if (a.event_cost.hi) a.event_cost.store(e, cost);
        if (a.event_side) a.event_side[e] = side;
    }
    const unsigned long long bits = (unsigned long long)__double_as_longlong(cost);
    const bool candidate = live && bits != KD_INF_BITS;
    tile_seg[t] = seg;
    tile_min[t] = KD_INF_BITS;
    tile_best[t] = KD_NO_INDEX;
    if (t < 2) partial[3 * (2 * (long long)blockIdx.x + t)] = KD_NO_INDEX;
    __syncthreads();
    // the tile's segments, numbered from 0 in order (a head starts one)
    const bool head = live && (t == 0 || tile_seg[t - 1] != seg);
    const unsigned heads = __ballot_sync(0xffffffffu, head);
    if (lane == 0) warp_heads[warp] = __popc(heads);
    __syncthreads();
    int local = __popc(heads & ((2u << lane) - 1u)) - 1, num_local = 0;
#pragma unroll
    for (int w = 0; w < BLOCK / 32; ++w) {
        local += w < warp ? warp_heads[w] : 0;
        num_local += warp_heads[w];
    }
    bool run_head;
    unsigned long long m = kd_warp_segmented_min(candidate ? bits : KD_NO_INDEX, seg, run_head);
    if (run_head && live && m != KD_NO_INDEX) atomicMin(tile_min + local, m);
    __syncthreads();
    const bool at_min = candidate && bits == tile_min[live ? local : 0];
    m = kd_warp_segmented_min(at_min ? (unsigned long long)e : KD_NO_INDEX, seg, run_head);
    if (run_head && live && m != KD_NO_INDEX) atomicMin(tile_best + local, m);
    __syncthreads();
    if (!head) return;
    const unsigned long long seg_min = tile_min[local], best = tile_best[local];
    const long long tile_end = t0 + BLOCK < a.num_events ? t0 + BLOCK : a.num_events;
    const bool from_before = t == 0 && a.seg_event_offset[seg] < t0;
    const bool on_after = local == num_local - 1 && a.seg_event_offset[seg + 1] > tile_end;
    if (!from_before && !on_after) {
        a.seg_min_cost[seg] = seg_min;
        a.seg_best[seg] = best;
    } else if (seg_min != KD_INF_BITS) {
        atomicMin(a.seg_min_cost + seg, seg_min);
        unsigned long long* row = partial + 3 * (2 * (long long)blockIdx.x + (from_before ? 0 : 1));
        row[0] = (unsigned long long)seg;
        row[1] = seg_min;
        row[2] = best;
    }
}

// After kd_split_cost_tile: a partial row's index is its segment's arg-min
// candidate where its minimum is the segment's (the lowest such index wins).
__device__ __forceinline__ void kd_argmin_partial(const unsigned long long* row,
                                                  const unsigned long long* seg_min_cost,
                                                  unsigned long long* seg_best)
{
    const unsigned long long seg = row[0];
    if (seg != KD_NO_INDEX && row[1] == seg_min_cost[seg]) atomicMin(seg_best + seg, row[2]);
}

// Stage select_best_splits, arg-min: the lowest event index whose cost equals
// its segment's minimum (lowest index = lowest position: rule R8's tie-break).
// Every lane of a warp must call it (as kd_split_cost_event).
__device__ __forceinline__ void kd_argmin_event(KdEventCosts event_cost,
                                                const KdEventSegment& event_seg,
                                                const unsigned long long* seg_min_cost,
                                                long long num_events,
                                                unsigned long long* seg_best, long long e)
{
    bool live = e < num_events;
    int seg = live ? event_seg(e) : -1;
    unsigned long long key = KD_NO_INDEX;
    if (live) {
        unsigned long long bits = event_cost.bits(e);
        if (bits != KD_INF_BITS && bits == seg_min_cost[seg]) key = (unsigned long long)e;
    }
    kd_warp_segmented_atomic_min(key, seg, seg_best);
}
