// Kernels of the level-by-level SAH kd-tree builder (kdtree_gpu/builder.py).
//
// Each kernel fuses the element-wise work between two scans of one build
// stage; the NumPy twin of each is the xp code path of the same stage
// function in builder.py, which the GPU tests compare against.
//
// Layout conventions (see builder.py):
//   events of a level: sorted by segment seg = axis * n + node, then position;
//   packed scans hold two 32-bit counts in one int64 (low | high << 32) and are
//   exclusive with a leading 0, so count(i..j) = scan[j] - scan[i].
#include "sah.cuh"

#define KD_LOW(x) ((long long)((unsigned long long)(x) & 0xffffffffull))
#define KD_HIGH(x) ((long long)((unsigned long long)(x) >> 32))

__device__ __forceinline__ long long kd_tid()
{
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

// Costs are >= 0 (or +inf), so their IEEE bit patterns order like the values
// and an integer atomicMin on the bits is an exact float64 minimum.
#define KD_INF_BITS 0x7ff0000000000000ull
#define KD_NO_INDEX 0xffffffffffffffffull

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

// --- inclusive scan of int64 (three launches, no temporary allocation) ---------------
// Tiles of KD_SCAN_TILE items: per-tile sums, a scan of the tile sums in one
// block, then each tile scans itself starting from its prefix.
#define KD_SCAN_BLOCK 256
#define KD_SCAN_ITEMS 8
#define KD_SCAN_TILE (KD_SCAN_BLOCK * KD_SCAN_ITEMS)

// Exclusive scan of one value per thread across a block of BLOCK threads
// (all of them must call it); *total gets the block's sum.
template <int BLOCK = KD_SCAN_BLOCK>
__device__ __forceinline__ long long kd_block_exclusive_scan(long long value, long long* total)
{
    __shared__ long long warp_sums[BLOCK / 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    long long x = value;
    for (int o = 1; o < 32; o <<= 1) {
        long long y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        long long w = lane < BLOCK / 32 ? warp_sums[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            long long y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        if (lane < BLOCK / 32) warp_sums[lane] = w;
    }
    __syncthreads();
    long long warp_prefix = warp > 0 ? warp_sums[warp - 1] : 0;
    *total = warp_sums[BLOCK / 32 - 1];
    __syncthreads();
    return warp_prefix + x - value;
}

// One block of BLOCK threads scans a whole array of n values, given by
// load(i), in chunks of BLOCK * KD_SCAN_ITEMS, writing the inclusive scan to
// out. Ends with a barrier, so the block may read `out` right after.
template <typename Load, int BLOCK = KD_SCAN_BLOCK>
__device__ __forceinline__ void kd_block_scan(Load load, long long n, long long* out)
{
    long long carry = 0;
    for (long long tile = 0; tile < n; tile += (long long)BLOCK * KD_SCAN_ITEMS) {
        long long base = tile + (long long)threadIdx.x * KD_SCAN_ITEMS;
        long long v[KD_SCAN_ITEMS];
        long long sum = 0;
        for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
            long long i = base + j;
            v[j] = i < n ? load(i) : 0;
            sum += v[j];
        }
        long long total;
        long long prefix = kd_block_exclusive_scan<BLOCK>(sum, &total) + carry;
        for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
            long long i = base + j;
            prefix += v[j];
            if (i < n) out[i] = prefix;
        }
        carry += total;
    }
    __syncthreads();
}

struct KdLoadArray {
    const long long* a;
    __device__ long long operator()(long long i) const { return a[i]; }
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

// Stage compute_split_costs, part 1: per event, the run-head flag (first event
// of a run of equal positions in a segment) and the packed (opens, closes)
// counts: opens = START or PLANAR, closes = END or PLANAR.
// Also resets the per-segment minimum cost and arg-min of this level
// (launched over max(E, num_segments) threads).
extern "C" __global__ void kd_event_flags(const float* __restrict__ event_pos,
                                          const signed char* __restrict__ event_kind,
                                          const int* __restrict__ event_seg,
                                          long long num_events,
                                          long long num_segments,
                                          long long* __restrict__ open_close,  // (E + 1)
                                          unsigned long long* __restrict__ seg_min_cost,
                                          unsigned long long* __restrict__ seg_best)
{
    long long e = kd_tid();
    if (e < num_segments) {
        seg_min_cost[e] = KD_INF_BITS;
        seg_best[e] = KD_NO_INDEX;
    }
    if (e >= num_events) return;
    int kind = event_kind[e];
    long long opens = kind != KD_EVENT_END;
    long long closes = kind != KD_EVENT_START;
    open_close[e + 1] = opens | (closes << 32);
    if (e == 0) open_close[0] = 0;
}

// Small levels: part 1 and its scan in one block (one launch instead of two).
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_small_event_scan(const signed char* __restrict__ event_kind, long long num_events,
                    long long num_segments, long long* __restrict__ open_close_ex,
                    unsigned long long* __restrict__ seg_min_cost,
                    unsigned long long* __restrict__ seg_best)
{
    for (long long i = threadIdx.x; i < num_segments; i += blockDim.x) {
        seg_min_cost[i] = KD_INF_BITS;
        seg_best[i] = KD_NO_INDEX;
    }
    kd_block_scan(KdLoadOpenClose{event_kind}, num_events + 1, open_close_ex);
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
    const int* event_seg;
    const long long* open_close_ex;
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
    double* event_cost;
    signed char* event_side;
    unsigned long long* seg_min_cost;
};

// Event e's cost. Every lane of a warp must call it (e >= num_events for
// lanes past the end): they take part in the segmented minimum at the end.
__device__ __forceinline__ void kd_split_cost_event(const KdCostArgs& a, long long e)
{
    bool live = e < a.num_events;
    double cost = __longlong_as_double(0x7ff0000000000000ll);  // +inf: not a candidate
    signed char side = KD_SIDE_LEFT;
    int seg = live ? a.event_seg[e] : -1;
    if (live) {
        int node = (int)(seg % a.num_nodes);
        int axis = (int)(seg / a.num_nodes);
        float p = a.event_pos[e];
        float lo_k = a.node_lo[3 * node + axis];
        float hi_k = a.node_hi[3 * node + axis];
        long long n_all = a.node_ref_offset[node + 1] - a.node_ref_offset[node];
        bool head = e == 0 || a.event_seg[e - 1] != seg || a.event_pos[e - 1] != p;
        if (head && kd_node_active(n_all, a.leaf_size, a.level_active) && p > lo_k && p < hi_k
            && (!a.longest_only || kd_longest_axis(a.node_lo, a.node_hi, node) == axis)) {
            long long seg_start = a.seg_event_offset[seg];
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
            double ext_l[3] = {ext[0], ext[1], ext[2]};
            double ext_r[3] = {ext[0], ext[1], ext[2]};
            ext_l[axis] = __dsub_rn((double)p, (double)lo_k);
            ext_r[axis] = __dsub_rn((double)hi_k, (double)p);
            double area_l = kd_half_area(ext_l[0], ext_l[1], ext_l[2]);
            double area_r = kd_half_area(ext_r[0], ext_r[1], ext_r[2]);
            double cost_l = kd_split_cost(a.k_traversal, a.k_intersect, a.empty_bonus, area_l,
                                          area_r, area, n_left + n_planar, n_right);
            double cost_r = kd_split_cost(a.k_traversal, a.k_intersect, a.empty_bonus, area_l,
                                          area_r, area, n_left, n_right + n_planar);
            if (cost_l <= cost_r) {
                cost = cost_l;
            } else {
                cost = cost_r;
                side = KD_SIDE_RIGHT;
            }
        }
        a.event_cost[e] = cost;
        a.event_side[e] = side;
    }
    unsigned long long bits = (unsigned long long)__double_as_longlong(cost);
    kd_warp_segmented_atomic_min(live && bits != KD_INF_BITS ? bits : KD_NO_INDEX, seg,
                                 a.seg_min_cost);
}

extern "C" __global__ void kd_split_costs(const float* __restrict__ event_pos,
                                          const int* __restrict__ event_seg,
                                          const long long* __restrict__ open_close_ex,
                                          const long long* __restrict__ seg_event_offset,
                                          const long long* __restrict__ node_ref_offset,
                                          const float* __restrict__ node_lo,
                                          const float* __restrict__ node_hi,
                                          long long num_nodes,
                                          long long num_events,
                                          long long leaf_size,
                                          int level_active,
                                          int longest_only,
                                          double k_traversal, double k_intersect,
                                          double empty_bonus,
                                          double* __restrict__ event_cost,
                                          signed char* __restrict__ event_side,
                                          unsigned long long* __restrict__ seg_min_cost)
{
    KdCostArgs a = {event_pos, event_seg, open_close_ex, seg_event_offset, node_ref_offset,
                    node_lo, node_hi, num_nodes, num_events, leaf_size, level_active,
                    longest_only, k_traversal, k_intersect, empty_bonus, event_cost, event_side,
                    seg_min_cost};
    kd_split_cost_event(a, kd_tid());
}

// Stage select_best_splits, arg-min: the lowest event index whose cost equals
// its segment's minimum (lowest index = lowest position: rule R8's tie-break).
// Every lane of a warp must call it (as kd_split_cost_event).
__device__ __forceinline__ void kd_argmin_event(const double* event_cost, const int* event_seg,
                                                const unsigned long long* seg_min_cost,
                                                long long num_events,
                                                unsigned long long* seg_best, long long e)
{
    bool live = e < num_events;
    int seg = live ? event_seg[e] : -1;
    unsigned long long key = KD_NO_INDEX;
    if (live) {
        unsigned long long bits = (unsigned long long)__double_as_longlong(event_cost[e]);
        if (bits != KD_INF_BITS && bits == seg_min_cost[seg]) key = (unsigned long long)e;
    }
    kd_warp_segmented_atomic_min(key, seg, seg_best);
}

extern "C" __global__ void kd_segment_argmin(const double* __restrict__ event_cost,
                                             const int* __restrict__ event_seg,
                                             const unsigned long long* __restrict__ seg_min_cost,
                                             long long num_events,
                                             unsigned long long* __restrict__ seg_best)
{
    kd_argmin_event(event_cost, event_seg, seg_min_cost, num_events, seg_best, kd_tid());
}

// Stage select_best_splits + decide_leaves, per node: the best of the three
// axes' best planes (ties keep the lower axis), and whether to split (R4, R8).
// Writes the packed (split, leaf triangle count) scan input after a leading 0.
struct KdSelectArgs {
    const unsigned long long* seg_best;
    const double* event_cost;
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
    double cost = __longlong_as_double(0x7ff0000000000000ll);
    int axis = 0;
    long long ev = -1;
    for (int k = 0; k < 3; ++k) {
        unsigned long long best = a.seg_best[k * a.num_nodes + i];
        if (best != KD_NO_INDEX) {
            double c = a.event_cost[best];
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

// Kernel parameters as flat arguments (CuPy passes arrays and scalars only),
// gathered into the struct inside the kernel.
#define KD_SELECT_PARAMS                                                                  \
    const unsigned long long *seg_best, const double *event_cost, const float *event_pos, \
        const signed char *event_side, const long long *node_ref_offset, long long num_nodes, \
        long long leaf_size, int level_active, double k_intersect, double *best_cost,        \
        signed char *best_axis, float *best_pos, signed char *best_side, bool *node_split,   \
        long long *split_leaf
#define KD_SELECT_ARGS                                                                    \
    {seg_best, event_cost, event_pos, event_side, node_ref_offset, num_nodes, leaf_size,     \
     level_active, k_intersect, best_cost, best_axis, best_pos, best_side, node_split,       \
     split_leaf}

extern "C" __global__ void kd_select_splits(KD_SELECT_PARAMS)
{
    KdSelectArgs a = KD_SELECT_ARGS;
    long long i = kd_tid();
    if (i < a.num_nodes) kd_select_node(a, i);
}

// Small levels: one block selects every node's split, then scans the packed
// (split, leaf count) values into split_leaf_ex: one launch instead of two.
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_small_select_scan(KD_SELECT_PARAMS, long long* __restrict__ split_leaf_ex)
{
    KdSelectArgs a = KD_SELECT_ARGS;
    for (long long i = threadIdx.x; i < a.num_nodes; i += blockDim.x) kd_select_node(a, i);
    __syncthreads();
    kd_block_scan(KdLoadArray{a.split_leaf}, a.num_nodes + 1, split_leaf_ex);
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

// Stages classify_triangles and route_events' flags in one launch over
// max(R, E) threads: thread i classifies reference i (ref_class, ref_lr) and
// event i, which classifies its own reference again rather than wait for it.
// Both scan inputs get a leading 0.
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
    long long* ref_lr;    // (R + 1)
    long long* event_lr;  // (E + 1)
};

__device__ __forceinline__ void kd_classify_item(const KdClassifyArgs& a, long long i)
{
    if (i == 0) {
        a.ref_lr[0] = 0;
        a.event_lr[0] = 0;
    }
    if (i < a.num_refs) {
        unsigned char cls = kd_classify(a.ref_tri[i], a.ref_node[i], a.best_axis, a.best_pos,
                                        a.best_side, a.node_split, a.tri_lo, a.tri_hi);
        a.ref_class[i] = cls;
        a.ref_lr[i + 1] = kd_pack_lr(cls);
    }
    if (i < a.num_events) {
        int ref = a.event_ref[i];
        unsigned char cls = kd_classify(a.ref_tri[ref], a.ref_node[ref], a.best_axis,
                                        a.best_pos, a.best_side, a.node_split, a.tri_lo,
                                        a.tri_hi);
        a.event_lr[i + 1] = kd_pack_lr(cls);
    }
}

extern "C" __global__ void kd_classify(const int* __restrict__ ref_tri,
                                       const int* __restrict__ ref_node,
                                       const int* __restrict__ event_ref,
                                       const signed char* __restrict__ best_axis,
                                       const float* __restrict__ best_pos,
                                       const signed char* __restrict__ best_side,
                                       const bool* __restrict__ node_split,
                                       const float* __restrict__ tri_lo,
                                       const float* __restrict__ tri_hi,
                                       long long num_refs, long long num_events,
                                       unsigned char* __restrict__ ref_class,
                                       long long* __restrict__ ref_lr,
                                       long long* __restrict__ event_lr)
{
    KdClassifyArgs a = {ref_tri, ref_node, event_ref, best_axis, best_pos, best_side,
                        node_split, tri_lo, tri_hi, num_refs, num_events, ref_class, ref_lr,
                        event_lr};
    kd_classify_item(a, kd_tid());
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
    const long long* ref_lr_ex;
    const long long* seg_event_offset;
    const long long* event_lr_ex;
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
    const long long* lr_ex = refs ? a.ref_lr_ex : a.event_lr_ex;
    long long* child_count = refs ? a.child_ref_count : a.child_event_count;
    long long node = g % a.num_nodes;
    if (!a.node_split[node]) return;
    long long num_split = KD_LOW(a.split_leaf_ex[a.num_nodes]);
    long long c = kd_child_group(g, a.num_nodes, a.split_leaf_ex, num_split);
    long long start = lr_ex[group_offset[g]], end = lr_ex[group_offset[g + 1]];
    child_count[c + 1] = KD_LOW(end) - KD_LOW(start);
    child_count[c + 2] = KD_HIGH(end) - KD_HIGH(start);
}

#define KD_ROUTE_PARAMS                                                                    \
    const long long *node_ref_offset, const long long *ref_lr_ex,                          \
        const long long *seg_event_offset, const long long *event_lr_ex,                   \
        const bool *node_split, const long long *split_leaf_ex, long long num_nodes,       \
        long long *child_ref_count, long long *child_event_count
#define KD_ROUTE_ARGS                                                                      \
    {node_ref_offset, ref_lr_ex, seg_event_offset, event_lr_ex, node_split, split_leaf_ex,  \
     num_nodes, child_ref_count, child_event_count}

extern "C" __global__ void kd_child_counts(KD_ROUTE_PARAMS)
{
    KdRouteArgs a = KD_ROUTE_ARGS;
    long long t = kd_tid();
    if (t < 4 * a.num_nodes) kd_child_count(a, t);
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

// Small levels: one block does all of route_refs and route_events (the two
// flag scans, the child counts, the two offset scans) and gathers the totals:
// one launch instead of five and a memset.
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_small_route(KD_ROUTE_PARAMS, const long long* __restrict__ ref_lr, long long num_refs,
               long long* out_ref_lr_ex, const long long* __restrict__ event_lr,
               long long num_events, long long* out_event_lr_ex,
               long long* __restrict__ child_ref_offset,
               long long* __restrict__ child_event_offset, long long* __restrict__ totals)
{
    // ref_lr_ex / event_lr_ex (inputs of KdRouteArgs) are the outputs of the
    // first two scans: the caller passes the same arrays for both.
    KdRouteArgs a = KD_ROUTE_ARGS;
    kd_block_scan(KdLoadArray{ref_lr}, num_refs + 1, out_ref_lr_ex);
    kd_block_scan(KdLoadArray{event_lr}, num_events + 1, out_event_lr_ex);
    long long n = a.num_nodes;
    for (long long i = threadIdx.x; i < 2 * n + 1; i += blockDim.x) a.child_ref_count[i] = 0;
    for (long long i = threadIdx.x; i < 6 * n + 1; i += blockDim.x) a.child_event_count[i] = 0;
    __syncthreads();
    for (long long t = threadIdx.x; t < 4 * n; t += blockDim.x) kd_child_count(a, t);
    __syncthreads();
    kd_block_scan(KdLoadArray{a.child_ref_count}, 2 * n + 1, child_ref_offset);
    kd_block_scan(KdLoadArray{a.child_event_count}, 6 * n + 1, child_event_offset);
    if (threadIdx.x == 0)
        kd_write_totals(a.split_leaf_ex, child_ref_offset, child_event_offset, n, totals);
}

extern "C" __global__ void kd_level_totals(const long long* __restrict__ split_leaf_ex,
                                           const long long* __restrict__ child_ref_offset,
                                           const long long* __restrict__ child_event_offset,
                                           long long num_nodes,
                                           long long* __restrict__ totals)
{
    if (kd_tid() == 0)
        kd_write_totals(split_leaf_ex, child_ref_offset, child_event_offset, num_nodes, totals);
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
        // Stage make_child_nodes: left = hi[axis] = p, right = lo[axis] = p.
        long long c = 2 * KD_LOW(s0);
        for (int k = 0; k < 3; ++k) {
            float lo = a.node_lo[3 * i + k], hi = a.node_hi[3 * i + k];
            a.child_lo[3 * c + k] = lo;
            a.child_hi[3 * c + k] = k == axis ? p : hi;
            a.child_lo[3 * (c + 1) + k] = k == axis ? p : lo;
            a.child_hi[3 * (c + 1) + k] = hi;
        }
    } else {
        a.out_axis[o] = KD_AXIS_LEAF;
        a.out_split[o] = 0.0f;
        a.out_child[o] = (int)(a.leaf_ref_base + KD_HIGH(s0));
        a.out_count[o] = (int)(KD_HIGH(s1) - KD_HIGH(s0));
    }
}

extern "C" __global__ void kd_emit_nodes(const bool* __restrict__ node_split,
                                         const signed char* __restrict__ best_axis,
                                         const float* __restrict__ best_pos,
                                         const long long* __restrict__ split_leaf_ex,
                                         const float* __restrict__ node_lo,
                                         const float* __restrict__ node_hi,
                                         long long num_nodes, long long level_base,
                                         long long leaf_ref_base,
                                         signed char* __restrict__ out_axis,
                                         float* __restrict__ out_split,
                                         int* __restrict__ out_child,
                                         int* __restrict__ out_count,
                                         float* __restrict__ child_lo,
                                         float* __restrict__ child_hi)
{
    KdEmitArgs a = {node_split, best_axis, best_pos, split_leaf_ex, node_lo, node_hi, num_nodes,
                    level_base, leaf_ref_base, out_axis, out_split, out_child, out_count,
                    child_lo, child_hi};
    kd_emit_node(a, kd_tid());
}

// Stages split_refs and split_events in one launch over max(R, E) threads:
// thread i moves reference i (stable compaction into the children, or into
// the level's leaf list) and event i (into its child segments, order kept, no
// re-sort). An event points at its reference's copy in the same child, whose
// index the thread computes from the same scans as the reference's thread.
__device__ __forceinline__ void kd_ref_destinations(long long r, int node,
                                                    const long long* ref_lr_ex,
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
    const long long* ref_lr_ex;
    const long long* node_ref_offset;
    const long long* split_leaf_ex;
    const long long* child_ref_offset;
    const float* event_pos;
    const signed char* event_kind;
    const int* event_ref;
    const int* event_seg;
    const long long* event_lr_ex;
    const long long* seg_event_offset;
    const long long* child_event_offset;
    long long num_nodes, num_refs, num_events, leaf_ref_base;
    int* leaf_tris;
    int* child_tri;
    int* child_node;
    float* out_pos;
    signed char* out_kind;
    int* out_ref;
    int* out_seg;
};

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
        if (cls == 0) return;
        int node = a.ref_node[ref];
        long long rl, rr;
        kd_ref_destinations(ref, node, a.ref_lr_ex, a.node_ref_offset, a.split_leaf_ex,
                            a.child_ref_offset, &rl, &rr);
        int seg = a.event_seg[i];
        long long num_split = KD_LOW(a.split_leaf_ex[a.num_nodes]);
        long long child_seg = kd_child_group(seg, a.num_nodes, a.split_leaf_ex, num_split);
        long long lr_e = a.event_lr_ex[i], lr_s = a.event_lr_ex[a.seg_event_offset[seg]];
        float pos = a.event_pos[i];
        signed char kind = a.event_kind[i];
        if (cls & KD_CLASS_LEFT) {
            long long dst = a.child_event_offset[child_seg] + (KD_LOW(lr_e) - KD_LOW(lr_s));
            a.out_pos[dst] = pos;
            a.out_kind[dst] = kind;
            a.out_ref[dst] = (int)rl;
            a.out_seg[dst] = (int)child_seg;
        }
        if (cls & KD_CLASS_RIGHT) {
            long long dst = a.child_event_offset[child_seg + 1] + (KD_HIGH(lr_e) - KD_HIGH(lr_s));
            a.out_pos[dst] = pos;
            a.out_kind[dst] = kind;
            a.out_ref[dst] = (int)rr;
            a.out_seg[dst] = (int)(child_seg + 1);
        }
    }
}

extern "C" __global__ void kd_scatter(const int* __restrict__ ref_tri,
                                      const int* __restrict__ ref_node,
                                      const unsigned char* __restrict__ ref_class,
                                      const long long* __restrict__ ref_lr_ex,
                                      const long long* __restrict__ node_ref_offset,
                                      const long long* __restrict__ split_leaf_ex,
                                      const long long* __restrict__ child_ref_offset,
                                      const float* __restrict__ event_pos,
                                      const signed char* __restrict__ event_kind,
                                      const int* __restrict__ event_ref,
                                      const int* __restrict__ event_seg,
                                      const long long* __restrict__ event_lr_ex,
                                      const long long* __restrict__ seg_event_offset,
                                      const long long* __restrict__ child_event_offset,
                                      long long num_nodes, long long num_refs,
                                      long long num_events, long long leaf_ref_base,
                                      int* __restrict__ leaf_tris,
                                      int* __restrict__ child_tri,
                                      int* __restrict__ child_node,
                                      float* __restrict__ out_pos,
                                      signed char* __restrict__ out_kind,
                                      int* __restrict__ out_ref,
                                      int* __restrict__ out_seg)
{
    KdScatterArgs a = {ref_tri, ref_node, ref_class, ref_lr_ex, node_ref_offset, split_leaf_ex,
                       child_ref_offset, event_pos, event_kind, event_ref, event_seg,
                       event_lr_ex, seg_event_offset, child_event_offset, num_nodes, num_refs,
                       num_events, leaf_ref_base, leaf_tris, child_tri, child_node, out_pos,
                       out_kind, out_ref, out_seg};
    kd_scatter_item(a, kd_tid());
}

// --- the whole level loop in one block (small builds) ------------------------------
// Small builds are bound by host work per level (launches, allocations and the
// read of the next level's sizes), not by the GPU. This kernel runs the same
// stage functions as the kernels above, level after level, in one block of
// KD_LOOP_BLOCK threads, with a barrier where the launches would end: one
// launch and one read for the whole build. Levels live in two buffers of
// fixed capacity (ping-pong, slot * capacity); a level whose children or
// output would not fit stops the loop before that level writes anything, and
// the host goes on from that level with the launch-per-stage loop.
#define KD_LOOP_BLOCK 1024

// body(i) for i in [0, n), with the same trip count in every thread so that
// every lane of every warp reaches the warp collectives of the cost passes.
template <typename Body>
__device__ __forceinline__ void kd_block_for(long long n, Body body)
{
    for (long long base = 0; base < n; base += KD_LOOP_BLOCK) body(base + threadIdx.x);
}

// Pointers are not __restrict__: each array is written by one pass and read
// by later passes of the same launch (no read-only cache).
extern "C" __global__ void __launch_bounds__(KD_LOOP_BLOCK)
kd_build_levels_block(const float* __restrict__ tri_lo, const float* __restrict__ tri_hi,
                      // the root level (read only)
                      const float* root_pos, const signed char* root_kind, const int* root_ref,
                      const int* root_seg, const int* root_tri, const int* root_node,
                      const float* root_lo, const float* root_hi,
                      const long long* root_ref_offset, const long long* root_seg_offset,
                      long long root_refs, long long root_events,
                      // two level buffers: slot s of an array starts at s * its capacity
                      float* lvl_pos, signed char* lvl_kind, int* lvl_ref, int* lvl_seg,
                      int* lvl_tri, int* lvl_node, float* lvl_lo, float* lvl_hi,
                      long long* lvl_ref_offset, long long* lvl_seg_offset,
                      long long cap_events, long long cap_refs, long long cap_nodes,
                      // per-level scratch, sized by the capacities
                      long long* open_close_ex, unsigned long long* seg_min_cost,
                      unsigned long long* seg_best, double* event_cost,
                      signed char* event_side, double* best_cost, signed char* best_axis,
                      float* best_pos, signed char* best_side, bool* node_split,
                      long long* split_leaf, long long* split_leaf_ex,
                      unsigned char* ref_class, long long* ref_lr, long long* ref_lr_ex,
                      long long* event_lr, long long* event_lr_ex, long long* child_count,
                      // the tree
                      signed char* out_axis, float* out_split, int* out_child, int* out_count,
                      long long cap_out_nodes, int* leaf_tris, long long cap_leaf_refs,
                      // settings
                      long long max_depth, long long leaf_size, int longest_only,
                      double k_traversal, double k_intersect, double empty_bonus,
                      long long* status)  // KD_LOOP_SLOTS + 3 * (max_depth + 1)
{
    const float* pos = root_pos;
    const signed char* kind = root_kind;
    const int* ref = root_ref;
    const int* seg = root_seg;
    const int* tri = root_tri;
    const int* node = root_node;
    const float* lo = root_lo;
    const float* hi = root_hi;
    const long long* node_ref_offset = root_ref_offset;
    const long long* seg_event_offset = root_seg_offset;
    long long n = 1, num_refs = root_refs, num_events = root_events;
    long long level = 0, level_base = 0, leaf_ref_base = 0;
    int cur = -1;
    const long long ref_offset_cap = 2 * cap_nodes + 1, seg_offset_cap = 6 * cap_nodes + 1;
    for (;;) {
        int nxt = cur == 0 ? 1 : 0;
        long long* child_ref_offset = lvl_ref_offset + nxt * ref_offset_cap;
        long long* child_event_offset = lvl_seg_offset + nxt * seg_offset_cap;
        int level_active = level < max_depth;
        long long num_items = num_refs > num_events ? num_refs : num_events;

        // compute_split_costs (R5-R7)
        for (long long i = threadIdx.x; i < 3 * n; i += KD_LOOP_BLOCK) {
            seg_min_cost[i] = KD_INF_BITS;
            seg_best[i] = KD_NO_INDEX;
        }
        kd_block_scan<KdLoadOpenClose, KD_LOOP_BLOCK>(KdLoadOpenClose{kind}, num_events + 1,
                                                      open_close_ex);
        KdCostArgs cost = {pos, seg, open_close_ex, seg_event_offset, node_ref_offset, lo, hi,
                           n, num_events, leaf_size, level_active, longest_only, k_traversal,
                           k_intersect, empty_bonus, event_cost, event_side, seg_min_cost};
        kd_block_for(num_events, [&](long long e) { kd_split_cost_event(cost, e); });
        __syncthreads();
        // select_best_splits and decide_leaves (R4, R8)
        kd_block_for(num_events, [&](long long e) {
            kd_argmin_event(event_cost, seg, seg_min_cost, num_events, seg_best, e);
        });
        __syncthreads();
        KdSelectArgs select = {seg_best, event_cost, pos, event_side, node_ref_offset, n,
                               leaf_size, level_active, k_intersect, best_cost, best_axis,
                               best_pos, best_side, node_split, split_leaf};
        kd_block_for(n, [&](long long i) { if (i < n) kd_select_node(select, i); });
        __syncthreads();
        kd_block_scan<KdLoadArray, KD_LOOP_BLOCK>(KdLoadArray{split_leaf}, n + 1, split_leaf_ex);
        // classify_triangles (R9) and the routing flags
        KdClassifyArgs classify = {tri, node, ref, best_axis, best_pos, best_side, node_split,
                                   tri_lo, tri_hi, num_refs, num_events, ref_class, ref_lr,
                                   event_lr};
        kd_block_for(num_items, [&](long long i) { kd_classify_item(classify, i); });
        __syncthreads();
        // route_refs and route_events
        kd_block_scan<KdLoadArray, KD_LOOP_BLOCK>(KdLoadArray{ref_lr}, num_refs + 1, ref_lr_ex);
        kd_block_scan<KdLoadArray, KD_LOOP_BLOCK>(KdLoadArray{event_lr}, num_events + 1,
                                                  event_lr_ex);
        long long* child_ref_count = child_count;
        long long* child_event_count = child_count + 2 * n + 1;
        for (long long i = threadIdx.x; i < 8 * n + 2; i += KD_LOOP_BLOCK) child_count[i] = 0;
        __syncthreads();
        KdRouteArgs route = {node_ref_offset, ref_lr_ex, seg_event_offset, event_lr_ex,
                             node_split, split_leaf_ex, n, child_ref_count, child_event_count};
        kd_block_for(4 * n, [&](long long t) { if (t < 4 * n) kd_child_count(route, t); });
        __syncthreads();
        kd_block_scan<KdLoadArray, KD_LOOP_BLOCK>(KdLoadArray{child_ref_count}, 2 * n + 1,
                                                  child_ref_offset);
        kd_block_scan<KdLoadArray, KD_LOOP_BLOCK>(KdLoadArray{child_event_count}, 6 * n + 1,
                                                  child_event_offset);
        // The next level's sizes (every thread reads the same values).
        long long sl = split_leaf_ex[n];
        long long num_split = KD_LOW(sl), num_leaf_refs = KD_HIGH(sl);
        long long num_child_refs = child_ref_offset[2 * num_split];
        long long num_child_events = child_event_offset[6 * num_split];
        bool fits = 2 * num_split <= cap_nodes && num_child_refs <= cap_refs
                    && num_child_events <= cap_events && level_base + n <= cap_out_nodes
                    && leaf_ref_base + num_leaf_refs <= cap_leaf_refs;
        if (!fits) {
            if (threadIdx.x == 0) {
                status[KD_LOOP_STATE] = KD_LOOP_STOPPED;
                status[KD_LOOP_LEVEL] = level;
                status[KD_LOOP_NODES] = n;
                status[KD_LOOP_REFS] = num_refs;
                status[KD_LOOP_EVENTS] = num_events;
                status[KD_LOOP_LEVEL_BASE] = level_base;
                status[KD_LOOP_LEAF_BASE] = leaf_ref_base;
                status[KD_LOOP_BUFFER] = cur;
            }
            return;
        }
        // emit_level (R10) and make_child_nodes; split_refs and split_events
        float* child_lo = lvl_lo + nxt * 3 * cap_nodes;
        float* child_hi = lvl_hi + nxt * 3 * cap_nodes;
        KdEmitArgs emit = {node_split, best_axis, best_pos, split_leaf_ex, lo, hi, n, level_base,
                           leaf_ref_base, out_axis, out_split, out_child, out_count, child_lo,
                           child_hi};
        kd_block_for(n, [&](long long i) { kd_emit_node(emit, i); });
        float* child_pos = lvl_pos + nxt * cap_events;
        signed char* child_kind = lvl_kind + nxt * cap_events;
        int* child_ref = lvl_ref + nxt * cap_events;
        int* child_seg = lvl_seg + nxt * cap_events;
        int* child_tri = lvl_tri + nxt * cap_refs;
        int* child_node = lvl_node + nxt * cap_refs;
        KdScatterArgs scatter = {tri, node, ref_class, ref_lr_ex, node_ref_offset,
                                 split_leaf_ex, child_ref_offset, pos, kind, ref, seg,
                                 event_lr_ex, seg_event_offset, child_event_offset, n, num_refs,
                                 num_events, leaf_ref_base, leaf_tris, child_tri, child_node,
                                 child_pos, child_kind, child_ref, child_seg};
        kd_block_for(num_items, [&](long long i) { kd_scatter_item(scatter, i); });
        if (threadIdx.x == 0) {
            status[KD_LOOP_SLOTS + 3 * level] = n;
            status[KD_LOOP_SLOTS + 3 * level + 1] = num_refs;
            status[KD_LOOP_SLOTS + 3 * level + 2] = num_events;
        }
        level_base += n;
        leaf_ref_base += num_leaf_refs;
        ++level;
        if (num_split == 0) {
            if (threadIdx.x == 0) {
                status[KD_LOOP_STATE] = KD_LOOP_DONE;
                status[KD_LOOP_LEVEL] = level;
                status[KD_LOOP_NODES] = 0;
                status[KD_LOOP_REFS] = 0;
                status[KD_LOOP_EVENTS] = 0;
                status[KD_LOOP_LEVEL_BASE] = level_base;
                status[KD_LOOP_LEAF_BASE] = leaf_ref_base;
                status[KD_LOOP_BUFFER] = nxt;
            }
            return;
        }
        __syncthreads();
        cur = nxt;
        pos = child_pos;
        kind = child_kind;
        ref = child_ref;
        seg = child_seg;
        tri = child_tri;
        node = child_node;
        lo = child_lo;
        hi = child_hi;
        node_ref_offset = child_ref_offset;
        seg_event_offset = child_event_offset;
        n = 2 * num_split;
        num_refs = num_child_refs;
        num_events = num_child_events;
    }
}

// --- mesh preparation on the device (rule R1) ----------------------------------

// Per triangle: box, zero-area test and validity of the input. Flags: bit 0 an
// index out of range, bit 1 a non-finite coordinate (the host then names the
// first problem with the same checks as geometry.validate_mesh); valid[t] is
// set for triangles that enter the tree. -0.0 is folded into +0.0 as on the host.
// The cross product of two edges is exact in float64 (differences of float32
// values and their products are), so "zero" means exactly collinear points.
// Summary slots (unsigned 64-bit, reset by the host to KD_PREPARE_INIT):
// 0 error flags, 1 valid triangles, 2-4 valid triangles flat on x/y/z,
// 5-7 root box minimum, 8-10 maximum (order-preserving bits of the floats).
// Each block reduces in shared memory first, then makes one atomic per slot.
#define KD_SUMMARY_SLOTS 11

__device__ __forceinline__ unsigned int kd_ordered_bits32(float x)
{
    unsigned int u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

extern "C" __global__ void __launch_bounds__(256)
kd_prepare_triangles(const float* __restrict__ vertices,
                     const int* __restrict__ faces,
                     long long num_vertices,
                     long long num_triangles,
                     float* __restrict__ tri_lo,
                     float* __restrict__ tri_hi,
                     unsigned char* __restrict__ valid,
                     unsigned long long* __restrict__ summary)
{
    __shared__ unsigned int block_sum[KD_SUMMARY_SLOTS];
    if (threadIdx.x < KD_SUMMARY_SLOTS)
        block_sum[threadIdx.x] = threadIdx.x >= 5 && threadIdx.x < 8 ? 0xffffffffu : 0u;
    __syncthreads();
    long long t = kd_tid();
    unsigned int mine[KD_SUMMARY_SLOTS];
    for (int q = 0; q < KD_SUMMARY_SLOTS; ++q) mine[q] = q >= 5 && q < 8 ? 0xffffffffu : 0u;
    if (t < num_triangles) {
        double p[3][3];
        bool ok = true;
        for (int j = 0; j < 3; ++j) {
            int v = faces[3 * t + j];
            if (v < 0 || v >= num_vertices) {
                mine[0] |= 1u;
                ok = false;
                v = 0;
            }
            for (int k = 0; k < 3; ++k) {
                float x = vertices[3 * (long long)v + k] + 0.0f;
                if (!isfinite(x)) {
                    mine[0] |= 2u;
                    ok = false;
                }
                p[j][k] = (double)x;
            }
        }
        float lo[3], hi[3];
        for (int k = 0; k < 3; ++k) {
            float a = (float)p[0][k], b = (float)p[1][k], c = (float)p[2][k];
            lo[k] = fminf(a, fminf(b, c));
            hi[k] = fmaxf(a, fmaxf(b, c));
            tri_lo[3 * t + k] = lo[k];
            tri_hi[3 * t + k] = hi[k];
        }
        double e1[3], e2[3];
        for (int k = 0; k < 3; ++k) {
            e1[k] = __dsub_rn(p[1][k], p[0][k]);
            e2[k] = __dsub_rn(p[2][k], p[0][k]);
        }
        double cx = __dsub_rn(__dmul_rn(e1[1], e2[2]), __dmul_rn(e1[2], e2[1]));
        double cy = __dsub_rn(__dmul_rn(e1[2], e2[0]), __dmul_rn(e1[0], e2[2]));
        double cz = __dsub_rn(__dmul_rn(e1[0], e2[1]), __dmul_rn(e1[1], e2[0]));
        bool is_valid = ok && (cx != 0.0 || cy != 0.0 || cz != 0.0);
        valid[t] = is_valid;
        if (is_valid) {
            mine[1] = 1;
            for (int k = 0; k < 3; ++k) {
                mine[2 + k] = lo[k] == hi[k];
                mine[5 + k] = kd_ordered_bits32(lo[k]);
                mine[8 + k] = kd_ordered_bits32(hi[k]);
            }
        }
    }
    const unsigned full = 0xffffffffu;
    unsigned int r0 = __reduce_or_sync(full, mine[0]);
    unsigned int r[KD_SUMMARY_SLOTS];
    r[0] = r0;
    for (int q = 1; q < 5; ++q) r[q] = __reduce_add_sync(full, mine[q]);
    for (int q = 5; q < 8; ++q) r[q] = __reduce_min_sync(full, mine[q]);
    for (int q = 8; q < 11; ++q) r[q] = __reduce_max_sync(full, mine[q]);
    if ((threadIdx.x & 31) == 0) {
        atomicOr(&block_sum[0], r[0]);
        for (int q = 1; q < 5; ++q) atomicAdd(&block_sum[q], r[q]);
        for (int q = 5; q < 8; ++q) atomicMin(&block_sum[q], r[q]);
        for (int q = 8; q < 11; ++q) atomicMax(&block_sum[q], r[q]);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (block_sum[0]) atomicOr(&summary[0], (unsigned long long)block_sum[0]);
        for (int q = 1; q < 5; ++q)
            if (block_sum[q]) atomicAdd(&summary[q], (unsigned long long)block_sum[q]);
        for (int q = 5; q < 8; ++q) atomicMin(&summary[q], (unsigned long long)block_sum[q]);
        for (int q = 8; q < 11; ++q) atomicMax(&summary[q], (unsigned long long)block_sum[q]);
    }
}

// --- root events (rule R3) -----------------------------------------------------------

// Per valid triangle reference r and axis k, two sort keys in slots 2r, 2r + 1
// of axis k's key array: (ordered position bits << 32) | (kind << 30) | r.
// A planar triangle has one event; its second slot gets the largest key,
// which sorts after every real event and is cut off.
__device__ __forceinline__ unsigned long long kd_ordered_bits(float x)
{
    unsigned int u = __float_as_uint(x);
    return (unsigned long long)((u & 0x80000000u) ? ~u : (u | 0x80000000u));
}

// Key layout: axis (2 bits) | ordered position (32) | kind (2) | reference (28),
// so one sort orders the three axes' events at once (rule R3 within each axis).
#define KD_KEY_REF_BITS 28

__device__ __forceinline__ unsigned long long kd_event_key(int axis, float pos, int kind,
                                                           long long ref)
{
    return ((unsigned long long)axis << 62) | (kd_ordered_bits(pos) << (KD_KEY_REF_BITS + 2))
           | ((unsigned long long)kind << KD_KEY_REF_BITS) | (unsigned long long)ref;
}

extern "C" __global__ void kd_root_event_keys(const float* __restrict__ tri_lo,
                                              const float* __restrict__ tri_hi,
                                              const int* __restrict__ ref_tri,
                                              long long num_refs,
                                              unsigned long long* __restrict__ keys)  // (3, 2R)
{
    long long r = kd_tid();
    if (r >= num_refs) return;
    int tri = ref_tri[r];
    for (int k = 0; k < 3; ++k) {
        float a = tri_lo[3 * tri + k], b = tri_hi[3 * tri + k];
        unsigned long long* out = keys + (long long)k * 2 * num_refs + 2 * r;
        if (a == b) {
            out[0] = kd_event_key(k, a, KD_EVENT_PLANAR, r);
            out[1] = 0xffffffffffffffffull;
        } else {
            out[0] = kd_event_key(k, b, KD_EVENT_END, r);
            out[1] = kd_event_key(k, a, KD_EVENT_START, r);
        }
    }
}

// Decode the sorted keys into the root's event arrays (segment = axis).
extern "C" __global__ void kd_root_events_decode(const unsigned long long* __restrict__ keys,
                                                 long long count,
                                                 float* __restrict__ event_pos,
                                                 signed char* __restrict__ event_kind,
                                                 int* __restrict__ event_ref,
                                                 int* __restrict__ event_seg)
{
    long long e = kd_tid();
    if (e >= count) return;
    unsigned long long key = keys[e];
    unsigned int bits = (unsigned int)(key >> (KD_KEY_REF_BITS + 2));
    bits = (bits & 0x80000000u) ? (bits & 0x7fffffffu) : ~bits;
    event_pos[e] = __uint_as_float(bits);
    event_kind[e] = (signed char)((key >> KD_KEY_REF_BITS) & 3u);
    event_ref[e] = (int)(key & ((1ull << KD_KEY_REF_BITS) - 1));
    event_seg[e] = (int)(key >> 62);
}

extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_scan_tile_sums(const long long* __restrict__ in, long long n, long long* __restrict__ tile_sum)
{
    long long base = (long long)blockIdx.x * KD_SCAN_TILE;
    long long sum = 0;
    for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
        long long i = base + (long long)j * KD_SCAN_BLOCK + threadIdx.x;
        if (i < n) sum += in[i];
    }
    long long total;
    kd_block_exclusive_scan(sum, &total);
    if (threadIdx.x == 0) tile_sum[blockIdx.x] = total;
}

// One block scans the tile sums in place into exclusive tile prefixes.
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_scan_tile_prefix(long long* __restrict__ tile_sum, long long num_tiles)
{
    long long carry = 0;
    for (long long base = 0; base < num_tiles; base += KD_SCAN_BLOCK) {
        long long i = base + threadIdx.x;
        long long v = i < num_tiles ? tile_sum[i] : 0;
        long long total;
        long long ex = kd_block_exclusive_scan(v, &total);
        if (i < num_tiles) tile_sum[i] = carry + ex;
        carry += total;
    }
}

// Each thread scans KD_SCAN_ITEMS consecutive items; tiles start at their prefix.
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_scan_tiles(const long long* __restrict__ in, long long n,
              const long long* __restrict__ tile_prefix, long long* __restrict__ out)
{
    long long base = (long long)blockIdx.x * KD_SCAN_TILE + (long long)threadIdx.x * KD_SCAN_ITEMS;
    long long v[KD_SCAN_ITEMS];
    long long sum = 0;
    for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
        long long i = base + j;
        v[j] = i < n ? in[i] : 0;
        sum += v[j];
    }
    long long total;
    long long prefix = kd_block_exclusive_scan(sum, &total) + tile_prefix[blockIdx.x];
    for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
        long long i = base + j;
        prefix += v[j];
        if (i < n) out[i] = prefix;
    }
}

// Small arrays: one block scans a whole array, one launch instead of three
// (the builder's small levels are bound by launch overhead, not by the scan).
// Two arrays may share the launch: block 0 scans (in0, out0), block 1 (in1, out1).
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_scan_small_pair(const long long* __restrict__ in0, long long n0, long long* __restrict__ out0,
                   const long long* __restrict__ in1, long long n1, long long* __restrict__ out1)
{
    if (blockIdx.x == 0)
        kd_block_scan(KdLoadArray{in0}, n0, out0);
    else
        kd_block_scan(KdLoadArray{in1}, n1, out1);
}
