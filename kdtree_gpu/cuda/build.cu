// Kernels of the level-by-level SAH kd-tree builder (kdtree_gpu/builder/gpu/level_stages.py),
// one launch per stage: each kernel runs the element-wise work between two
// scans of one build stage (the stage functions of build_stages.cuh), plus
// the scans, mesh preparation and root events.
#include "build_stages.cuh"
#include "tree_pages.cuh"

// Stage compute_split_costs, part 1, of small levels: the exclusive scan of each
// event's packed (opens, closes) counts (KdLoadOpenClose) in one block, whole (the
// large levels': cost_candidates.cu). Also resets each segment's minimum and arg-min.
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_small_event_scan(const signed char* __restrict__ event_kind, long long num_events,
                    long long num_segments, long long* __restrict__ open_close_ex,
                    unsigned long long* __restrict__ seg_argmin)
{
    for (long long i = threadIdx.x; i < num_segments; i += blockDim.x)
        kd_seg_argmin_reset(seg_argmin, i);
    kd_block_scan(KdLoadOpenClose{event_kind}, num_events + 1, open_close_ex);
}

// Stage compute_split_costs, part 2, of small levels (the large levels' runs
// over their candidates only: cost_candidates.cu), with select_best_splits'
// arg-min: each event's cost and side, each segment's minimum cost and its
// lowest event index at that minimum into seg_argmin (kd_split_cost_warp: a
// warp's 32 events at a time; the parts of segments reaching past them meet
// by atomics, kd_seg_argmin_lower). event_seg null (levels the loop hands
// over): segments from the references' nodes. The tests get each cost's halves in
// event_cost_hi/_lo where not null. The open/close scan: open_close_ex, whole.
// Six blocks a multiprocessor: the pass waits mostly on dependent loads (event
// -> its segment, or its reference -> node; then the scan), so more warps hide
// more.
extern "C" __global__ void __launch_bounds__(KD_LAUNCH_BLOCK, 6)
kd_split_costs(KD_COST_HEAD_PARAMS, const long long* __restrict__ open_close_ex,
               KD_COST_TAIL_PARAMS)
{
    const KdCostArgs a = KD_COST_ARGS(KdPackedScan(open_close_ex));
    kd_split_cost_warp(a, kd_tid() & ~31ll,
                       [&](long long e) { return a.event_seg.derived_node_of(e); });
}

// Kernel parameters as flat arguments (CuPy passes arrays and scalars only),
// gathered into the struct inside the kernel.
#define KD_SELECT_PARAMS                                                                  \
    const unsigned long long *seg_argmin, const float *event_pos,                         \
        const signed char *event_side, const long long *node_ref_offset, long long num_nodes, \
        long long leaf_size, int level_active, double k_intersect, double *best_cost,        \
        signed char *best_axis, float *best_pos, signed char *best_side, bool *node_split,   \
        long long *split_leaf, long long small_refs
#define KD_SELECT_ARGS                                                                    \
    {seg_argmin, event_pos,  event_side, node_ref_offset, num_nodes, leaf_size,  level_active, \
     k_intersect, best_cost, best_axis,  best_pos,        best_side, node_split, split_leaf}

extern "C" __global__ void kd_select_splits(KD_SELECT_PARAMS)
{
    KdSelectArgs a = KD_SELECT_ARGS;
    long long i = kd_tid();
    if (i < a.num_nodes) {
        kd_select_node(a, i);
        kd_defer_small(a, i, small_refs);
    }
}

// Small levels: one block selects every node's split, then scans the packed
// (split, leaf count) values into split_leaf_ex: one launch instead of two.
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_small_select_scan(KD_SELECT_PARAMS, long long* __restrict__ split_leaf_ex)
{
    KdSelectArgs a = KD_SELECT_ARGS;
    for (long long i = threadIdx.x; i < a.num_nodes; i += blockDim.x) {
        kd_select_node(a, i);
        kd_defer_small(a, i, small_refs);
    }
    __syncthreads();
    kd_block_scan(KdLoadArray{a.split_leaf}, a.num_nodes + 1, split_leaf_ex);
}

extern "C" __global__ void kd_classify(const int* __restrict__ ref_tri,
                                       const int* __restrict__ ref_node,
                                       const signed char* __restrict__ best_axis,
                                       const float* __restrict__ best_pos,
                                       const signed char* __restrict__ best_side,
                                       const bool* __restrict__ node_split,
                                       const float* __restrict__ tri_lo,
                                       const float* __restrict__ tri_hi, long long num_refs,
                                       unsigned char* __restrict__ ref_class, int clip)
{
    KdClassifyArgs a = {ref_tri, ref_node, best_axis, best_pos, best_side, node_split,
                        tri_lo, tri_hi, num_refs, ref_class, clip};
    kd_classify_ref(a, kd_tid());
}

// Stage route_refs and route_events: the scans of the references' and the
// events' (left, right) flags (KdLoadRefLR, KdLoadEventLR: derived from the
// classes kd_classify gave the references as the scans load them). The
// references' in scan.cuh's three passes. (Storing the flags first, then
// scanning them in place with CUB's single pass, moved 8 + 16 bytes an item
// more.) The events' scan is stored for no event (build_stages.cuh).
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_ref_lr_tile_sums(const unsigned char* __restrict__ ref_class, long long num_refs,
                    long long* __restrict__ tile_sum)
{
    kd_scan_tile_sum(KdLoadRefLR{ref_class}, num_refs + 1, tile_sum);
}

extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_ref_lr_tiles(const unsigned char* __restrict__ ref_class, long long num_refs,
                const long long* __restrict__ tile_prefix, long long* __restrict__ ref_lr_ex)
{
    kd_scan_tile(KdLoadRefLR{ref_class}, num_refs + 1, tile_prefix, ref_lr_ex);
}

// The stages' large levels: route_events' first pass (build_stages.cuh) over
// the E + 1 items of the events and their end, one block of KD_SCAN_BLOCK
// threads a tile of KD_SCAN_TILE items. It writes each tile's sum; for every
// warp's chunk of 32 items, the tile's scan before it (chunk_local, for
// kd_scatter_chunks); and for every segment s of the 3n + 1 (the last is
// the end, at E) whose first item lies in the tile, the tile's scan before
// that item (head_local; an empty segment's first item is the next one's).
// The block finds the segments of its tile in seg_event_offset together
// (kd_block_lower_bound). (Finding each event's segment instead gathered its
// reference's node and its segment's offset: 2.1x the time of the tile sums
// alone, H100, 5.5M triangles; one thread's binary search, 1.6x.)
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_event_lr_heads(const int* __restrict__ event_ref, const unsigned char* __restrict__ ref_class,
                  int clip, const long long* __restrict__ seg_event_offset, long long num_nodes,
                  long long num_events, long long* __restrict__ tile_sum,
                  unsigned int* __restrict__ chunk_local, unsigned int* __restrict__ head_local)
{
    __shared__ unsigned int local_at[KD_SCAN_TILE];
    const long long tile = (long long)blockIdx.x * KD_SCAN_TILE;
    const unsigned int total = kd_event_lr_tile(
        event_ref, ref_class, clip, tile, num_events, num_events + 1,
        [&](long long i, int, unsigned int local) {
            local_at[i - tile] = local;
            if ((i & 31) == 0) chunk_local[i >> 5] = local;
        });
    if (threadIdx.x == 0) tile_sum[blockIdx.x] = kd_lr64(total);
    const long long num_offsets = 3 * num_nodes + 1;
    const long long first = kd_block_lower_bound(seg_event_offset, 0, num_offsets, tile);
    const long long end =
        kd_block_lower_bound(seg_event_offset, first, num_offsets, tile + KD_SCAN_TILE);
    for (long long s = first + threadIdx.x; s < end; s += KD_SCAN_BLOCK)
        head_local[s] = local_at[seg_event_offset[s] - tile];
}

#define KD_ROUTE_PARAMS                                                                    \
    const long long *node_ref_offset, const long long *ref_lr_ex,                          \
        const long long *seg_event_offset, const long long *event_lr_ex,                   \
        const bool *node_split, const long long *split_leaf_ex, long long num_nodes,       \
        long long *child_ref_offset, long long *child_event_offset
#define KD_ROUTE_ARGS                                                                      \
    {node_ref_offset, ref_lr_ex, seg_event_offset, event_lr_ex, node_split, split_leaf_ex,  \
     num_nodes, nullptr, nullptr}

// route_refs and route_events for the stages' large levels, whose events'
// scan is the one kd_event_lr_heads leaves (event_lr_ex is null): the
// children's offsets (kd_child_offsets, item t of 6n + 1) with the scan at a
// segment's first event (or, for segment 3n, at the end) as its tile's prefix
// plus the head's local scan; each splitting node's segment starts go to
// seg_start (3n) for kd_scatter_chunks, and item 0 gathers the totals for
// the host's one read: [splitting nodes, child refs, child events, leaf refs].
extern "C" __global__ void kd_child_offsets_heads(KD_ROUTE_PARAMS,
                                                  const long long* __restrict__ event_tile_prefix,
                                                  const unsigned int* __restrict__ head_local,
                                                  long long* __restrict__ seg_start,
                                                  long long* __restrict__ totals)
{
    const KdRouteArgs a = KD_ROUTE_ARGS;
    const long long t = kd_tid();
    const auto scan_at = [&](long long g) {
        return event_tile_prefix[seg_event_offset[g] / KD_SCAN_TILE] + kd_lr64(head_local[g]);
    };
    if (t > 6 * a.num_nodes) return;
    const long long start = kd_child_offsets(a, t, scan_at, child_ref_offset, child_event_offset);
    if (start >= 0) seg_start[t - a.num_nodes] = start;
    if (t == 0) kd_level_totals_of(a, scan_at, totals);
}

// Small levels: one block does all of route_refs and route_events (the two
// flag scans and the children's offsets, kd_child_offsets) and gathers the
// totals: one launch.
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_small_route(KD_ROUTE_PARAMS, const unsigned char* __restrict__ ref_class, long long num_refs,
               long long* out_ref_lr_ex, const int* __restrict__ event_ref, int clip,
               long long num_events, long long* out_event_lr_ex, long long* __restrict__ totals)
{
    // ref_lr_ex / event_lr_ex (inputs of KdRouteArgs) are the outputs of the
    // two scans: the caller passes the same arrays for both.
    const KdRouteArgs a = KD_ROUTE_ARGS;
    kd_block_scan(KdLoadRefLR{ref_class}, num_refs + 1, out_ref_lr_ex);
    kd_block_scan(KdLoadEventLR{event_ref, ref_class, clip}, num_events + 1, out_event_lr_ex);
    __syncthreads();
    const auto scan_at = [&](long long g) { return a.event_lr_ex[a.seg_event_offset[g]]; };
    for (long long t = threadIdx.x; t <= 6 * a.num_nodes; t += blockDim.x)
        kd_child_offsets(a, t, scan_at, child_ref_offset, child_event_offset);
    if (threadIdx.x == 0) kd_level_totals_of(a, scan_at, totals);
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

// The records of a level's deferred nodes (kd_defer_small), after their leaf scan,
// from row records_before of `deferred` on; counters (zeroed) receive this level's
// records and their references.
extern "C" __global__ void kd_defer_records(const signed char* __restrict__ best_axis,
                                            const long long* __restrict__ node_ref_offset,
                                            const long long* __restrict__ split_leaf_ex,
                                            const float* __restrict__ node_lo,
                                            const float* __restrict__ node_hi,
                                            long long num_nodes, long long level_base, int level,
                                            long long leaf_ref_base, long long records_before,
                                            int* __restrict__ deferred,
                                            long long* __restrict__ counters)
{
    const long long i = kd_tid();
    if (i < num_nodes && best_axis[i] == KD_SMALL_DEFERRED_AXIS)
        kd_record_deferred(i, node_ref_offset, split_leaf_ex, node_lo, node_hi, level_base,
                           level, leaf_ref_base, deferred + records_before * KD_SMALL_RECORD,
                           &counters[0], &counters[1]);
}

// The parameters of kd_scatter and kd_scatter_chunks before and after the
// events' scan (each kernel's own), and the KdScatterArgs they make
// (SCAN_ARG: its scan member).
#define KD_SCATTER_HEAD_PARAMS                                                              \
    const int *__restrict__ ref_tri, const int *__restrict__ ref_node,                      \
        const unsigned char *__restrict__ ref_class, const long long *__restrict__ ref_lr_ex, \
        const long long *__restrict__ node_ref_offset,                                      \
        const long long *__restrict__ split_leaf_ex,                                        \
        const long long *__restrict__ child_ref_offset, const float *__restrict__ event_pos, \
        const signed char *__restrict__ event_kind, const int *__restrict__ event_ref,      \
        const int *__restrict__ event_seg
#define KD_SCATTER_TAIL_PARAMS                                                              \
    const long long *__restrict__ seg_event_offset,                                         \
        const long long *__restrict__ child_event_offset, long long num_nodes,              \
        long long num_refs, long long num_events, long long leaf_ref_base,                  \
        int *__restrict__ leaf_tris, int *__restrict__ child_tri, int *__restrict__ child_node, \
        float *__restrict__ out_pos, signed char *__restrict__ out_kind,                    \
        int *__restrict__ out_ref, int *__restrict__ out_seg, int clip, long long room_refs,  \
        long long room_events
#define KD_SCATTER_ARGS(SCAN_ARG)                                                           \
    {ref_tri, ref_node, ref_class, ref_lr_ex, node_ref_offset, split_leaf_ex,              \
     child_ref_offset, event_pos, event_kind, event_ref,                                   \
     {event_seg, event_ref, ref_node, seg_event_offset, num_nodes},                        \
     SCAN_ARG, seg_event_offset, child_event_offset, num_nodes, num_refs,                  \
     num_events, leaf_ref_base, leaf_tris, child_tri, child_node, out_pos,                 \
     out_kind, out_ref, out_seg, clip, nullptr, nullptr, room_refs, room_events}

extern "C" __global__ void kd_scatter(KD_SCATTER_HEAD_PARAMS,
                                      const long long* __restrict__ event_lr_ex,
                                      KD_SCATTER_TAIL_PARAMS)
{
    KdScatterArgs a = KD_SCATTER_ARGS(event_lr_ex);
    // (the stages pass the children's offsets: no code for their absence, the loop's form)
    __builtin_assume(a.child_ref_offset != nullptr && a.child_event_offset != nullptr);
    kd_scatter_item(a, kd_tid());
}

// split_refs and split_events of the stages' large levels: thread i moves
// reference i and event i, as kd_scatter, with the events' scan made again:
// each warp scans the flags of its 32 events from the scan before them (the
// tile's prefix, event_tile_prefix, and the chunk's within the tile,
// chunk_local: kd_event_lr_heads), and a segment's start is seg_start's
// (kd_child_offsets_heads). Launched with whole warps a block. (Scanning a
// whole tile a block, eight events a thread, moved each thread's events one
// after another: 9% slower than kd_scatter with the scan stored, H100, 5.5M
// triangles; a block scan of chunks of a block's events, 7%.)
extern "C" __global__ void kd_scatter_chunks(KD_SCATTER_HEAD_PARAMS,
                                             const long long* __restrict__ event_tile_prefix,
                                             const unsigned int* __restrict__ chunk_local,
                                             const long long* __restrict__ seg_start,
                                             KD_SCATTER_TAIL_PARAMS)
{
    KdScatterArgs a = KD_SCATTER_ARGS(KdPackedScan());
    __builtin_assume(a.child_ref_offset != nullptr && a.child_event_offset != nullptr);
    const long long i = kd_tid();
    if (i < num_refs) kd_scatter_ref(a, i);
    if ((i & ~31ll) >= num_events) return;  // (the whole warp)
    const int ref = i < num_events ? event_ref[i] : -1;
    // The reference's scan and class from one gather of two adjacent scan values,
    // not two gathers: the pass is bound by L2 sectors (ncu, H100, 5.5M triangles).
    long long lr_ref = 0;
    unsigned char cls = 0;
    if (ref >= 0) {
        lr_ref = ref_lr_ex[ref];
        cls = kd_unpack_lr(ref_lr_ex[ref + 1] - lr_ref);
    }
    const unsigned int flags = ref >= 0 ? kd_lr16(kd_event_lr(cls, clip)) : 0u;
    const unsigned int x = kd_warp_inclusive_scan(flags);
    if (ref < 0) return;
    const long long lr =
        event_tile_prefix[i / KD_SCAN_TILE] + kd_lr64(chunk_local[i >> 5] + x - flags);
    kd_scatter_event(a, i, ref, a.event_seg.derived_node(ref), cls,
                     [&](long long) { return lr_ref; }, [&]() { return lr; },
                     [&](int seg) { return seg_start[seg]; });
}

// --- mesh preparation on the device (rule R1) ----------------------------------

// Per triangle: box, zero-area test and validity of the input. Flags: bit 0 an
// index out of range, bit 1 a non-finite coordinate (the host then names the
// first problem with the same checks as mesh.validate_mesh); valid[t] is
// 1 for triangles that enter the tree, else 0 (int64: its scan numbers them). -0.0 is folded into +0.0 as on the host.
// The cross product of two edges is exact in float64 (differences of float32
// values and their products are), so "zero" means exactly collinear points.
// Summary slots: encoding.SUMMARY_* (reset by the host before the launch).
// Each block reduces in shared memory first, then makes one atomic per slot.
// The identity of summary slot q for its reduction (minima start high).
__device__ __forceinline__ unsigned int kd_summary_identity(int q)
{
    return q >= KD_SUMMARY_LO && q < KD_SUMMARY_HI ? 0xffffffffu : 0u;
}

extern "C" __global__ void __launch_bounds__(KD_PREPARE_BLOCK)
kd_prepare_triangles(const float* __restrict__ vertices,
                     const int* __restrict__ faces,
                     long long num_vertices,
                     long long num_triangles,
                     float* __restrict__ tri_lo,
                     float* __restrict__ tri_hi,
                     long long* __restrict__ valid,
                     unsigned long long* __restrict__ summary)
{
    __shared__ unsigned int block_sum[KD_SUMMARY_SLOTS];
    if (threadIdx.x < KD_SUMMARY_SLOTS)
        block_sum[threadIdx.x] = kd_summary_identity(threadIdx.x);
    __syncthreads();
    long long t = kd_tid();
    unsigned int mine[KD_SUMMARY_SLOTS];
    for (int q = 0; q < KD_SUMMARY_SLOTS; ++q) mine[q] = kd_summary_identity(q);
    if (t < num_triangles) {
        double p[3][3];
        bool ok = true;
        for (int j = 0; j < 3; ++j) {
            int v = faces[3 * t + j];
            if (v < 0 || v >= num_vertices) {
                mine[KD_SUMMARY_FLAGS] |= KD_SUMMARY_BAD_INDEX;
                ok = false;
                v = 0;
            }
            for (int k = 0; k < 3; ++k) {
                float x = vertices[3 * (long long)v + k] + 0.0f;
                if (!isfinite(x)) {
                    mine[KD_SUMMARY_FLAGS] |= KD_SUMMARY_BAD_COORD;
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
            mine[KD_SUMMARY_VALID] = 1;
            float size = 0.0f;  // the largest side of the box (mesh.smallest_triangle)
            for (int k = 0; k < 3; ++k) {
                mine[KD_SUMMARY_PLANAR + k] = lo[k] == hi[k];
                mine[KD_SUMMARY_LO + k] = kd_ordered_bits32(lo[k]);
                mine[KD_SUMMARY_HI + k] = kd_ordered_bits32(hi[k]);
                size = fmaxf(size, __fsub_rn(hi[k], lo[k]));
            }
            mine[KD_SUMMARY_MIN_SIZE] = kd_ordered_bits32(size);
        }
    }
    const unsigned full = 0xffffffffu;
    // slots [FLAGS]: or; [VALID, LO): sums; [LO, HI): minima; [HI, SLOTS): maxima
    unsigned int r[KD_SUMMARY_SLOTS];
    r[KD_SUMMARY_FLAGS] = __reduce_or_sync(full, mine[KD_SUMMARY_FLAGS]);
    for (int q = KD_SUMMARY_VALID; q < KD_SUMMARY_LO; ++q) r[q] = __reduce_add_sync(full, mine[q]);
    for (int q = KD_SUMMARY_LO; q < KD_SUMMARY_HI; ++q) r[q] = __reduce_min_sync(full, mine[q]);
    for (int q = KD_SUMMARY_HI; q < KD_SUMMARY_SLOTS; ++q) r[q] = __reduce_max_sync(full, mine[q]);
    if ((threadIdx.x & 31) == 0) {
        atomicOr(&block_sum[KD_SUMMARY_FLAGS], r[KD_SUMMARY_FLAGS]);
        for (int q = KD_SUMMARY_VALID; q < KD_SUMMARY_LO; ++q) atomicAdd(&block_sum[q], r[q]);
        for (int q = KD_SUMMARY_LO; q < KD_SUMMARY_HI; ++q) atomicMin(&block_sum[q], r[q]);
        for (int q = KD_SUMMARY_HI; q < KD_SUMMARY_SLOTS; ++q) atomicMax(&block_sum[q], r[q]);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (block_sum[KD_SUMMARY_FLAGS])
            atomicOr(&summary[KD_SUMMARY_FLAGS], (unsigned long long)block_sum[KD_SUMMARY_FLAGS]);
        for (int q = KD_SUMMARY_VALID; q < KD_SUMMARY_LO; ++q)
            if (block_sum[q]) atomicAdd(&summary[q], (unsigned long long)block_sum[q]);
        for (int q = KD_SUMMARY_LO; q < KD_SUMMARY_HI; ++q)
            atomicMin(&summary[q], (unsigned long long)block_sum[q]);
        for (int q = KD_SUMMARY_HI; q < KD_SUMMARY_SLOTS; ++q)
            atomicMax(&summary[q], (unsigned long long)block_sum[q]);
    }
}

// The root level from the prepared mesh: reference r is the r-th valid
// triangle (valid_scan is the inclusive scan of the valid flags), every
// reference in node 0; thread 0 writes the root node's box and offsets from
// the summary (segment k holds 2 events per reference, 1 for a triangle flat
// on axis k).
extern "C" __global__ void kd_root_level(const long long* __restrict__ valid_scan,
                                         long long num_triangles,
                                         const unsigned long long* __restrict__ summary,
                                         int* __restrict__ ref_tri, int* __restrict__ ref_node,
                                         float* __restrict__ node_lo,
                                         float* __restrict__ node_hi,
                                         long long* __restrict__ node_ref_offset,
                                         long long* __restrict__ seg_event_offset)
{
    long long t = kd_tid();
    if (t < num_triangles) {
        long long r = valid_scan[t];
        if (r != (t > 0 ? valid_scan[t - 1] : 0)) {
            ref_tri[r - 1] = (int)t;
            ref_node[r - 1] = 0;
        }
    }
    if (t == 0) {
        long long num_valid = (long long)summary[KD_SUMMARY_VALID];
        node_ref_offset[0] = 0;
        node_ref_offset[1] = num_valid;
        seg_event_offset[0] = 0;
        for (int k = 0; k < 3; ++k) {
            node_lo[k] = kd_float_from_ordered_bits32((unsigned int)summary[KD_SUMMARY_LO + k]);
            node_hi[k] = kd_float_from_ordered_bits32((unsigned int)summary[KD_SUMMARY_HI + k]);
            seg_event_offset[k + 1] = seg_event_offset[k] + 2 * num_valid
                                      - (long long)summary[KD_SUMMARY_PLANAR + k];
        }
    }
}

// --- the build's own triangle order (kdtree_gpu/builder/gpu/order.py) -----------------
// A large build numbers its triangles by the Morton code of their boxes'
// centres, so that the passes that gather triangle boxes by reference
// (classification, the subtree stage) read neighbouring rows for the
// references of a node: in the given order a node's triangles may lie
// anywhere in a box array far larger than L2.

// The low KD_MORTON_BITS bits of x, each moved to bit 3 i.
__device__ __forceinline__ unsigned int kd_morton_spread(unsigned int x)
{
    static_assert(KD_MORTON_BITS == 10, "the masks spread ten bits");
    x &= 0x3ffu;
    x = (x | (x << 16)) & 0x030000ffu;
    x = (x | (x << 8)) & 0x0300f00fu;
    x = (x | (x << 4)) & 0x030c30c3u;
    x = (x | (x << 2)) & 0x09249249u;
    return x;
}

// Triangle t's sort key: (invalid << 63) | (code << 32) | t, with code the
// Morton code of its box's centre quantized over the root box (the summary's;
// centres outside it, of triangles that enter no node, are clamped). Valid
// triangles sort first, ties by index: one radix sort gives the order.
extern "C" __global__ void kd_morton_keys(const float* __restrict__ tri_lo,
                                          const float* __restrict__ tri_hi,
                                          const long long* __restrict__ valid,
                                          long long num_triangles,
                                          const unsigned long long* __restrict__ summary,
                                          unsigned long long* __restrict__ keys)
{
    const long long t = kd_tid();
    if (t >= num_triangles) return;
    const float cells = (float)((1 << KD_MORTON_BITS) - 1);
    unsigned int code = 0;
    for (int k = 0; k < 3; ++k) {
        const float lo = kd_float_from_ordered_bits32((unsigned int)summary[KD_SUMMARY_LO + k]);
        const float hi = kd_float_from_ordered_bits32((unsigned int)summary[KD_SUMMARY_HI + k]);
        // (halves first: a sum of two large coordinates may overflow)
        const float centre = 0.5f * tri_lo[3 * t + k] + 0.5f * tri_hi[3 * t + k];
        const float extent = 0.5f * hi - 0.5f * lo;
        const float x = extent > 0.0f ? (0.5f * centre - 0.5f * lo) / extent * cells : 0.0f;
        // (fmaxf first: a NaN becomes 0)
        code |= kd_morton_spread((unsigned int)fminf(fmaxf(x, 0.0f), cells)) << k;
    }
    keys[t] = ((unsigned long long)(valid[t] == 0) << 63) | ((unsigned long long)code << 32)
              | (unsigned long long)t;
}

// From the sorted keys: triangle i of the build's order is the given order's
// order[i]; its box and valid flag move with it.
extern "C" __global__ void kd_morton_permute(const unsigned long long* __restrict__ keys,
                                             long long num_triangles,
                                             const float* __restrict__ given_lo,
                                             const float* __restrict__ given_hi,
                                             float* __restrict__ tri_lo,
                                             float* __restrict__ tri_hi,
                                             long long* __restrict__ valid,
                                             int* __restrict__ order)
{
    const long long i = kd_tid();
    if (i >= num_triangles) return;
    const unsigned long long key = keys[i];
    const long long t = (long long)(key & 0xffffffffull);
    order[i] = (int)t;
    for (int k = 0; k < 3; ++k) {
        tri_lo[3 * i + k] = given_lo[3 * t + k];
        tri_hi[3 * i + k] = given_hi[3 * t + k];
    }
    valid[i] = (long long)(key >> 63 == 0);
}

// The finished tree's node records, at their exact size, out of the output's
// one or two pages (KdSmallTree): one launch and one block for the four arrays
// instead of a copy (or a join of the two pages) each
// (kdtree_gpu/builder/gpu/output.py, TreeOutput.finish).
extern "C" __global__ void kd_finish_nodes(KdTreeNodes lo, KdTreeNodes hi, long long node_split,
                                           long long num_nodes, KdTreeNodes out)
{
    const KdSmallTree tree = {lo, hi, nullptr, nullptr, node_split, 0};
    const long long i = kd_tid();
    if (i >= num_nodes) return;
    const KdTreeNodes& t = tree.page(i);
    const long long k = tree.page_index(i);
    out.node_axis[i] = t.node_axis[k];
    out.node_split[i] = t.node_split[k];
    out.node_child[i] = t.node_child[k];
    out.node_count[i] = t.node_count[k];
}

// The finished tree's leaves named by the given triangle indices again
// (order[build index]), each leaf ascending: a leaf of at most
// KD_LEAF_SORT_MAX entries is sorted by its thread as its entries are renamed
// (insertion: most leaves hold a few); a larger one is renamed only and its
// node listed in big[1 ..] (big[0] counts them) for a radix sort.
extern "C" __global__ void kd_rename_leaves(KdTreeNodes nodes, long long num_nodes,
                                            const int* __restrict__ order,
                                            int* __restrict__ leaf_tris,
                                            unsigned long long* __restrict__ big)
{
    const long long i = kd_tid();
    if (i >= num_nodes || nodes.node_axis[i] != KD_AXIS_LEAF) return;
    const int n = nodes.node_count[i];
    int* leaf = leaf_tris + nodes.node_child[i];
    if (n > KD_LEAF_SORT_MAX) {
        for (int j = 0; j < n; ++j) leaf[j] = order[leaf[j]];
        big[1 + atomicAdd(big, 1ull)] = (unsigned long long)i;
        return;
    }
    for (int j = 0; j < n; ++j) {
        const int t = order[leaf[j]];
        int k = j;
        for (; k > 0 && leaf[k - 1] > t; --k) leaf[k] = leaf[k - 1];
        leaf[k] = t;
    }
}

// --- root events (rule R3) -----------------------------------------------------------

// Per valid triangle reference r and axis k, two sort keys in slots 2r, 2r + 1
// of axis k's key array: (ordered position bits << 32) | (kind << 30) | r.
// A planar triangle has one event; its second slot gets the largest key,
// which sorts after every real event and is cut off.
// Key layout (encoding.KEY_REF_BITS): axis (2 bits) | ordered position (32) |
// kind (2) | reference, so one sort orders the three axes' events at once
// (rule R3 within each axis).
__device__ __forceinline__ unsigned long long kd_event_key(int axis, float pos, int kind,
                                                           long long ref)
{
    return ((unsigned long long)axis << 62) | ((unsigned long long)kd_ordered_bits32(pos) << (KD_KEY_REF_BITS + 2))
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

// Decode the sorted keys into the root's event arrays (segment = axis; not
// stored where ev.event_seg is null: the level loop's buffers keep none).
extern "C" __global__ void kd_root_events_decode(const unsigned long long* __restrict__ keys,
                                                 long long count, KdEvents ev)
{
    long long e = kd_tid();
    if (e >= count) return;
    unsigned long long key = keys[e];
    ev.event_pos[e] = kd_float_from_ordered_bits32((unsigned int)(key >> (KD_KEY_REF_BITS + 2)));
    ev.event_kind[e] = (signed char)((key >> KD_KEY_REF_BITS) & 3u);
    ev.event_ref[e] = (int)(key & ((1ull << KD_KEY_REF_BITS) - 1));
    if (ev.event_seg) ev.event_seg[e] = (int)(key >> 62);
}
