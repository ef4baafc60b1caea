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

// An event's segment axis * n + node: stored (seg; the per-stage path's large
// levels and perfect splits) or, seg null (the level loop keeps none: 4 bytes
// per event of capacity), derived from its node, its reference's. Either way a
// level's events of one axis start at seg_event_offset[axis * n], so the axis
// is two comparisons and a stored segment gives its node with no division and
// no gather through the reference (H100, ncu, a 5.5M-triangle build's staged
// cost pass: the two dependent loads of a derived segment held a fifth of its
// stall samples).
struct KdEventSegment {
    const int* seg;
    const int* event_ref;
    const int* ref_node;
    const long long* seg_event_offset;
    long long num_nodes;
    __device__ __forceinline__ int offset_axis(long long e) const
    {
        return (int)(e >= seg_event_offset[num_nodes])
               + (int)(e >= seg_event_offset[2 * num_nodes]);
    }
    // (kd_reference_boxes passes no offsets: a stored segment's axis is divided out)
    __device__ __forceinline__ int axis(long long e) const
    {
        return seg ? (int)(seg[e] / num_nodes) : offset_axis(e);
    }
    // Event e's segment, and its node and axis, where `known` is its node as
    // derived_node_of(e) gives it: the level loop's scatter loads that an
    // iteration ahead (kd_grid_for_events); a stored segment gives its own,
    // and `known` is not read.
    __device__ __forceinline__ int of_node(long long e, int known, int& node, int& ax) const
    {
        ax = offset_axis(e);
        if (seg) {
            const int s = seg[e];
            node = (int)(s - ax * num_nodes);
            return s;
        }
        node = known;
        return (int)(ax * num_nodes + node);
    }
    __device__ __forceinline__ int of(long long e, int& node, int& ax) const
    {
        return of_node(e, derived_node_of(e), node, ax);
    }
    // The segment alone (no node or axis asked: a stored one is one load).
    __device__ __forceinline__ int index(long long e) const
    {
        return seg ? seg[e] : (int)(offset_axis(e) * num_nodes + ref_node[event_ref[e]]);
    }
    // what of_node needs of an event of reference ref (0 where segments are stored)
    __device__ __forceinline__ int derived_node(int ref) const { return seg ? 0 : ref_node[ref]; }
    __device__ __forceinline__ int derived_node_of(long long e) const
    {
        return seg ? 0 : ref_node[event_ref[e]];
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

// A level's per-event costs as each float64's two 32-bit halves in two arrays
// of E words, stored only for the tests (kd_split_costs; hi null: not stored).
// The passes need none: each warp finds its segments' minima and arg-mins
// itself (kd_split_cost_warp).
struct KdEventCosts {
    unsigned int* hi;
    unsigned int* lo;
    __device__ __forceinline__ void store(long long e, double cost) const
    {
        unsigned long long bits = (unsigned long long)__double_as_longlong(cost);
        hi[e] = (unsigned int)(bits >> 32);
        lo[e] = (unsigned int)bits;
    }
};

// Part 2: the SAH cost of the plane at every run head (rules R5-R7), where a
// run is a maximal sequence of events at one position in one segment:
//   N_L = opens before the run, N_P = planars in the run,
//   N_R = N - closes up to the end of the run.
// The run's end is found by a search in the segment's sorted positions (one
// comparison for a run of one event; galloping, then bisecting, for longer runs).
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
    // each segment's minimum cost bits and its lowest event index at that
    // minimum, one 16-byte pair a segment (KdSegArgmin)
    unsigned long long* seg_argmin;
};

// The parameters of the cost passes (kd_split_costs, kd_split_costs_candidates)
// before and after their open/close scan (each pass's own form), and the
// KdCostArgs they make (SCAN: its open/close scan member).
#define KD_COST_HEAD_PARAMS                                                                  \
    const float *__restrict__ event_pos, const int *__restrict__ event_seg,                  \
        const int *__restrict__ event_ref, const int *__restrict__ ref_node
#define KD_COST_TAIL_PARAMS                                                                  \
    const long long *__restrict__ seg_event_offset,                                          \
        const long long *__restrict__ node_ref_offset, const float *__restrict__ node_lo,    \
        const float *__restrict__ node_hi, long long num_nodes, long long num_events,        \
        long long leaf_size, int level_active, int longest_only, double k_traversal,         \
        double k_intersect, double empty_bonus, unsigned int *__restrict__ event_cost_hi,    \
        unsigned int *__restrict__ event_cost_lo, signed char *__restrict__ event_side,      \
        unsigned long long *seg_argmin
#define KD_COST_ARGS(SCAN)                                                                   \
    {event_pos, {event_seg, event_ref, ref_node, seg_event_offset, num_nodes}, SCAN,         \
     seg_event_offset, node_ref_offset, node_lo, node_hi, num_nodes, num_events, leaf_size,  \
     level_active, longest_only, k_traversal, k_intersect, empty_bonus,                      \
     {event_cost_hi, event_cost_lo}, event_side, seg_argmin}

// What event e's candidate test and plane cost read of its node and segment
// (e live and in segment seg = axis * num_nodes + node).
struct KdEventPlane {
    float p, lo_k, hi_k;
    long long n_all, seg_start;
};

__device__ __forceinline__ KdEventPlane kd_event_plane(const KdCostArgs& a, long long e, int seg,
                                                       int node, int axis)
{
    KdEventPlane pl;
    pl.p = a.event_pos[e];
    pl.lo_k = a.node_lo[3 * node + axis];
    pl.hi_k = a.node_hi[3 * node + axis];
    pl.n_all = a.node_ref_offset[node + 1] - a.node_ref_offset[node];
    pl.seg_start = a.seg_event_offset[seg];
    return pl;
}

// Rules R4-R5: event e is a candidate plane where it heads a run (it starts
// its segment's events or follows another position), its node may split, the
// plane lies strictly inside the node's box and, with axes="longest", on its
// longest axis.
__device__ __forceinline__ bool kd_event_candidate(const KdCostArgs& a, long long e, int node,
                                                   int axis, const KdEventPlane& pl)
{
    bool head = e == pl.seg_start || a.event_pos[e - 1] != pl.p;
    return head && kd_node_active(pl.n_all, a.leaf_size, a.level_active) && pl.p > pl.lo_k
           && pl.p < pl.hi_k
           && (!a.longest_only || kd_longest_axis(a.node_lo, a.node_hi, node) == axis);
}

// Rules R6-R7: the cost of candidate e's plane and its side.
__device__ __forceinline__ double kd_candidate_cost(const KdCostArgs& a, long long e, int seg,
                                                    int node, int axis, const KdEventPlane& pl,
                                                    signed char* side_out)
{
    const float p = pl.p;
    long long seg_end = a.seg_event_offset[seg + 1];
    long long run_end = e + 1;
    if (run_end < seg_end && a.event_pos[run_end] == p) {
        // positions in [e, seg_end) are >= p and sorted: the run is
        // [e, b) with b the first index whose position exceeds p. Runs
        // are short (the events of the triangles that share a vertex),
        // so the search gallops from e + 1 in doubling steps, then
        // bisects the last step: about 2 log2 of the run's length
        // dependent loads, where bisecting [e + 1, seg_end) took log2 of
        // the segment's (H100, ncu, a 5.5M-triangle build's 9th staged
        // level: 16 loads, a third of the cost pass's stall samples).
        // Invariant: event_pos[lo] == p, and hi is seg_end or past p.
        long long lo = run_end, hi = seg_end, step = 1;
        while (lo + step < seg_end) {
            if (a.event_pos[lo + step] != p) {
                hi = lo + step;
                break;
            }
            lo += step;
            step <<= 1;
        }
        while (hi - lo > 1) {
            long long m = lo + (hi - lo) / 2;
            if (a.event_pos[m] == p) lo = m; else hi = m;
        }
        run_end = hi;
    }
    long long oc_e = a.open_close_ex[e];
    long long oc_s = a.open_close_ex[pl.seg_start];
    long long oc_r = a.open_close_ex[run_end];
    long long planar_e = KD_LOW(oc_e) + KD_HIGH(oc_e) - e;
    long long planar_r = KD_LOW(oc_r) + KD_HIGH(oc_r) - run_end;
    long long n_left = KD_LOW(oc_e) - KD_LOW(oc_s);
    long long n_planar = planar_r - planar_e;
    long long n_right = pl.n_all - (KD_HIGH(oc_r) - KD_HIGH(oc_s));

    double lo[3], ext[3];
    for (int k = 0; k < 3; ++k) {
        lo[k] = (double)a.node_lo[3 * node + k];
        ext[k] = __dsub_rn((double)a.node_hi[3 * node + k], lo[k]);
    }
    double area = kd_half_area(ext[0], ext[1], ext[2]);
    int plane_side;
    double cost = kd_plane_cost(ext, area, axis, pl.lo_k, pl.hi_k, p, n_left, n_planar, n_right,
                                a.k_traversal, a.k_intersect, a.empty_bonus, &plane_side);
    *side_out = (signed char)plane_side;
    return cost;
}

// Event e's plane cost (+inf where e is no candidate) and side, e live and in
// segment seg = axis * num_nodes + node.
__device__ __forceinline__ double kd_event_plane_cost(const KdCostArgs& a, long long e, int seg,
                                                      int node, int axis, signed char* side_out)
{
    double cost = __longlong_as_double((long long)KD_INF_BITS);  // +inf: not a candidate
    signed char side = KD_SIDE_LEFT;
    const KdEventPlane pl = kd_event_plane(a, e, seg, node, axis);
    if (kd_event_candidate(a, e, node, axis, pl))
        cost = kd_candidate_cost(a, e, seg, node, axis, pl, &side);
    *side_out = side;
    return cost;
}

// A segment's arg-min (rule R8): its minimum cost's bits, then its lowest
// event index at that minimum, as one 16-byte word. Costs are non-negative
// (or +inf), so their bits order as the costs do, and the pair compared as one
// 128-bit number (cost high, index low) orders by cost, then index: the
// smaller pair is R8's choice. A segment without a candidate keeps
// (KD_INF_BITS, KD_NO_INDEX).
struct __align__(16) KdSegArgmin {
    unsigned long long cost;
    unsigned long long index;
};

__device__ __forceinline__ void kd_seg_argmin_reset(unsigned long long* seg_argmin, long long s)
{
    reinterpret_cast<KdSegArgmin*>(seg_argmin)[s] = KdSegArgmin{KD_INF_BITS, KD_NO_INDEX};
}

// (cost, index) below pair `than` in R8's order (KdSegArgmin).
__device__ __forceinline__ bool kd_pair_less(unsigned long long cost, unsigned long long index,
                                             const KdSegArgmin& than)
{
    return cost < than.cost || (cost == than.cost && index < than.index);
}

// Lowers segment s's pair to (cost, index) where that is smaller, atomically
// (the 16-byte compare-and-swap of sm_90, on the pair itself: no __int128,
// which NVRTC takes only with an option): the parts of a segment that several
// warps cost meet here, and the pair is final when the pass is, with no
// second pass over partial results. A pair only decreases, so a cost above
// the one read (even a read torn between two writes: its cost half was the
// pair's once) can never win; a failed swap returns the pair atomically, and
// one no larger than (cost, index) ends the loop too, so that parts that
// meet a lower pair leave after one swap instead of swapping it back until
// the pair stops moving. The loop also ends at a swap that holds: one that
// puts (cost, index), or one that puts back a pair no larger.
__device__ __forceinline__ void kd_seg_argmin_lower(unsigned long long* seg_argmin, long long s,
                                                    unsigned long long cost,
                                                    unsigned long long index)
{
    KdSegArgmin* at = reinterpret_cast<KdSegArgmin*>(seg_argmin) + s;
    KdSegArgmin old = {((volatile KdSegArgmin*)at)->cost, ((volatile KdSegArgmin*)at)->index};
    if (cost > old.cost) return;
    for (;;) {
        const bool lower = kd_pair_less(cost, index, old);
        const KdSegArgmin was = atomicCAS(at, old, lower ? KdSegArgmin{cost, index} : old);
        if (was.cost == old.cost && was.index == old.index) return;
        old = was;
        if (!kd_pair_less(cost, index, old)) return;
    }
}

// The lowering a cost warp's parts of larger segments get where nothing
// gathers them first: kd_seg_argmin_lower on the level's pairs.
struct KdLowerGlobal {
    unsigned long long* seg_argmin;
    __device__ __forceinline__ void operator()(int seg, unsigned long long cost,
                                               unsigned long long index) const
    {
        kd_seg_argmin_lower(seg_argmin, seg, cost, index);
    }
};

// The arg-min half of a cost pass (rule R8), for a warp whose live lanes (the
// first num_live) hold items in ascending event order, sorted by segment: seg,
// and the cost bits where candidate. first: lane 0's event; end: one past the
// last live lane's event; event_of(src): lane src's event (every lane calls
// it). Shuffles give each run of equal segments its minimum, and a ballot its
// lowest lane at that minimum. A segment wholly inside the warp is done here:
// its pair is stored (the pairs start at no candidate: a segment without
// candidates keeps that). Only the warp's first and last runs can be parts of
// larger segments (their segment's events reach past first or end): such a
// part's (minimum, index) goes to lower(seg, minimum, index): its segment's
// pair lowered atomically (KdLowerGlobal), or gathered first where many warps
// of a block share the segment (kd_split_costs_candidates).
template <typename EventOf, typename Lower>
__device__ __forceinline__ void kd_warp_argmin(const KdCostArgs& a, int seg, bool live,
                                               bool candidate, unsigned long long bits,
                                               long long first, long long end, int num_live,
                                               EventOf event_of, Lower lower)
{
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    bool run_head;
    const unsigned long long m =
        kd_warp_segmented_min(candidate ? bits : KD_NO_INDEX, seg, run_head);
    const unsigned heads = __ballot_sync(full, run_head);
    // each lane's run: from the last head at or below it to the next head
    const unsigned run_min_lane = 31 - __clz(heads & ((2u << lane) - 1u));
    const unsigned long long run_min = __shfl_sync(full, m, run_min_lane);  // (every lane)
    const bool at_min = candidate && bits == run_min;
    const unsigned at = __ballot_sync(full, at_min);
    const unsigned later = heads & ~((2u << lane) - 1u);
    const int next = later ? __ffs(later) - 1 : 32;  // (a head's run: [lane, next))
    const unsigned run = (next == 32 ? full : (1u << next) - 1u) & ~((1u << lane) - 1u);
    const unsigned long long best_event = event_of(at & run ? __ffs(at & run) - 1 : 0);
    const unsigned long long best = at & run ? best_event : KD_NO_INDEX;
    const bool mine = run_head && live;
    const bool from_before = mine && lane == 0 && a.seg_event_offset[seg] < first;
    const bool on_after = mine && !from_before && next >= num_live
                          && a.seg_event_offset[seg + 1] > end;
    if (mine && !from_before && !on_after) {
        reinterpret_cast<KdSegArgmin*>(a.seg_argmin)[seg] =
            KdSegArgmin{m == KD_NO_INDEX ? KD_INF_BITS : m, best};
    }
    if ((from_before || on_after) && m != KD_NO_INDEX) lower(seg, m, best);
}

// The cost pass with rule R8's arg-min (each segment's lowest event index at
// its minimum cost) in the same pass, a warp's 32 consecutive events at a time
// (every lane calls it; lane l takes event w0 + l; kd_warp_argmin). No barrier:
// the pass waits mostly on dependent loads, and a block-wide version (a block's
// 256 events, shared memory, three __syncthreads) made the cost pass 25%
// slower. (Two passes over the events, a cost pass and an arg-min pass that
// computed the near-minima again from stored 32-bit keys, took 29 ms of a
// 5.5M-triangle build on an H100.)
//
// node_of(e): what of_node needs of a live event e: the small staged levels'
// launch (kd_split_costs) loads it through the reference where segments are
// derived (KdEventSegment::derived_node_of), and a stored segment gives its
// own. (The level loop runs kd_split_cost_warp_range, below.)
template <typename NodeOf>
__device__ __forceinline__ void kd_split_cost_warp(const KdCostArgs& a, long long w0,
                                                   NodeOf node_of)
{
    const int lane = threadIdx.x & 31;
    if (w0 >= a.num_events) return;  // (the launch's last block: warp-uniform)
    const long long e = w0 + lane;
    const bool live = e < a.num_events;
    int node = 0, axis = 0;
    const int seg = live ? a.event_seg.of_node(e, node_of(e), node, axis) : -1;
    signed char side = KD_SIDE_LEFT;
    double cost = __longlong_as_double((long long)KD_INF_BITS);  // +inf: not a candidate
    if (live) {
        cost = kd_event_plane_cost(a, e, seg, node, axis, &side);
        if (a.event_cost.hi) a.event_cost.store(e, cost);
        if (a.event_side) a.event_side[e] = side;
    }
    const unsigned long long bits = (unsigned long long)__double_as_longlong(cost);
    const bool candidate = live && bits != KD_INF_BITS;
    const long long end = w0 + 32 < a.num_events ? w0 + 32 : a.num_events;
    kd_warp_argmin(a, seg, live, candidate, bits, w0, end, (int)(end - w0),
                   [&](int src) { return (unsigned long long)(w0 + src); },
                   KdLowerGlobal{a.seg_argmin});
}

// One lane of a cost warp over candidates (every lane calls it): the warp's
// num_live candidates are events e0 + list[0 .. num_live), in event order;
// lower: where the parts of larger segments go (kd_warp_argmin).
template <typename Lower>
__device__ __forceinline__ void kd_candidate_lane(const KdCostArgs& a, long long e0,
                                                  const unsigned short* list, int num_live,
                                                  Lower lower)
{
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const bool live = lane < num_live;
    const long long e = e0 + list[live ? lane : 0];
    int node = 0, axis = 0, seg = -1;
    double cost = __longlong_as_double((long long)KD_INF_BITS);
    if (live) {
        seg = a.event_seg.of(e, node, axis);
        signed char side;
        cost = kd_candidate_cost(a, e, seg, node, axis, kd_event_plane(a, e, seg, node, axis),
                                 &side);
        if (a.event_cost.hi) a.event_cost.store(e, cost);
        a.event_side[e] = side;
    }
    const unsigned long long bits = (unsigned long long)__double_as_longlong(cost);
    const long long first = __shfl_sync(full, e, 0);
    const long long end = __shfl_sync(full, e, num_live - 1) + 1;
    kd_warp_argmin(a, seg, live, live && bits != KD_INF_BITS, bits, first, end, num_live,
                   [&](int src) { return (unsigned long long)__shfl_sync(full, e, src); },
                   lower);
}

// The cost pass of one warp over its own consecutive chunks [c0, c1) of 32
// events (c1 - c0 at most KD_COST_RANGE_CHUNKS), with rule R8's arg-min: the
// level loop's form of kd_split_costs_candidates (cost_candidates.cu). A warp
// over every event (kd_split_cost_warp) ran the cost and the arg-min for a
// few candidate lanes a chunk; here each chunk only tests its events'
// candidacy (R4-R5), and the candidates queue up in `queue` (the warp's 64
// 16-bit offsets from the range's first event, shared memory) until 32 of
// them run the cost and the arg-min with every lane busy (kd_candidate_lane).
// per_event(e): work of the same pass on each live event (the loop's
// reference boxes with perfect splits).
// Measured on an H200 (profiled level-loop launch, two fresh processes each,
// against every event a lane: benchmarks/results/loop_cost_range_h200.md):
// the bunny 1.42 to 1.27 ms, conference 6.26-6.30 to 5.76-5.77, armadillo
// 4.17-4.20 to 3.95-3.96, subdivided once 14.83-14.88 to 13.16-13.17. Loading
// each chunk's references and nodes a chunk ahead (kd_grid_for_events' way)
// took more registers and was 1-2% slower.
constexpr long long KD_COST_RANGE_CHUNKS = 65536 / 32;  // (16-bit offsets in the queue)

template <typename PerEvent>
__device__ __forceinline__ void kd_split_cost_warp_range(const KdCostArgs& a, long long c0,
                                                         long long c1, unsigned short* queue,
                                                         PerEvent per_event)
{
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const unsigned lanes_below = (1u << lane) - 1u;
    const long long e0 = c0 << 5;
    const long long num_events = a.num_events;
    const KdEventSegment& sg = a.event_seg;
    long long e = e0 + lane;
    int count = 0;  // candidates queued (at most 31 between chunks)
    for (long long c = c0; c < c1; ++c, e += 32) {
        bool candidate = false;
        if (e < num_events) {
            int node, axis;
            const int seg = sg.of(e, node, axis);
            const KdEventPlane pl = kd_event_plane(a, e, seg, node, axis);
            candidate = kd_event_candidate(a, e, node, axis, pl);
            per_event(e);
        }
        const unsigned mask = __ballot_sync(full, candidate);
        if (candidate) queue[count + __popc(mask & lanes_below)] = (unsigned short)(e - e0);
        count += __popc(mask);
        __syncwarp();
        if (count >= 32) {
            kd_candidate_lane(a, e0, queue, 32, KdLowerGlobal{a.seg_argmin});
            const int rest = count - 32;
            const unsigned short moved = lane < rest ? queue[32 + lane] : 0;
            __syncwarp();
            if (lane < rest) queue[lane] = moved;
            __syncwarp();
            count = rest;
        }
    }
    if (count > 0) kd_candidate_lane(a, e0, queue, count, KdLowerGlobal{a.seg_argmin});
    __syncwarp();  // (the queue is read before the warp's next range writes it)
}
