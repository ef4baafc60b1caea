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
// (events are sorted by segment, so a segment's lanes are contiguous); the
// first lane of each run then makes one atomicMin for the whole run.
// Lanes past the end pass seg = -1 and take part in the shuffles only.
__device__ __forceinline__ void kd_warp_segmented_atomic_min(unsigned long long key, int seg,
                                                             unsigned long long* target)
{
    const unsigned full = 0xffffffffu;
    int lane = threadIdx.x & 31;
    for (int offset = 1; offset < 32; offset <<= 1) {
        unsigned long long other = __shfl_down_sync(full, key, offset);
        int other_seg = __shfl_down_sync(full, seg, offset);
        if (lane + offset < 32 && other_seg == seg && other < key) key = other;
    }
    int prev_seg = __shfl_up_sync(full, seg, 1);
    bool run_head = lane == 0 || prev_seg != seg;
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
// costs take no memory of their own; halves restore the exact bits. With lo null
// (the per-stage path), hi holds each cost's key (kd_cost_key) instead.
struct KdEventCosts {
    unsigned int* hi;
    unsigned int* lo;
    __device__ __forceinline__ void store(long long e, double cost) const;
    __device__ __forceinline__ unsigned long long bits(long long e) const
    {
        return ((unsigned long long)hi[e] << 32) | lo[e];
    }
    __device__ __forceinline__ double load(long long e) const
    {
        return __longlong_as_double((long long)bits(e));
    }
};

// A cost's 32-bit key: the float32 at or below it, as bits. Rounding down keeps
// the order (a >= b gives key(a) >= key(b), and costs are >= 0, whose float32
// bits order as the values do), so a segment's minimum cost shares its key only
// with costs within a float32 step of it: the arg-min computes those again.
// (The float64's high word would do as well, with 8 times as many such ties on
// the flat bottom of a large segment's cost curve.)
__device__ __forceinline__ unsigned int kd_cost_key(double cost)
{
    return __float_as_uint(__double2float_rd(cost));
}

__device__ __forceinline__ void KdEventCosts::store(long long e, double cost) const
{
    if (!lo) {  // the key only
        hi[e] = kd_cost_key(cost);
        return;
    }
    unsigned long long bits = (unsigned long long)__double_as_longlong(cost);
    hi[e] = (unsigned int)(bits >> 32);
    lo[e] = (unsigned int)bits;
}

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
    KdEventCosts event_cost;   // hi null: not stored; lo null: keys only
    signed char* event_side;   // null: not stored
    unsigned long long* seg_min_cost;
    // Non-null: the arg-min pass (the per-stage path stores the costs' keys only,
    // event_cost.lo null): the lowest event index whose cost is its segment's
    // minimum (as kd_argmin_event) into seg_best, each cost computed again where
    // its key equals the minimum's; seg_min_cost is only read.
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
    if (a.seg_best) {  // the arg-min pass (uniform across the warp)
        unsigned long long best = KD_NO_INDEX;
        if (live) {
            unsigned long long min_bits = a.seg_min_cost[seg];
            // the stored key rules out all but the minimum and its near-ties:
            // only those compute their cost again (stored halves give the key too,
            // so that the tests, which store them, run this same path)
            unsigned int key = a.event_cost.lo ? kd_cost_key(a.event_cost.load(e))
                                               : a.event_cost.hi[e];
            if (min_bits != KD_INF_BITS
                && key == kd_cost_key(__longlong_as_double((long long)min_bits))) {
                double c = kd_event_plane_cost(a, e, seg, &side);
                if ((unsigned long long)__double_as_longlong(c) == min_bits)
                    best = (unsigned long long)e;
            }
        }
        kd_warp_segmented_atomic_min(best, seg, a.seg_best);
        return;
    }
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
