// The level loop of the SAH kd-tree builder in one cooperative launch
// (kdtree_gpu/builder/gpu/level_loop.py, build_levels_grid).
//
// One launch per stage costs the host a launch, allocations and, per level,
// a read of the next level's sizes: small and mid-size builds are bound by
// that host work, not by the GPU. This kernel runs the same stage functions
// (build_stages.cuh) level after level in one launch of as many blocks as fit
// on the device at once, with a grid barrier where a launch would end (about
// 1 us on an H200, against 4.5 us of host time per launch), and it sizes each
// level on the device.
//
// Levels live in two buffers of fixed capacity (ping-pong: slot s of an array
// starts at s * its capacity). A level whose children, or whose part of the
// tree, would not fit stops the loop before the level writes anything; the
// status record says where it stopped and what it needs, and the host
// launches again from that level with larger buffers (or, for children of
// more than max_level_events events, runs that level one stage per launch).
//
// The loop's body; build_loop.cu and build_loop_one_block.cu hold its
// entry points, compiled with different register budgets.
#pragma once
#include <cooperative_groups.h>

#include "clip.cuh"

namespace cg = cooperative_groups;

// body(i) for i in [0, n), grid-strided, with the same trip count in every
// lane of a warp so that every lane reaches the warp collectives of a body
// (a warp takes 32 consecutive items: the stride is a multiple of 32).
template <typename Body>
__device__ __forceinline__ void kd_grid_for(long long n, Body body)
{
    const long long stride = (long long)gridDim.x * KD_LOOP_BLOCK;
    for (long long base = (long long)blockIdx.x * KD_LOOP_BLOCK; base < n; base += stride)
        body(base + threadIdx.x);
}

// kd_grid_for over a level's n items, of which those below num_events are its
// events: body(e, ref, node) with event e's reference (event_ref[e]) and that
// reference's node (ref_node[ref]), 0 past num_events. Both are loaded ahead,
// the reference two iterations before its event's and the node one: the
// scatter waits mostly on chains of dependent loads (event -> reference ->
// node -> the node's offsets -> the scans at its segment), and this takes the
// chain's first two links out of each iteration. (The cost pass walks ranges
// of chunks instead, kd_split_cost_warp_range, where loading ahead measured
// slower.)
template <typename Body>
__device__ __forceinline__ void kd_grid_for_events(long long n, long long num_events,
                                                   const int* event_ref, const int* ref_node,
                                                   Body body)
{
    const long long stride = (long long)gridDim.x * KD_LOOP_BLOCK;
    long long e = (long long)blockIdx.x * KD_LOOP_BLOCK + threadIdx.x;
    const auto ref_at = [&](long long i) { return i < num_events ? event_ref[i] : 0; };
    int ref = ref_at(e), ref_next = ref_at(e + stride);
    int node = e < num_events ? ref_node[ref] : 0;
    for (long long base = e - threadIdx.x; base < n; base += stride, e += stride) {
        const int node_next = e + stride < num_events ? ref_node[ref_next] : 0;
        const int ref_after = ref_at(e + 2 * stride);
        body(e, ref, node);
        ref = ref_next;
        ref_next = ref_after;
        node = node_next;
    }
}

// Grid-wide inclusive scan of n values load(i) into out, in two halves with a
// grid barrier between them, so that several scans (and other work) share
// their barriers. Block b owns the contiguous chunk [begin, end) of the input.
// Returns the chunk size (every block's but the last ones').
__device__ __forceinline__ long long kd_grid_chunk(long long n, long long* begin, long long* end)
{
    long long chunk = (n + gridDim.x - 1) / gridDim.x;
    long long b = (long long)blockIdx.x * chunk;
    *begin = b < n ? b : n;
    *end = b + chunk < n ? b + chunk : n;
    return chunk;
}

// First half: block_sum[block] = the sum of the block's chunk.
template <typename Load>
__device__ __forceinline__ void kd_grid_scan_sums(Load load, long long n, long long* block_sum)
{
    long long begin, end;
    kd_grid_chunk(n, &begin, &end);
    long long sum = 0;
    for (long long i = begin + threadIdx.x; i < end; i += KD_LOOP_BLOCK) sum += load(i);
    long long total;
    kd_block_exclusive_scan<KD_LOOP_BLOCK>(sum, &total);
    if (threadIdx.x == 0) block_sum[blockIdx.x] = total;
}

// The block's chunk (its size returned) and the sum of the chunks before it.
__device__ __forceinline__ long long kd_grid_scan_carry(long long n, const long long* block_sum,
                                                        long long* begin, long long* end,
                                                        long long* carry)
{
    const long long chunk = kd_grid_chunk(n, begin, end);
    long long before = 0;
    for (long long b = threadIdx.x; b < blockIdx.x; b += KD_LOOP_BLOCK) before += block_sum[b];
    kd_block_exclusive_scan<KD_LOOP_BLOCK>(before, carry);
    return chunk;
}

// Second half (after a grid barrier): each block scans its chunk, starting
// from the sum of the chunks before it.
template <typename Load>
__device__ __forceinline__ void kd_grid_scan_finish(Load load, long long n,
                                                    const long long* block_sum, long long* out)
{
    long long begin, end, carry;
    kd_grid_scan_carry(n, block_sum, &begin, &end, &carry);
    kd_block_scan_range<Load, KD_LOOP_BLOCK>(load, begin, end, carry, out);
}

// The chunked form (KdPackedScan: a level's flag scans take 4 bytes an item,
// not 8) in one pass, without a grid barrier of its own: each block scans its
// chunk into local (its counts since the chunk began, kd_block_scan_flags_local),
// which needs nothing from the other blocks, and publishes the chunk's sum;
// the last block to publish writes every chunk's base, the scan's value before
// it, into chunk_base (kd_grid_chunk_bases). Readable after the next grid
// barrier. Each block reads its chunk once: the two-pass form (the sums, a
// barrier, then each block's carry and its chunk scanned again) read it twice.
// The host sizes the grid so that a chunk holds at most KD_SCAN_CHUNK_MAX
// items (level_loop.loop_grid).
__device__ __forceinline__ void kd_grid_chunk_bases(long long sum, long long* block_sum,
                                                    long long* chunk_base,
                                                    long long* arrivals)
{
    // (the classic last-block pattern: the sum stored and fenced before the
    // block counts itself; the last to count sees every sum)
    bool arrived_last = false;
    if (threadIdx.x == 0) {
        block_sum[blockIdx.x] = sum;
        __threadfence();
        arrived_last = atomicAdd((unsigned long long*)arrivals, 1ull) == gridDim.x - 1ull;
    }
    if (__syncthreads_or(arrived_last)) {
        __threadfence();
        long long carry = 0;
        for (unsigned int b0 = 0; b0 < gridDim.x; b0 += KD_LOOP_BLOCK) {
            const unsigned int b = b0 + threadIdx.x;
            // (from L2: other blocks wrote them in this phase)
            const long long v = b < gridDim.x ? __ldcg(block_sum + b) : 0;
            long long total;
            const long long before = kd_block_exclusive_scan<KD_LOOP_BLOCK>(v, &total);
            if (b < gridDim.x) chunk_base[b] = carry + before;
            carry += total;
        }
        // (ready for the next scan: that comes after a grid barrier)
        if (threadIdx.x == 0) *arrivals = 0;
    }
}

template <typename Load>
__device__ __forceinline__ KdPackedScan kd_grid_scan_chunked(Load load, long long n,
                                                             long long* block_sum,
                                                             unsigned int* local,
                                                             long long* chunk_base,
                                                             long long* arrivals)
{
    long long begin, end;
    const long long chunk = kd_grid_chunk(n, &begin, &end);
    const unsigned int sum = kd_block_scan_flags_local<Load, KD_LOOP_BLOCK>(load, begin, end,
                                                                             local);
    kd_grid_chunk_bases(kd_lr64(sum), block_sum, chunk_base, arrivals);
    return KdPackedScan(local, chunk_base, chunk);
}

// --- perfect splits (cfg.clip) in the loop -------------------------------------
// The per-stage path (clip.cu) orders a level's new events with one radix sort
// and merges them into the kept ones by binary search. The loop has no sort:
// each child segment's new events are listed in any order, and each new event
// counts the new events of its segment with a smaller key (quadratic in the
// segment's count, which LoopSettings.clip_segment bounds: a level with a
// larger segment goes back to the per-stage path) and finds the kept events
// before it by a binary search in its parent segment, whose events are in the
// same order as the child's (a child keeps its references' order). Keys are
// unique in a segment: kd_clip_key with the reference's index in the parent level.

// Where the loop ended (encoding.LOOP_*): done, or stopped before `level`,
// whose sizes are given and which lives in level buffer `buffer`.
__device__ __forceinline__ void kd_write_loop_status(long long* status, long long state,
                                                     long long level, long long n,
                                                     long long num_refs, long long num_events,
                                                     long long level_base,
                                                     long long leaf_ref_base, int buffer)
{
    status[KD_LOOP_STATE] = state;
    status[KD_LOOP_LEVEL] = level;
    status[KD_LOOP_NODES] = n;
    status[KD_LOOP_REFS] = num_refs;
    status[KD_LOOP_EVENTS] = num_events;
    status[KD_LOOP_LEVEL_BASE] = level_base;
    status[KD_LOOP_LEAF_BASE] = leaf_ref_base;
    status[KD_LOOP_BUFFER] = buffer;
}

// Pointers are neither const nor __restrict__ where an array is written by
// one pass and read by a later pass of the same launch: such loads must not
// go through the read-only cache. The structs are generated from the
// declarations in kdtree_gpu/builder/soa.py (the level buffers hold two
// levels: slot s of an array starts at s times its capacity).
#define KD_LOOP_PARAMS                                                                        \
    const float *__restrict__ tri_lo, const float *__restrict__ tri_hi,                       \
        const float *__restrict__ vertices, /* the mesh: read when clipping */                \
        const int *__restrict__ faces, KdEvents start_events, KdRefs start_refs,              \
        KdNodes start_nodes, KdLevelSizes start, /* the level to start from (read only) */    \
        KdEvents lvl_events, KdRefs lvl_refs, KdNodes lvl_nodes, /* two levels */             \
        KdLevelScratch s, /* the level's scratch arrays, sized by the capacities */           \
        long long *block_sum, /* (5, gridDim.x) */                                            \
        KdTreeNodes out, int *leaf_tris, /* the tree */                                       \
        int *deferred, /* (cap.deferred, KD_SMALL_RECORD) small nodes left for later */       \
        KdLoopCapacity cap, KdLoopSettings cfg,                                               \
        long long *status /* KD_LOOP_SLOTS + 3 * (max_depth + 1) */
#define KD_LOOP_ARGS                                                                           \
    tri_lo, tri_hi, vertices, faces, start_events, start_refs, start_nodes, start, lvl_events, \
        lvl_refs, lvl_nodes, s, block_sum, out, leaf_tris, deferred, cap, cfg, status

// The loop's body, once without and once with perfect splits (CLIP): the
// plain build's kernel is compiled without the clipping code (its stack
// arrays and registers).
template <bool CLIP>
__device__ __forceinline__ void kd_build_levels(KD_LOOP_PARAMS)
{
    cg::grid_group grid = cg::this_grid();
    const long long cap_events = cap.events, cap_refs = cap.refs, cap_nodes = cap.nodes;
    const long long max_depth = cfg.max_depth, leaf_size = cfg.leaf_size;
    const int longest_only = cfg.longest_only;
    const double k_traversal = cfg.k_traversal, k_intersect = cfg.k_intersect;
    const double empty_bonus = cfg.empty_bonus;
    constexpr int clip = CLIP;
    // The level's sizes and bases, in shared memory rather than in registers
    // held through every phase (the kernel is at its 64 registers and
    // spills): every thread reads them, and writes the same values, only
    // where the grid is between two levels.
    __shared__ long long level_state[6];
    long long& n = level_state[0];
    long long& num_refs = level_state[1];
    long long& num_events = level_state[2];
    long long& level = level_state[3];
    long long& level_base = level_state[4];
    long long& leaf_ref_base = level_state[5];
    n = start.num_nodes, num_refs = start.num_refs, num_events = start.num_events;
    level = start.level, level_base = start.level_base;
    leaf_ref_base = start.leaf_ref_base;
    int cur = -1;  // the slot of the current level; the start level's arrays are apart
    // the slot the start level's events lie in (the root's are decoded into
    // the buffers), which its children must not overwrite; -1: none
    const int start_slot = (int)start.slot;
    const long long ref_offset_cap = 2 * cap_nodes + 1, seg_offset_cap = 6 * cap_nodes + 1;
    long long* sums0 = block_sum;
    long long* sums1 = block_sum + gridDim.x;
    long long* sums2 = block_sum + 2 * gridDim.x;
    long long* event_base = block_sum + 3 * gridDim.x;  // chunk bases of the chunked scans
    long long* ref_base = block_sum + 4 * gridDim.x;
    const bool leader = blockIdx.x == 0 && threadIdx.x == 0;
    // each warp's queue of candidates in the cost pass (kd_split_cost_warp_range)
    __shared__ unsigned short cost_queue[KD_LOOP_BLOCK / 32][64];
    for (;;) {
        // The level's arrays: the start level's, then slot cur of the
        // buffers. Derived from cur at each level rather than carried from
        // the last one, so that the compiler may compute them again where
        // they are used instead of holding nine pointers through every phase
        // (the kernel is at its 64 registers and spills).
        const bool at_start = cur < 0;
        const float* pos = at_start ? start_events.event_pos
                                    : lvl_events.event_pos + cur * cap_events;
        const signed char* kind = at_start ? start_events.event_kind
                                           : lvl_events.event_kind + cur * cap_events;
        const int* ref = at_start ? start_events.event_ref
                                  : lvl_events.event_ref + cur * cap_events;
        // (start_events.event_seg is not read: the loop derives segments, KdEventSegment)
        const int* tri = at_start ? start_refs.ref_tri : lvl_refs.ref_tri + cur * cap_refs;
        const int* node = at_start ? start_refs.ref_node : lvl_refs.ref_node + cur * cap_refs;
        const float* lo = at_start ? start_nodes.node_lo
                                   : lvl_nodes.node_lo + cur * 3 * cap_nodes;
        const float* hi = at_start ? start_nodes.node_hi
                                   : lvl_nodes.node_hi + cur * 3 * cap_nodes;
        const long long* node_ref_offset =
            at_start ? start_nodes.node_ref_offset
                     : lvl_nodes.node_ref_offset + cur * ref_offset_cap;
        const long long* seg_event_offset =
            at_start ? start_nodes.seg_event_offset
                     : lvl_nodes.seg_event_offset + cur * seg_offset_cap;
        const int nxt = (cur < 0 ? start_slot : cur) == 0 ? 1 : 0;
        long long* child_ref_offset = lvl_nodes.node_ref_offset + nxt * ref_offset_cap;
        long long* child_event_offset = lvl_nodes.seg_event_offset + nxt * seg_offset_cap;
        // (never null: where these are passed, the code for absent offsets,
        // kd_ref_destinations', is left out)
        __builtin_assume(child_ref_offset != nullptr && child_event_offset != nullptr);
        long long* child_ref_count = s.child_count;
        long long* child_event_count = s.child_count + 2 * n + 1;
        const int level_active = level < max_depth;
        const long long num_items = num_refs > num_events ? num_refs : num_events;

        // compute_split_costs (R5-R7)
        if (leader) {
            status[KD_LOOP_DEFER_LEVEL] = 0;
            status[KD_LOOP_CLIP_SEGMENT] = 0;
        }
        kd_grid_for(3 * n, [&](long long i) {
            if (i < 3 * n) kd_seg_argmin_reset(s.seg_argmin, i);
        });
        // s.event_scan holds this scan until the cost pass, then the routing's
        KdPackedScan event_scan =
            kd_grid_scan_chunked(KdLoadOpenClose{kind}, num_events + 1, sums0, s.event_scan,
                                 event_base, &status[KD_LOOP_SCAN_ARRIVALS]);
        grid.sync();
        // The sides live in the next level's slot of event_kind until its
        // scatter; no cost is stored.
        signed char* event_side = lvl_events.event_kind + nxt * cap_events;
        // segments derived, not stored (the buffers hold no event_seg rows)
        const KdEventSegment seg = {nullptr, ref, node, seg_event_offset, n};
        KdCostArgs cost = {pos, seg, event_scan, seg_event_offset, node_ref_offset, lo, hi,
                           n, num_events, leaf_size, level_active, longest_only, k_traversal,
                           k_intersect, empty_bonus, {nullptr, nullptr}, event_side,
                           s.seg_argmin};
        // Each warp a range of consecutive chunks of 32 events, its candidates
        // costed 32 at a time (kd_split_cost_warp_range); with perfect splits
        // also each reference's box in its node (R2)
        {
            const long long num_chunks = (num_events + 31) >> 5;
            const long long warps = (long long)gridDim.x * (KD_LOOP_BLOCK / 32);
            long long per = (num_chunks + warps - 1) / warps;
            per = per < KD_COST_RANGE_CHUNKS ? per : KD_COST_RANGE_CHUNKS;
            const long long warp =
                (long long)blockIdx.x * (KD_LOOP_BLOCK / 32) + (threadIdx.x >> 5);
            for (long long c0 = warp * per; c0 < num_chunks; c0 += warps * per) {
                const long long c1 = c0 + per < num_chunks ? c0 + per : num_chunks;
                kd_split_cost_warp_range(
                    cost, c0, c1, cost_queue[threadIdx.x >> 5], [&](long long e) {
                        if (clip)
                            kd_reference_box_event(pos, kind, ref, seg, e, s.ref_lo, s.ref_hi);
                    });
            }
        }
        grid.sync();
        // select_best_splits and decide_leaves (R4, R8): the segments' arg-mins
        // are final with the cost pass (kd_seg_argmin_lower)
        KdSelectArgs select = {s.seg_argmin, pos, event_side, node_ref_offset, n, leaf_size,
                               level_active, k_intersect, s.best_cost, s.best_axis, s.best_pos,
                               s.best_side, s.node_split, s.split_leaf};
        kd_grid_for(n, [&](long long i) {
            if (i >= n) return;
            kd_select_node(select, i);
            if (kd_defer_small(select, i, cfg.small_refs))
                atomicAdd((unsigned long long*)&status[KD_LOOP_DEFER_LEVEL], 1ull);
        });
        if (clip) {  // (the child sizes: perfect splits only, kd_child_offsets)
            kd_grid_for(8 * n + 2, [&](long long i) {
                if (i < 8 * n + 2) s.child_count[i] = 0;
                if (i < 6 * n + 1) s.new_count[i] = 0;
                if (i < 6 * n) s.new_cursor[i] = 0;
            });
        }
        grid.sync();
        // classify_triangles (R9), beside the first half of the scan of the
        // (split, leaf count) values
        // (with perfect splits the references' own boxes, one row per reference)
        KdClassifyArgs classify = {tri, node, s.best_axis, s.best_pos, s.best_side,
                                   s.node_split, clip ? s.ref_lo : tri_lo,
                                   clip ? s.ref_hi : tri_hi, num_refs, s.ref_class, clip};
        kd_grid_for(num_refs, [&](long long i) { kd_classify_ref(classify, i); });
        kd_grid_scan_sums(KdLoadArray{s.split_leaf}, n + 1, sums0);
        grid.sync();
        // route_refs and route_events: the flag scans, then the children's
        // offsets (read off them; with perfect splits, the child sizes and
        // their scans)
        kd_grid_scan_finish(KdLoadArray{s.split_leaf}, n + 1, sums0, s.split_leaf_ex);
        const KdPackedScan ref_lr_ex =
            kd_grid_scan_chunked(KdLoadRefLR{s.ref_class}, num_refs + 1, sums1, s.ref_lr_ex,
                                 ref_base, &status[KD_LOOP_SCAN_ARRIVALS]);
        event_scan = kd_grid_scan_chunked(KdLoadEventLR{ref, s.ref_class, clip}, num_events + 1,
                                          sums2, s.event_scan, event_base,
                                          &status[KD_LOOP_SCAN_ARRIVALS + 1]);
        if (clip) {
            grid.sync();  // (the split/leaf scan, read below, is written above)
            const long long split_count = KD_LOW(s.split_leaf_ex[n]);
            // Perfect splits: each straddling reference clipped to both
            // children (copy rows 2r, 2r + 1), and its new events counted per
            // child segment (after a leading 0, as the child counts).
            kd_grid_for(num_refs, [&](long long r) {
                if (r >= num_refs || s.ref_class[r] != KD_CLASS_BOTH) return;
                const int nd = node[r];
                const int* f = faces + 3 * (long long)tri[r];
                for (int side = 0; side < 2; ++side) {
                    float child_lo[3], child_hi[3];
                    kd_child_box(lo, hi, nd, s.best_axis[nd], s.best_pos[nd], side, child_lo,
                                 child_hi);
                    float* copy_lo = s.copy_lo + 3 * (2 * r + side);
                    float* copy_hi = s.copy_hi + 3 * (2 * r + side);
                    kd_clip_child_box(vertices + 3 * (long long)f[0],
                                      vertices + 3 * (long long)f[1],
                                      vertices + 3 * (long long)f[2], s.ref_lo + 3 * r,
                                      s.ref_hi + 3 * r, child_lo, child_hi, copy_lo, copy_hi);
                    for (int k = 0; k < 3; ++k) {
                        long long c = kd_child_group(k * n + nd, n, s.split_leaf_ex,
                                                     split_count) + side;
                        atomicAdd((unsigned long long*)&s.new_count[c + 1],
                                  copy_lo[k] == copy_hi[k] ? 1ull : 2ull);
                    }
                }
            });
        }
        grid.sync();
        const long long split_count = KD_LOW(s.split_leaf_ex[n]);
        KdRouteArgs route = {node_ref_offset, ref_lr_ex, seg_event_offset, event_scan,
                             s.node_split, s.split_leaf_ex, n, child_ref_count, child_event_count};
        // Without perfect splits the children's offsets are read off the flag
        // scans (kd_child_offsets) beside the scatter, which finds its
        // destinations in the same scans: no phase and no grid barrier of
        // their own. With them, the child sizes and their scans, then a barrier.
        if (clip) {
            kd_grid_for(4 * n, [&](long long t) {
                if (t >= 4 * n) return;
                kd_child_count(route, t);
                if (t >= n && s.node_split[(t - n) % n]) {
                    // a child segment holds its kept and its new events
                    long long c = kd_child_group(t - n, n, s.split_leaf_ex, split_count);
                    for (int side = 1; side <= 2; ++side) {
                        long long add = s.new_count[c + side];
                        child_event_count[c + side] += add;
                        if (add > cfg.clip_segment)
                            atomicMax((unsigned long long*)&status[KD_LOOP_CLIP_SEGMENT],
                                      (unsigned long long)add);
                    }
                }
            });
            kd_grid_scan_sums(KdLoadArray{s.new_count}, 6 * n + 1, sums2);
            grid.sync();
            kd_grid_scan_sums(KdLoadArray{child_ref_count}, 2 * n + 1, sums0);
            kd_grid_scan_sums(KdLoadArray{child_event_count}, 6 * n + 1, sums1);
            kd_grid_scan_finish(KdLoadArray{s.new_count}, 6 * n + 1, sums2, s.new_offset);
            grid.sync();
            kd_grid_scan_finish(KdLoadArray{child_ref_count}, 2 * n + 1, sums0,
                                child_ref_offset);
            kd_grid_scan_finish(KdLoadArray{child_event_count}, 6 * n + 1, sums1,
                                child_event_offset);
            grid.sync();
        }
        // The next level's sizes: every thread reads the same values and
        // takes the same branch. (Without perfect splits, the flag scans'
        // totals: a node that does not split carries no flags.)
        const long long num_split = split_count;
        const long long num_leaf_refs = KD_HIGH(s.split_leaf_ex[n]);
        const long long ref_total = clip ? 0 : ref_lr_ex[node_ref_offset[n]];
        const long long event_total = clip ? 0 : event_scan[seg_event_offset[3 * n]];
        const long long num_child_refs =
            clip ? child_ref_offset[2 * num_split] : kd_left_child_start(ref_total);
        const long long num_child_events = clip ? child_event_offset[6 * num_split]
                                                : kd_left_child_start(event_total);
        const long long need_deferred = *(volatile long long*)&status[KD_LOOP_DEFER_NEXT]
                                        + *(volatile long long*)&status[KD_LOOP_DEFER_LEVEL];
        const long long num_new = clip ? s.new_offset[6 * num_split] : 0;
        const bool need_stages = *(volatile long long*)&status[KD_LOOP_CLIP_SEGMENT] > 0;
        const bool fits = 2 * num_split <= cap_nodes && num_child_refs <= cap_refs
                          && need_deferred <= cap.deferred
                          && num_child_events <= cap_events
                          && num_child_events <= cfg.max_level_events
                          && num_new <= cap.new_events && !need_stages
                          && level_base + n <= cap.tree_nodes
                          && leaf_ref_base + num_leaf_refs <= cap.leaf_refs;
        if (!fits) {
            if (leader) {
                kd_write_loop_status(status, KD_LOOP_STOPPED, level, n, num_refs, num_events,
                                     level_base, leaf_ref_base, cur);
                status[KD_LOOP_NEED_NODES] = 2 * num_split;
                status[KD_LOOP_NEED_REFS] = num_child_refs;
                status[KD_LOOP_NEED_EVENTS] = num_child_events;
                status[KD_LOOP_NEED_TREE_NODES] = level_base + n;
                status[KD_LOOP_NEED_LEAF_REFS] = leaf_ref_base + num_leaf_refs;
                status[KD_LOOP_NEED_DEFERRED] = need_deferred;
                status[KD_LOOP_NEED_NEW_EVENTS] = num_new;
                status[KD_LOOP_NEED_STAGES] = need_stages;
            }
            return;
        }
        // emit_level (R10) and make_child_nodes; split_refs and split_events
        float* child_lo = lvl_nodes.node_lo + nxt * 3 * cap_nodes;
        float* child_hi = lvl_nodes.node_hi + nxt * 3 * cap_nodes;
        float* child_pos = lvl_events.event_pos + nxt * cap_events;
        signed char* child_kind = lvl_events.event_kind + nxt * cap_events;
        int* child_ref = lvl_events.event_ref + nxt * cap_events;
        KdEmitArgs emit = {s.node_split, s.best_axis, s.best_pos, s.split_leaf_ex, lo, hi, n,
                           level_base, leaf_ref_base, out.node_axis, out.node_split,
                           out.node_child, out.node_count, child_lo, child_hi};
        kd_grid_for(n, [&](long long i) {
            kd_emit_node(emit, i);
            if (i < n && s.best_axis[i] == KD_SMALL_DEFERRED_AXIS)
                kd_record_deferred(i, node_ref_offset, s.split_leaf_ex, lo, hi, level_base,
                                   (int)level, leaf_ref_base, deferred,
                                   &status[KD_LOOP_DEFER_NEXT], &status[KD_LOOP_DEFER_REFS]);
        });
        if (!clip) {  // the next level's offsets (its slot; this level reads none of them)
            kd_grid_for(6 * n + 1, [&](long long t) {
                if (t <= 6 * n)
                    kd_child_offsets(
                        route, t, [&](long long g) { return event_scan[seg_event_offset[g]]; },
                        child_ref_offset, child_event_offset);
            });
        }
        if (clip) {
            // Perfect splits: the new events listed by child segment (any
            // order within one), then each written at its place in the
            // merged list, with its rank among the kept ones for their scatter.
            kd_grid_for(num_refs, [&](long long r) {
                if (r >= num_refs || s.ref_class[r] != KD_CLASS_BOTH) return;
                const int nd = node[r];
                for (int side = 0; side < 2; ++side) {
                    for (int k = 0; k < 3; ++k) {
                        long long c = kd_child_group(k * n + nd, n, s.split_leaf_ex,
                                                     num_split) + side;
                        float b0 = s.copy_lo[3 * (2 * r + side) + k];
                        float b1 = s.copy_hi[3 * (2 * r + side) + k];
                        unsigned long long* list = s.new_key + s.new_offset[c];
                        if (b0 == b1) {
                            list[atomicAdd(&s.new_cursor[c], 1)] =
                                kd_clip_key(b0, KD_EVENT_PLANAR, r);
                        } else {
                            int at = atomicAdd(&s.new_cursor[c], 2);
                            list[at] = kd_clip_key(b1, KD_EVENT_END, r);
                            list[at + 1] = kd_clip_key(b0, KD_EVENT_START, r);
                        }
                    }
                }
            });
            grid.sync();
            kd_grid_for(num_new, [&](long long i) {
                if (i >= num_new) return;
                const long long c = kd_lower_bound(s.new_offset, 0ll, 6 * num_split + 1, i + 1) - 1;
                const unsigned long long key = s.new_key[i];
                const long long b = s.new_offset[c], e_end = s.new_offset[c + 1];
                long long rank = 0;
                for (long long j = b; j < e_end; ++j) rank += s.new_key[j] < key;
                const long long r = kd_clip_key_ref(key);
                const int new_kind = kd_clip_key_kind(key);
                const int nd = node[r];
                const int side = (int)(c & 1);
                const long long ps = (c / (2 * num_split)) * n + nd;
                const long long first = seg_event_offset[ps];
                const long long at = kd_lower_bound_if(first, seg_event_offset[ps + 1],
                    [&](long long e) { return kd_clip_key(pos[e], kind[e], ref[e]) < key; });
                const long long lr_p = event_scan[at], lr_s = event_scan[first];
                const long long kept = side ? KD_HIGH(lr_p) - KD_HIGH(lr_s)
                                            : KD_LOW(lr_p) - KD_LOW(lr_s);
                s.new_rank[b + rank] = (int)kept;
                long long dl, dr;
                kd_ref_destinations(r, nd, ref_lr_ex, node_ref_offset, s.split_leaf_ex,
                                    child_ref_offset, &dl, &dr);
                const long long dst = child_event_offset[c] + kept + rank;
                child_pos[dst] = kd_clip_key_pos(key);
                child_kind[dst] = (signed char)new_kind;
                child_ref[dst] = (int)(side ? dr : dl);
            });
            grid.sync();
        }
        int* child_tri = lvl_refs.ref_tri + nxt * cap_refs;
        int* child_node = lvl_refs.ref_node + nxt * cap_refs;
        // (without perfect splits the destinations come from the flag scans:
        // the children's offsets are being written beside it)
        KdScatterArgs scatter = {tri, node, s.ref_class, ref_lr_ex, node_ref_offset,
                                 s.split_leaf_ex, clip ? child_ref_offset : nullptr, pos, kind,
                                 ref, seg, event_scan, seg_event_offset,
                                 clip ? child_event_offset : nullptr, n, num_refs,
                                 num_events, leaf_ref_base, leaf_tris, child_tri, child_node,
                                 child_pos, child_kind, child_ref, nullptr, clip,
                                 clip ? s.new_offset : nullptr, clip ? s.new_rank : nullptr};
        kd_grid_for_events(num_items, num_events, ref, node,
                           [&](long long i, int r, int nd) { kd_scatter_item(scatter, i, r, nd); });
        if (leader) {
            status[KD_LOOP_SLOTS + 3 * level] = n;
            status[KD_LOOP_SLOTS + 3 * level + 1] = num_refs;
            status[KD_LOOP_SLOTS + 3 * level + 2] = num_events;
        }
        const long long next_level = level + 1, next_level_base = level_base + n;
        const long long next_leaf_ref_base = leaf_ref_base + num_leaf_refs;
        if (num_split == 0) {
            if (leader)
                kd_write_loop_status(status, KD_LOOP_DONE, next_level, 0, 0, 0,
                                     next_level_base, next_leaf_ref_base, nxt);
            return;
        }
        grid.sync();
        // (every thread writes the same values: none reads the state between
        // the barrier and its own writes)
        cur = nxt;  // (the children's arrays: slot nxt)
        n = 2 * num_split;
        num_refs = num_child_refs;
        num_events = num_child_events;
        level = next_level;
        level_base = next_level_base;
        leaf_ref_base = next_leaf_ref_base;
    }
}
