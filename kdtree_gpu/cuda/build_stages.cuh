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
#include "split_costs.cuh"

// Stage select_best_splits + decide_leaves, per node: the best of the three
// axes' best planes (ties keep the lower axis), and whether to split (R4, R8).
// Writes the packed (split, leaf triangle count) scan input after a leading 0.
struct KdSelectArgs {
    // each segment's (minimum cost bits, lowest event index at it): KdSegArgmin
    const unsigned long long* seg_argmin;
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
};

__device__ __forceinline__ void kd_select_node(const KdSelectArgs& a, long long i)
{
    double cost = __longlong_as_double((long long)KD_INF_BITS);
    int axis = 0;
    long long ev = -1;
    for (int k = 0; k < 3; ++k) {
        const KdSegArgmin seg =
            reinterpret_cast<const KdSegArgmin*>(a.seg_argmin)[k * a.num_nodes + i];
        const unsigned long long best = seg.index;
        if (best != KD_NO_INDEX) {
            // (the best event's cost is its segment's minimum)
            const double c = __longlong_as_double((long long)seg.cost);
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

// A node to split that holds at most small_refs references is deferred: a
// leaf here (its references go to leaf_tris as any leaf's, its split_leaf
// value is a leaf's), its subtree built later by one warp (build_small.cu)
// with the same rules. Called after kd_select_node, by the level loop and by
// the levels run by stages; returns whether node i was deferred.
__device__ __forceinline__ bool kd_defer_small(const KdSelectArgs& a, long long i,
                                               long long small_refs)
{
    const long long n_all = a.node_ref_offset[i + 1] - a.node_ref_offset[i];
    if (!a.node_split[i] || n_all > small_refs) return false;
    a.node_split[i] = false;
    a.split_leaf[i + 1] = n_all << 32;
    a.best_axis[i] = KD_SMALL_DEFERRED_AXIS;
    return true;
}

// The record of deferred node i of a level (written as a leaf at level_base + i,
// its references from leaf_ref_base + the leaf scan's high word on), at the
// next free row of `deferred` (num_records counts the records, num_refs their
// references).
__device__ __forceinline__ void kd_record_deferred(long long i, const long long* node_ref_offset,
                                                   const long long* split_leaf_ex,
                                                   const float* node_lo, const float* node_hi,
                                                   long long level_base, int level,
                                                   long long leaf_ref_base, int* deferred,
                                                   long long* num_records, long long* num_refs)
{
    const long long slot = (long long)atomicAdd((unsigned long long*)num_records, 1ull);
    const long long count = node_ref_offset[i + 1] - node_ref_offset[i];
    atomicAdd((unsigned long long*)num_refs, (unsigned long long)count);
    kd_small_write_record(deferred + slot * KD_SMALL_RECORD, (int)(level_base + i), level,
                          leaf_ref_base + KD_HIGH(split_leaf_ex[i]), (int)count,
                          node_lo + 3 * i, node_hi + 3 * i);
}

// Rule R9: the class bits of a reference whose box spans [a, b] on the split
// axis, for the plane at p whose planar references go to `side`.
__device__ __forceinline__ unsigned char kd_class_of(float a, float b, float p, int side)
{
    if (a == b && a == p) return side == KD_SIDE_LEFT ? KD_CLASS_LEFT : KD_CLASS_RIGHT;
    if (a >= p) return KD_CLASS_RIGHT;
    if (b <= p) return KD_CLASS_LEFT;
    return KD_CLASS_BOTH;
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
    return kd_class_of(tri_lo[3 * tri + axis], tri_hi[3 * tri + axis], best_pos[node],
                       best_side[node]);
}

__device__ __forceinline__ long long kd_pack_lr(unsigned char cls)
{
    return (long long)(cls & KD_CLASS_LEFT) | ((long long)((cls & KD_CLASS_RIGHT) >> 1) << 32);
}

// ... and back: a reference's class from the step of the scan of its flags
// (ref_lr_ex[r + 1] - ref_lr_ex[r]).
__device__ __forceinline__ unsigned char kd_unpack_lr(long long step)
{
    return (unsigned char)(KD_LOW(step) | KD_HIGH(step) << 1);
}

// An event's route flags from its reference's class: with perfect splits
// (clip) a straddling reference's events go to no child (new ones are made).
__device__ __forceinline__ long long kd_event_lr(unsigned char cls, int clip)
{
    return clip && cls == KD_CLASS_BOTH ? 0 : kd_pack_lr(cls);
}

// The scan inputs of route_refs and route_events, computed as the scans load
// them (nothing is stored before the scans): the packed (left, right) flags
// of reference i - 1, read from its class, and of event i - 1, read from its
// reference's (one byte gathered from ref_class, R bytes that stay in L2,
// instead of classifying the event's reference again, which gathers its
// triangle, node and box rows from arrays far larger than L2: H100, 5.5M
// triangles, classification took 30.9 ms of the build that way, 10.8 ms so);
// 0 for i = 0. With perfect splits a straddling reference's events go to no
// child (KdClassifyArgs).
struct KdLoadRefLR {
    const unsigned char* ref_class;
    __device__ long long operator()(long long i) const
    {
        return i == 0 ? 0 : kd_pack_lr(ref_class[i - 1]);
    }
};

struct KdLoadEventLR {
    const int* event_ref;
    const unsigned char* ref_class;
    int clip;
    __device__ long long operator()(long long i) const
    {
        return i == 0 ? 0 : kd_event_lr(ref_class[event_ref[i - 1]], clip);
    }
};

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

// Stage classify_triangles: the class of each reference (ref_class); the
// references' and the events' route flags come from it as their scans load
// them (KdLoadRefLR, KdLoadEventLR). With perfect splits (clip) the boxes
// are the references' own (row = reference, not triangle) and a straddling
// reference's events go to no child: clip.cu makes new ones.
struct KdClassifyArgs {
    const int* ref_tri;
    const int* ref_node;
    const signed char* best_axis;
    const float* best_pos;
    const signed char* best_side;
    const bool* node_split;
    const float* tri_lo;
    const float* tri_hi;
    long long num_refs;
    unsigned char* ref_class;
    int clip;
};

__device__ __forceinline__ void kd_classify_ref(const KdClassifyArgs& a, long long i)
{
    if (i < a.num_refs)
        a.ref_class[i] = kd_classify(a.clip ? (int)i : a.ref_tri[i], a.ref_node[i], a.best_axis,
                                     a.best_pos, a.best_side, a.node_split, a.tri_lo, a.tri_hi);
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

// Stage route_refs / route_events: where the child groups start, from the
// flag scans (kd_child_offsets), or, with the level loop's perfect splits,
// the groups' sizes for a scan (kd_child_count). Item t < n is node t's
// references; item t >= n is segment t - n's events.
struct KdRouteArgs {
    const long long* node_ref_offset;
    KdPackedScan ref_lr_ex;
    const long long* seg_event_offset;
    KdPackedScan event_lr_ex;
    const bool* node_split;
    const long long* split_leaf_ex;
    long long num_nodes;
    long long* child_ref_count;    // (2n + 1), zeroed (kd_child_count only)
    long long* child_event_count;  // (6n + 1), zeroed (kd_child_count only)
};

// Item t's child group sizes, after a leading 0 so that a scan gives the
// offsets, from the flag scans at its group's ends: the level loop's perfect
// splits add their new events to these sizes and scan them (elsewhere
// kd_child_offsets reads the offsets off the scans at once).
__device__ __forceinline__ void kd_child_count(const KdRouteArgs& a, long long t)
{
    bool refs = t < a.num_nodes;
    const long long* group_offset = refs ? a.node_ref_offset : a.seg_event_offset;
    const KdPackedScan& lr_ex = refs ? a.ref_lr_ex : a.event_lr_ex;
    long long g = refs ? t : t - a.num_nodes;
    long long* child_count = refs ? a.child_ref_count : a.child_event_count;
    if (!a.node_split[g % a.num_nodes]) return;
    long long num_split = KD_LOW(a.split_leaf_ex[a.num_nodes]);
    long long c = kd_child_group(g, a.num_nodes, a.split_leaf_ex, num_split);
    long long start = lr_ex[group_offset[g]], end = lr_ex[group_offset[g + 1]];
    child_count[c + 1] = KD_LOW(end) - KD_LOW(start);
    child_count[c + 2] = KD_HIGH(end) - KD_HIGH(start);
}

// What the flag scans say of a group whose scan is s at its start and e at
// its end (kd_child_offsets): LOW(s) + HIGH(s) copies go to children from the
// groups before it, so its left child starts there (and at the last group's
// end it is the children's total); its right child starts at LOW(e) + HIGH(s).
__device__ __forceinline__ long long kd_left_child_start(long long s)
{
    return KD_LOW(s) + KD_HIGH(s);
}

__device__ __forceinline__ long long kd_right_child_start(long long s, long long e)
{
    return KD_LOW(e) + KD_HIGH(s);
}

// route_refs and route_events without the group sizes or their scans: item t
// of 6n + 1 writes the children's offsets (child_ref_offset: 2n + 1,
// child_event_offset: 6n + 1) from the flag scans at its group's ends
// (event_scan_at(g): the events' scan at segment g's first event, g <= 3n).
// A group of a node that does not split carries no flags (kd_classify: class
// 0), so the scan at group g's start, s, counts exactly the copies that the
// groups before g send to children, and those children come before g's
// (kd_child_group): g's left child starts at LOW(s) + HIGH(s), its right one
// at LOW(e) + HIGH(s) (e: the scan at g's end). The entries from the last
// child's end on hold the total, as the inclusive scan of kd_child_count's
// sizes left them: the same arrays, without the sizes' pass and their two
// scans. (Not for the level loop's perfect splits, whose new events add to
// the sizes.) Returns the scan at the start of segment t - n where it splits
// (-1 elsewhere), for the stages' seg_start.
template <typename EventScanAt>
__device__ __forceinline__ long long kd_child_offsets(const KdRouteArgs& a, long long t,
                                                      EventScanAt event_scan_at,
                                                      long long* child_ref_offset,
                                                      long long* child_event_offset)
{
    const long long n = a.num_nodes;
    const long long num_split = KD_LOW(a.split_leaf_ex[n]);
    long long start = -1;
    if (t < 4 * n) {
        const bool refs = t < n;
        const long long g = refs ? t : t - n;
        if (a.node_split[g % n]) {
            const long long s = refs ? a.ref_lr_ex[a.node_ref_offset[g]] : event_scan_at(g);
            const long long e =
                refs ? a.ref_lr_ex[a.node_ref_offset[g + 1]] : event_scan_at(g + 1);
            long long* offset = refs ? child_ref_offset : child_event_offset;
            const long long c = kd_child_group(g, n, a.split_leaf_ex, num_split);
            offset[c] = kd_left_child_start(s);
            offset[c + 1] = kd_right_child_start(s, e);
            if (!refs) start = s;
        }
    }
    if (t <= 2 * (n - num_split)) {
        const long long total = a.ref_lr_ex[a.node_ref_offset[n]];
        child_ref_offset[2 * num_split + t] = kd_left_child_start(total);
    }
    if (t <= 6 * (n - num_split)) {
        const long long total = event_scan_at(3 * n);
        child_event_offset[6 * num_split + t] = kd_left_child_start(total);
    }
    return start;
}

// The sizes the host needs for the next level, gathered for one read:
// [splitting nodes, child refs, child events, leaf refs] (the totals of the
// flag scans, as kd_child_offsets leaves them at the children's end).
template <typename EventScanAt>
__device__ __forceinline__ void kd_level_totals_of(const KdRouteArgs& a,
                                                   EventScanAt event_scan_at, long long* totals)
{
    const long long n = a.num_nodes;
    const long long s = a.split_leaf_ex[n];
    const long long refs = a.ref_lr_ex[a.node_ref_offset[n]];
    const long long events = event_scan_at(3 * n);
    totals[0] = KD_LOW(s);
    totals[1] = kd_left_child_start(refs);
    totals[2] = kd_left_child_start(events);
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
// (lr_at(r): the scan at reference r, of ref_lr_ex or already loaded). Without
// child_ref_offset (null: the level loop, which writes the children's offsets
// beside the scatter) they come from the scans at the node's ends, as
// kd_child_offsets makes them: left child at LOW(s) + HIGH(s), right at
// LOW(e) + HIGH(s) (kd_left_child_start, kd_right_child_start; written out
// below with each reference's rank in its child folded in).
template <typename LrAt>
__device__ __forceinline__ void kd_ref_destinations(long long r, int node, LrAt lr_at,
                                                    const KdPackedScan& ref_lr_ex,
                                                    const long long* node_ref_offset,
                                                    const long long* split_leaf_ex,
                                                    const long long* child_ref_offset,
                                                    long long* dst_left, long long* dst_right)
{
    long long start = node_ref_offset[node];
    long long lr_r = lr_at(r), lr_s = ref_lr_ex[start];
    if (!child_ref_offset) {
        const long long lr_e = ref_lr_ex[node_ref_offset[node + 1]];
        *dst_left = KD_HIGH(lr_s) + KD_LOW(lr_r);
        *dst_right = KD_LOW(lr_e) + KD_HIGH(lr_r);
        return;
    }
    long long child = 2 * KD_LOW(split_leaf_ex[node]);
    *dst_left = child_ref_offset[child] + (KD_LOW(lr_r) - KD_LOW(lr_s));
    *dst_right = child_ref_offset[child + 1] + (KD_HIGH(lr_r) - KD_HIGH(lr_s));
}

__device__ __forceinline__ void kd_ref_destinations(long long r, int node,
                                                    const KdPackedScan& ref_lr_ex,
                                                    const long long* node_ref_offset,
                                                    const long long* split_leaf_ex,
                                                    const long long* child_ref_offset,
                                                    long long* dst_left, long long* dst_right)
{
    kd_ref_destinations(r, node, [&](long long x) { return ref_lr_ex[x]; }, ref_lr_ex,
                        node_ref_offset, split_leaf_ex, child_ref_offset, dst_left, dst_right);
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
    // (both null: the destinations come from the flag scans at the groups'
    // ends, kd_ref_destinations; the level loop without perfect splits)
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
    // The rows the children's arrays have: a copy bound past them is not
    // written. The stages may launch the scatter before the host has read the
    // level's counts, into arrays of a guessed size; where a guess falls short,
    // the host makes them again at the counts and launches it again
    // (level_stages.build_level_stages). The loop sizes them from its counts.
    long long room_refs = 0x7fffffffffffffffll;
    long long room_events = 0x7fffffffffffffffll;
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

__device__ __forceinline__ void kd_scatter_ref(const KdScatterArgs& a, long long i)
{
    int node = a.ref_node[i];
    int tri = a.ref_tri[i];
    unsigned char cls = a.ref_class[i];
    if (cls == 0) {  // (the host makes the leaf list's room before it launches the scatter)
        long long sl = a.split_leaf_ex[node];
        a.leaf_tris[a.leaf_ref_base + KD_HIGH(sl) + (i - a.node_ref_offset[node])] = tri;
    } else {
        long long dl, dr;
        kd_ref_destinations(i, node, a.ref_lr_ex, a.node_ref_offset, a.split_leaf_ex,
                            a.child_ref_offset, &dl, &dr);
        int child = (int)(2 * KD_LOW(a.split_leaf_ex[node]));
        if ((cls & KD_CLASS_LEFT) && dl < a.room_refs) {
            a.child_tri[dl] = tri;
            a.child_node[dl] = child;
        }
        if ((cls & KD_CLASS_RIGHT) && dr < a.room_refs) {
            a.child_tri[dr] = tri;
            a.child_node[dr] = child + 1;
        }
    }
}

// One copy of an event at row dst of the children's events.
__device__ __forceinline__ void kd_put_event(const KdScatterArgs& a, long long dst, float pos,
                                             signed char kind, int ref, long long seg)
{
    a.out_pos[dst] = pos;
    a.out_kind[dst] = kind;
    a.out_ref[dst] = ref;
    if (a.out_seg) a.out_seg[dst] = (int)seg;
}

// Event i, of reference ref (class cls, scan lr_ref(ref): ref_lr_ex's, or one
// already loaded), into its child segments. Its packed (left, right) scan value
// comes from lr_of() and its segment's from seg_start(seg), asked only for an
// event that moves: a stored scan, or one made as the event's chunk is scanned
// again (kd_scatter_chunks).
template <typename EventScan, typename SegStart, typename LrAt>
__device__ __forceinline__ void kd_scatter_event(const KdScatterArgs& a, long long i, int ref,
                                                 int known_node, unsigned char cls, LrAt lr_ref,
                                                 EventScan lr_of, SegStart seg_start)
{
    if (cls == 0 || (a.clip && cls == KD_CLASS_BOTH)) return;
    int node, axis;
    const int seg = a.event_seg.of_node(i, known_node, node, axis);
    long long rl, rr;
    kd_ref_destinations(ref, node, lr_ref, a.ref_lr_ex, a.node_ref_offset, a.split_leaf_ex,
                        a.child_ref_offset, &rl, &rr);
    long long num_split = KD_LOW(a.split_leaf_ex[a.num_nodes]);
    long long child_seg = kd_child_group(seg, a.num_nodes, a.split_leaf_ex, num_split);
    long long lr_e = lr_of(), lr_s = seg_start(seg);
    float pos = a.event_pos[i];
    signed char kind = a.event_kind[i];
    // (without child_event_offset: the child segments start at LOW(s) + HIGH(s)
    // and LOW(e) + HIGH(s), s and e the scans at the segment's ends:
    // kd_left_child_start and kd_right_child_start written out, as the
    // measured scatter has them; through the helpers it compiles to other code)
    if (cls & KD_CLASS_LEFT) {
        const long long j = KD_LOW(lr_e) - KD_LOW(lr_s);
        const long long dst = a.child_event_offset ? kd_kept_event_place(a, child_seg, j)
                                                   : KD_LOW(lr_s) + KD_HIGH(lr_s) + j;
        if (dst < a.room_events) kd_put_event(a, dst, pos, kind, (int)rl, child_seg);
    }
    if (cls & KD_CLASS_RIGHT) {
        const long long j = KD_HIGH(lr_e) - KD_HIGH(lr_s);
        const long long dst = a.child_event_offset
                                  ? kd_kept_event_place(a, child_seg + 1, j)
                                  : KD_LOW(seg_start(seg + 1)) + KD_HIGH(lr_s) + j;
        if (dst < a.room_events) kd_put_event(a, dst, pos, kind, (int)rr, child_seg + 1);
    }
}

// Reference i and event i; ref: event i's reference and known_node what
// of_node needs of it (the level loop loads both ahead, kd_grid_for_events).
__device__ __forceinline__ void kd_scatter_item(const KdScatterArgs& a, long long i, int ref,
                                                int known_node)
{
    if (i < a.num_refs) kd_scatter_ref(a, i);
    if (i < a.num_events) {
        kd_scatter_event(a, i, ref, known_node, a.ref_class[ref],
                         [&](long long r) { return a.ref_lr_ex[r]; },
                         [&]() { return a.event_lr_ex[i]; },
                         [&](int seg) { return a.event_lr_ex[a.seg_event_offset[seg]]; });
    }
}

__device__ __forceinline__ void kd_scatter_item(const KdScatterArgs& a, long long i)
{
    const int ref = i < a.num_events ? a.event_ref[i] : 0;
    kd_scatter_item(a, i, ref, i < a.num_events ? a.event_seg.derived_node(ref) : 0);
}

// --- route_events and split_events of the stages' large levels -------------------
// The events' packed (left, right) flags are scanned twice and stored never:
// kd_event_lr_heads keeps each tile's sum, the scan before each warp's chunk
// of 32 events within its tile, and the scan before each segment's first
// event within its tile; the scatter (kd_scatter_chunks) scans each chunk
// again and adds the prefixes. A tile's counts fit 16 bits
// (KD_SCAN_TILE < 2**16): kd_lr16 words. (Before, a third pass stored every
// event's scan, 8 bytes, which the scatter read back with a gather at its
// segment's start.)

// One tile of KD_SCAN_TILE events from `tile`, warp-striped as kd_scan_tile
// (lane l of warp w holds the items base + 32 j, base = tile + 32 w
// KD_SCAN_ITEMS + l, so that a warp's loads are consecutive): visit(i, ref,
// local) for each item i < end, with its event's reference (-1 for i >=
// num_events) and the tile's exclusive scan before it (kd_lr16). Every
// thread of the block calls it. Returns the tile's sum (kd_lr16).
static_assert(KD_SCAN_TILE <= KD_SCAN_CHUNK_MAX, "a tile's counts must fit 16 bits");
static_assert(KD_SCAN_TILE % 32 == 0, "a tile holds whole chunks of 32 events");

template <typename Visit>
__device__ __forceinline__ unsigned int kd_event_lr_tile(const int* event_ref,
                                                         const unsigned char* ref_class,
                                                         int clip, long long tile,
                                                         long long num_events, long long end,
                                                         Visit visit)
{
    const int lane = threadIdx.x & 31;
    const long long base = tile + (long long)(threadIdx.x >> 5) * 32 * KD_SCAN_ITEMS + lane;
    int ref[KD_SCAN_ITEMS];
    unsigned int v[KD_SCAN_ITEMS];
    unsigned int sum = 0;
    for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
        const long long i = base + 32 * j;
        ref[j] = i < num_events ? event_ref[i] : -1;
        v[j] = ref[j] >= 0 ? kd_lr16(kd_event_lr(ref_class[ref[j]], clip)) : 0u;
        sum += v[j];
    }
    long long total;
    kd_warp_scan_rounds(v, base, end, kd_block_warp_prefix(sum, &total),
                        [&](int j, long long i, unsigned int value) {
                            visit(i, ref[j], value - v[j]);
                        });
    return (unsigned int)total;
}
