// Stage functions of the level-by-level SAH kd-tree builder
// (kdtree_gpu/builder/), shared by the kernels of build.cu (one launch per
// stage) and the level loop of build_loop.cu (every level in one launch).
//
// A stage's element-wise work is a device function of one item index that
// takes its arrays in a Kd*Args struct; the NumPy twin of each is the stage function
// of the same name in kdtree_gpu/builder/stages.py, which the GPU tests compare
// against.
//
// Layout conventions (see kdtree_gpu/builder/soa.py):
//   events of a level: sorted by segment seg = axis * n + node, then position;
//   packed scans hold two 32-bit counts in one int64 (low | high << 32) and are
//   exclusive with a leading 0, so count(i..j) = scan[j] - scan[i].
#pragma once
#include "common.cuh"
#include "sah.cuh"
#include "scan.cuh"
#include "small_record.cuh"

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
// costs take no memory of their own; halves restore the exact bits.
struct KdEventCosts {
    unsigned int* hi;
    unsigned int* lo;
    __device__ __forceinline__ void store(long long e, double cost) const
    {
        unsigned long long bits = (unsigned long long)__double_as_longlong(cost);
        hi[e] = (unsigned int)(bits >> 32);
        if (lo) lo[e] = (unsigned int)bits;  // (null: the high words only)
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
    // Non-null: the arg-min pass (the per-stage path stores the costs' high words
    // only, event_cost.lo null): the lowest event index whose cost is its
    // segment's minimum (as kd_argmin_event) into seg_best, each cost computed
    // again where its high word equals the minimum's; seg_min_cost is only read.
    unsigned long long* seg_best;
};

// Event e's plane cost (+inf where e is no candidate) and side, e live and in
// segment seg.
__device__ __forceinline__ double kd_event_plane_cost(const KdCostArgs& a, long long e, int seg,
                                                      signed char* side_out)
{
    double cost = __longlong_as_double(0x7ff0000000000000ll);  // +inf: not a candidate
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
    int seg = live ? a.event_seg(e) : -1;
    signed char side = KD_SIDE_LEFT;
    if (a.seg_best) {  // the arg-min pass (uniform across the warp)
        unsigned long long key = KD_NO_INDEX;
        if (live) {
            unsigned long long min_bits = a.seg_min_cost[seg];
            // the stored high word rules out all but the minimum and its
            // near-ties: only those compute their cost again
            if (min_bits != KD_INF_BITS && a.event_cost.hi[e] == (unsigned int)(min_bits >> 32)) {
                double c = kd_event_plane_cost(a, e, seg, &side);
                if ((unsigned long long)__double_as_longlong(c) == min_bits)
                    key = (unsigned long long)e;
            }
        }
        kd_warp_segmented_atomic_min(key, seg, a.seg_best);
        return;
    }
    double cost = __longlong_as_double(0x7ff0000000000000ll);  // +inf: not a candidate
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

// Stage select_best_splits + decide_leaves, per node: the best of the three
// axes' best planes (ties keep the lower axis), and whether to split (R4, R8).
// Writes the packed (split, leaf triangle count) scan input after a leading 0.
struct KdSelectArgs {
    const unsigned long long* seg_best;
    KdEventCosts event_cost;
    const float* event_pos;
    const signed char* event_side;
    const long long* node_ref_offset;
    long long num_nodes;
    long long leaf_size;
    int level_active;
    double k_intersect;
    double* best_cost;
    signed char* best_axis;
    float* best_pos;
    signed char* best_side;
    bool* node_split;
    long long* split_leaf;  // (n + 1)
    // where event_cost.hi is null (costs not stored): the best event's cost is
    // its segment's minimum, whose bits these are
    const unsigned long long* seg_min_cost;
};

__device__ __forceinline__ void kd_select_node(const KdSelectArgs& a, long long i)
{
    double cost = __longlong_as_double(0x7ff0000000000000ll);
    int axis = 0;
    long long ev = -1;
    for (int k = 0; k < 3; ++k) {
        unsigned long long best = a.seg_best[k * a.num_nodes + i];
        if (best != KD_NO_INDEX) {
            double c = a.event_cost.hi
                           ? a.event_cost.load((long long)best)
                           : __longlong_as_double((long long)a.seg_min_cost[k * a.num_nodes + i]);
            if (c < cost) {
                cost = c;
                axis = k;
                ev = (long long)best;
            }
        }
    }
    long long n_all = a.node_ref_offset[i + 1] - a.node_ref_offset[i];
    bool split = kd_node_active(n_all, a.leaf_size, a.level_active) && ev >= 0
                 && cost < __dmul_rn(a.k_intersect, (double)n_all);
    a.best_cost[i] = cost;
    a.best_axis[i] = (signed char)axis;
    a.best_pos[i] = ev >= 0 ? a.event_pos[ev] : 0.0f;
    a.best_side[i] = ev >= 0 ? a.event_side[ev] : (signed char)KD_SIDE_LEFT;
    a.node_split[i] = split;
    a.split_leaf[i + 1] = (long long)split | ((split ? 0ll : n_all) << 32);
    if (i == 0) a.split_leaf[0] = 0;
}

// Stage classify_triangles (R9): the class bits of a reference (0 in a leaf).
__device__ __forceinline__ unsigned char kd_classify(int tri, int node,
                                                     const signed char* best_axis,
                                                     const float* best_pos,
                                                     const signed char* best_side,
                                                     const bool* node_split,
                                                     const float* tri_lo, const float* tri_hi)
{
    if (!node_split[node]) return 0;
    int axis = best_axis[node];
    float p = best_pos[node];
    float a = tri_lo[3 * tri + axis];
    float b = tri_hi[3 * tri + axis];
    if (a == b && a == p)
        return best_side[node] == KD_SIDE_LEFT ? KD_CLASS_LEFT : KD_CLASS_RIGHT;
    if (a >= p) return KD_CLASS_RIGHT;
    if (b <= p) return KD_CLASS_LEFT;
    return KD_CLASS_BOTH;
}

__device__ __forceinline__ long long kd_pack_lr(unsigned char cls)
{
    return (long long)(cls & KD_CLASS_LEFT) | ((long long)((cls & KD_CLASS_RIGHT) >> 1) << 32);
}

// An event's route flags from its reference's class: with perfect splits
// (clip) a straddling reference's events go to no child (new ones are made).
__device__ __forceinline__ long long kd_event_lr(unsigned char cls, int clip)
{
    return clip && cls == KD_CLASS_BOTH ? 0 : kd_pack_lr(cls);
}

// Stage make_child_nodes: the box of the child `side` of node i split at p on
// axis (left: hi[axis] = p, right: lo[axis] = p).
__device__ __forceinline__ void kd_child_box(const float* node_lo, const float* node_hi,
                                             long long i, int axis, float p, int side,
                                             float* lo, float* hi)
{
    for (int k = 0; k < 3; ++k) {
        lo[k] = side && k == axis ? p : node_lo[3 * i + k];
        hi[k] = !side && k == axis ? p : node_hi[3 * i + k];
    }
}

// Stages classify_triangles and route_events' flags in one launch over
// max(R, E) threads: thread i classifies reference i (ref_class, ref_lr) and
// event i, which classifies its own reference again rather than wait for it.
// Both scan inputs get a leading 0. With perfect splits (clip) the boxes are
// the references' own (row = reference, not triangle) and a straddling
// reference's events go to no child: clip.cu makes new ones.
struct KdClassifyArgs {
    const int* ref_tri;
    const int* ref_node;
    const int* event_ref;
    const signed char* best_axis;
    const float* best_pos;
    const signed char* best_side;
    const bool* node_split;
    const float* tri_lo;
    const float* tri_hi;
    long long num_refs, num_events;
    unsigned char* ref_class;
    long long* ref_lr;    // (R + 1); null: not stored (the level loop scans ref_class)
    long long* event_lr;  // (E + 1)
    int clip;
};

// Reference i only (ref_class, ref_lr).
__device__ __forceinline__ void kd_classify_ref(const KdClassifyArgs& a, long long i)
{
    if (i == 0 && a.ref_lr) a.ref_lr[0] = 0;
    if (i < a.num_refs) {
        unsigned char cls = kd_classify(a.clip ? (int)i : a.ref_tri[i], a.ref_node[i],
                                        a.best_axis, a.best_pos, a.best_side, a.node_split,
                                        a.tri_lo, a.tri_hi);
        a.ref_class[i] = cls;
        if (a.ref_lr) a.ref_lr[i + 1] = kd_pack_lr(cls);
    }
}

__device__ __forceinline__ void kd_classify_item(const KdClassifyArgs& a, long long i)
{
    kd_classify_ref(a, i);
    if (i == 0) a.event_lr[0] = 0;
    if (i < a.num_events) {
        int ref = a.event_ref[i];
        unsigned char cls = kd_classify(a.clip ? ref : a.ref_tri[ref], a.ref_node[ref],
                                        a.best_axis, a.best_pos, a.best_side, a.node_split,
                                        a.tri_lo, a.tri_hi);
        a.event_lr[i + 1] = kd_event_lr(cls, a.clip);
    }
}

// Left child group of group g (a node, or a segment axis * n + node):
// children of the r-th splitting node are 2r, 2r + 1 per axis block of 2S.
__device__ __forceinline__ long long kd_child_group(long long g, long long num_nodes,
                                                    const long long* split_leaf_ex,
                                                    long long num_split)
{
    long long node = g % num_nodes;
    long long axis = g / num_nodes;
    long long rank = KD_LOW(split_leaf_ex[node]);
    return axis * 2 * num_split + 2 * rank;
}

// Stage route_refs / route_events: sizes of the child groups, written after
// a leading 0 so that a scan gives the child offsets. Item t < n is node t's
// references (into child_ref_count); item t >= n is segment t - n's events.
struct KdRouteArgs {
    const long long* node_ref_offset;
    KdPackedScan ref_lr_ex;
    const long long* seg_event_offset;
    KdPackedScan event_lr_ex;
    const bool* node_split;
    const long long* split_leaf_ex;
    long long num_nodes;
    long long* child_ref_count;    // (2n + 1), zeroed
    long long* child_event_count;  // (6n + 1), zeroed
};

__device__ __forceinline__ void kd_child_count(const KdRouteArgs& a, long long t)
{
    bool refs = t < a.num_nodes;
    long long g = refs ? t : t - a.num_nodes;
    const long long* group_offset = refs ? a.node_ref_offset : a.seg_event_offset;
    const KdPackedScan& lr_ex = refs ? a.ref_lr_ex : a.event_lr_ex;
    long long* child_count = refs ? a.child_ref_count : a.child_event_count;
    long long node = g % a.num_nodes;
    if (!a.node_split[node]) return;
    long long num_split = KD_LOW(a.split_leaf_ex[a.num_nodes]);
    long long c = kd_child_group(g, a.num_nodes, a.split_leaf_ex, num_split);
    long long start = lr_ex[group_offset[g]], end = lr_ex[group_offset[g + 1]];
    child_count[c + 1] = KD_LOW(end) - KD_LOW(start);
    child_count[c + 2] = KD_HIGH(end) - KD_HIGH(start);
}

// The sizes the host needs for the next level, gathered for one read:
// [splitting nodes, child refs, child events, leaf refs].
__device__ __forceinline__ void kd_write_totals(const long long* split_leaf_ex,
                                                const long long* child_ref_offset,
                                                const long long* child_event_offset,
                                                long long num_nodes, long long* totals)
{
    long long s = split_leaf_ex[num_nodes];
    long long num_split = KD_LOW(s);
    totals[0] = num_split;
    totals[1] = child_ref_offset[2 * num_split];
    totals[2] = child_event_offset[6 * num_split];
    totals[3] = KD_HIGH(s);
}

// Stage emit_level: node records (R10). Children of the r-th splitting node are
// tree nodes child_base + 2r, + 1; a leaf points at its triangles in leaf_tris.
struct KdEmitArgs {
    const bool* node_split;
    const signed char* best_axis;
    const float* best_pos;
    const long long* split_leaf_ex;
    const float* node_lo;
    const float* node_hi;
    long long num_nodes, level_base, leaf_ref_base;
    signed char* out_axis;
    float* out_split;
    int* out_child;
    int* out_count;
    float* child_lo;
    float* child_hi;
};

__device__ __forceinline__ void kd_emit_node(const KdEmitArgs& a, long long i)
{
    if (i >= a.num_nodes) return;
    long long s0 = a.split_leaf_ex[i], s1 = a.split_leaf_ex[i + 1];
    long long o = a.level_base + i;
    if (a.node_split[i]) {
        int axis = a.best_axis[i];
        float p = a.best_pos[i];
        a.out_axis[o] = (signed char)axis;
        a.out_split[o] = p;
        a.out_child[o] = (int)(a.level_base + a.num_nodes + 2 * KD_LOW(s0));
        a.out_count[o] = 0;
        long long c = 2 * KD_LOW(s0);
        for (int side = 0; side < 2; ++side)
            kd_child_box(a.node_lo, a.node_hi, i, axis, p, side, a.child_lo + 3 * (c + side),
                         a.child_hi + 3 * (c + side));
    } else {
        a.out_axis[o] = KD_AXIS_LEAF;
        a.out_split[o] = 0.0f;
        a.out_child[o] = (int)(a.leaf_ref_base + KD_HIGH(s0));
        a.out_count[o] = (int)(KD_HIGH(s1) - KD_HIGH(s0));
    }
}

// Stages split_refs and split_events in one launch over max(R, E) threads: thread i
// moves reference i (stable compaction into the children, or into the leaf list) and
// event i (into its child segments, order kept), which points at its reference's copy.
__device__ __forceinline__ void kd_ref_destinations(long long r, int node,
                                                    const KdPackedScan& ref_lr_ex,
                                                    const long long* node_ref_offset,
                                                    const long long* split_leaf_ex,
                                                    const long long* child_ref_offset,
                                                    long long* dst_left, long long* dst_right)
{
    long long start = node_ref_offset[node];
    long long child = 2 * KD_LOW(split_leaf_ex[node]);
    long long lr_r = ref_lr_ex[r], lr_s = ref_lr_ex[start];
    *dst_left = child_ref_offset[child] + (KD_LOW(lr_r) - KD_LOW(lr_s));
    *dst_right = child_ref_offset[child + 1] + (KD_HIGH(lr_r) - KD_HIGH(lr_s));
}

struct KdScatterArgs {
    const int* ref_tri;
    const int* ref_node;
    const unsigned char* ref_class;
    KdPackedScan ref_lr_ex;
    const long long* node_ref_offset;
    const long long* split_leaf_ex;
    const long long* child_ref_offset;
    const float* event_pos;
    const signed char* event_kind;
    const int* event_ref;
    KdEventSegment event_seg;
    KdPackedScan event_lr_ex;
    const long long* seg_event_offset;
    const long long* child_event_offset;
    long long num_nodes, num_refs, num_events, leaf_ref_base;
    int* leaf_tris;
    int* child_tri;
    int* child_node;
    float* out_pos;
    signed char* out_kind;
    int* out_ref;
    int* out_seg;  // null: the segments are not stored (the level loop's)
    int clip;  // straddling references' events stay behind (KdClassifyArgs)
    // The level loop's perfect splits: child_event_offset holds the merged
    // offsets (kept and new events); kept event j of child segment c goes
    // after the new events whose rank among the kept ones (new_rank, listed
    // by segment from new_offset[c], ascending) is at most j. Null elsewhere.
    const long long* new_offset;
    const int* new_rank;
};

// Kept event j of child segment c: its place in the merged list (above).
__device__ __forceinline__ long long kd_kept_event_place(const KdScatterArgs& a, long long c,
                                                         long long j)
{
    long long dst = a.child_event_offset[c] + j;
    if (a.new_rank) {
        long long b = a.new_offset[c];
        dst += kd_lower_bound(a.new_rank, b, a.new_offset[c + 1], (int)(j + 1)) - b;
    }
    return dst;
}

__device__ __forceinline__ void kd_scatter_item(const KdScatterArgs& a, long long i)
{
    if (i < a.num_refs) {
        int node = a.ref_node[i];
        int tri = a.ref_tri[i];
        unsigned char cls = a.ref_class[i];
        if (cls == 0) {
            long long sl = a.split_leaf_ex[node];
            a.leaf_tris[a.leaf_ref_base + KD_HIGH(sl) + (i - a.node_ref_offset[node])] = tri;
        } else {
            long long dl, dr;
            kd_ref_destinations(i, node, a.ref_lr_ex, a.node_ref_offset, a.split_leaf_ex,
                                a.child_ref_offset, &dl, &dr);
            int child = (int)(2 * KD_LOW(a.split_leaf_ex[node]));
            if (cls & KD_CLASS_LEFT) {
                a.child_tri[dl] = tri;
                a.child_node[dl] = child;
            }
            if (cls & KD_CLASS_RIGHT) {
                a.child_tri[dr] = tri;
                a.child_node[dr] = child + 1;
            }
        }
    }
    if (i < a.num_events) {
        int ref = a.event_ref[i];
        unsigned char cls = a.ref_class[ref];
        if (cls == 0 || (a.clip && cls == KD_CLASS_BOTH)) return;
        int node = a.ref_node[ref];
        long long rl, rr;
        kd_ref_destinations(ref, node, a.ref_lr_ex, a.node_ref_offset, a.split_leaf_ex,
                            a.child_ref_offset, &rl, &rr);
        int seg = a.event_seg.of(i, node);
        long long num_split = KD_LOW(a.split_leaf_ex[a.num_nodes]);
        long long child_seg = kd_child_group(seg, a.num_nodes, a.split_leaf_ex, num_split);
        long long lr_e = a.event_lr_ex[i], lr_s = a.event_lr_ex[a.seg_event_offset[seg]];
        float pos = a.event_pos[i];
        signed char kind = a.event_kind[i];
        if (cls & KD_CLASS_LEFT) {
            long long dst = kd_kept_event_place(a, child_seg, KD_LOW(lr_e) - KD_LOW(lr_s));
            a.out_pos[dst] = pos;
            a.out_kind[dst] = kind;
            a.out_ref[dst] = (int)rl;
            if (a.out_seg) a.out_seg[dst] = (int)child_seg;
        }
        if (cls & KD_CLASS_RIGHT) {
            long long dst = kd_kept_event_place(a, child_seg + 1, KD_HIGH(lr_e) - KD_HIGH(lr_s));
            a.out_pos[dst] = pos;
            a.out_kind[dst] = kind;
            a.out_ref[dst] = (int)rr;
            if (a.out_seg) a.out_seg[dst] = (int)(child_seg + 1);
        }
    }
}
