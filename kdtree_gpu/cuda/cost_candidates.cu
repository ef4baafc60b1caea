// The split-cost stage of the levels run one launch per stage, over the
// candidate planes only (kdtree_gpu/builder/gpu/level_stages.py's
// compute_split_costs_gpu; rules R4-R8, the NumPy twin compute_split_costs in
// kdtree_gpu/builder/stages.py).
//
// Why: one cost pass over every event (kd_split_costs) spent most of a warp's
// instructions on lanes that were no candidate. In the 9th staged level of a
// 5.5M-triangle build (H100, ncu), 46% of warps held no candidate, the others
// 5 of 32 on average, and the warp's arg-min took 190 of its 450 instructions.
// So: a pass over the tiles flags the candidates (a run head in a node that
// may split, strictly inside its box) as it scans the open/close counts, a
// mask per 32 events; the cost pass then runs a block a tile, lists the
// tile's candidates in shared memory from its masks, in event order, and runs
// a lane per candidate: its warps' arg-min (kd_warp_argmin) sees candidates
// only. (A list in device memory took 4 more bytes an event and two launches,
// 1.7 ms of a 5.5M-triangle build on an H100.)
#include "build_stages.cuh"

// Pass 0, a thread a segment: what of rules R4-R5 its node and axis decide,
// as the open interval its candidate planes lie in: its node's box on its
// axis, or (+inf, -inf) where the node may not split or, with axes="longest",
// the axis is not its longest. (Pass 1 then gathers 8 bytes a segment instead
// of the node's box, counts and axis an event.) Also resets each segment's
// minimum cost and arg-min.
extern "C" __global__ void kd_segment_ranges(const long long* __restrict__ node_ref_offset,
                                             const float* __restrict__ node_lo,
                                             const float* __restrict__ node_hi,
                                             long long num_nodes, long long leaf_size,
                                             int level_active, int longest_only,
                                             float2* __restrict__ seg_range,
                                             unsigned long long* __restrict__ seg_argmin)
{
    const long long s = kd_tid();
    if (s >= 3 * num_nodes) return;
    const int axis = (int)(s / num_nodes);
    const long long node = s - axis * num_nodes;
    const bool open = kd_node_active(node_ref_offset[node + 1] - node_ref_offset[node],
                                     leaf_size, level_active)
                      && (!longest_only || kd_longest_axis(node_lo, node_hi, node) == axis);
    const float inf = __int_as_float(0x7f800000);
    seg_range[s] = open ? make_float2(node_lo[3 * node + axis], node_hi[3 * node + axis])
                        : make_float2(inf, -inf);
    kd_seg_argmin_reset(seg_argmin, s);
}

// Pass 1, one block a tile of KD_SCAN_TILE items: with
// kd_block_scan_flags_local, the open/close scan of the tile's items (item i is
// event i - 1's flags: KdLoadOpenClose), 16-bit counts since the tile began,
// into oc_local, and the tile's sum into oc_tile; the candidate flags of the
// tile's events (a run head strictly inside its segment's seg_range: pass 0) as
// one mask per chunk of 32 events (cand_mask). For the tests (event_cost_hi not
// null), also stores +inf as the cost of every event that is no candidate.
// Eight blocks a multiprocessor (32 registers, a few bytes spilled): the pass
// waits on its dependent loads (event -> segment -> its range and first
// event), and more resident warps hide them. Measured on an H200 (staged
// levels, benchmarks/results/cost_prepass_occupancy_h200.md): 5.84-5.90 ms a
// build at five blocks (48 registers), 5.01-5.08 at six, 4.44-4.47 at eight
// (armadillo subdivided twice); subdivided three times 25.3, 21.6, 18.7 ms.
// Loading a thread's items before the scan (more registers) was slower.
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK, 8)
kd_cost_prepass(const signed char* __restrict__ event_kind, const float* __restrict__ event_pos,
                const int* __restrict__ event_seg, const int* __restrict__ event_ref,
                const int* __restrict__ ref_node, const long long* __restrict__ seg_event_offset,
                const float2* __restrict__ seg_range, long long num_nodes, long long num_events,
                unsigned int* __restrict__ oc_local, long long* __restrict__ oc_tile,
                unsigned int* __restrict__ cand_mask, unsigned int* __restrict__ event_cost_hi,
                unsigned int* __restrict__ event_cost_lo)
{
    const unsigned full = 0xffffffffu;
    const KdEventSegment segment = {event_seg, event_ref, ref_node, seg_event_offset, num_nodes};
    const KdEventCosts event_cost = {event_cost_hi, event_cost_lo};
    const int lane = threadIdx.x & 31;
    const long long tile = (long long)blockIdx.x * KD_SCAN_TILE;
    const long long items = num_events + 1;
    // lane l of warp w holds items base + 32 j: chunk (tile / 32) + KD_SCAN_ITEMS w + j
    const long long base = tile + (long long)(threadIdx.x >> 5) * 32 * KD_SCAN_ITEMS + lane;
    const long long chunk0 = (tile >> 5) + (long long)(threadIdx.x >> 5) * KD_SCAN_ITEMS;
    const long long end = tile + KD_SCAN_TILE < items ? tile + KD_SCAN_TILE : items;
    const unsigned int total = kd_block_scan_flags_local<KdLoadOpenClose, KD_SCAN_BLOCK>(
        KdLoadOpenClose{event_kind}, tile, end, oc_local);
    bool cand[KD_SCAN_ITEMS];
    for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
        const long long i = base + 32 * j;
        cand[j] = false;
        if (i < num_events) {
            const int s = segment.index(i);
            const float p = event_pos[i];
            const float2 r = seg_range[s];
            // a run head: it starts its segment's events or follows another position
            cand[j] = p > r.x && p < r.y
                      && (i == seg_event_offset[s] || event_pos[i - 1] != p);
        }
    }
    const long long num_chunks = (num_events + 31) >> 5;
    for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
        const unsigned int mask = __ballot_sync(full, cand[j]);
        if (lane == 0 && chunk0 + j < num_chunks) cand_mask[chunk0 + j] = mask;
        const long long i = base + 32 * j;
        if (event_cost_hi && i < num_events && !cand[j])
            event_cost.store(i, __longlong_as_double((long long)KD_INF_BITS));
    }
    if (threadIdx.x == 0) oc_tile[blockIdx.x] = kd_lr64(total);
}

// Pass 2, a block of KD_SCAN_BLOCK threads a tile of KD_SCAN_TILE events: the
// tile's candidates listed from pass 1's masks (their offsets in the tile, in
// shared memory), then a lane a candidate: each candidate's cost and side, and
// each segment's minimum and arg-min as kd_split_costs leaves them. The open/close
// scan is pass 1's, chunked by tiles.
// The parts of the tile's first and last segments (those that reach past the
// tile, from above a level's largest nodes down, every warp of every tile on
// the same pair) wait in shared memory, a slot a chunk of 32 candidates, and
// one lane lowers each pair once a tile. With every warp on the pair itself
// the pass took 6.6-6.8 ms of a 5.5M-triangle build and 39-41 at 22M, more
// than the pass and the partial rows' launch it replaced (5.46, 22.55);
// gathered, 5.30 and 22.28 (H200, benchmarks/results/argmin_pairs_h200.md).
// Other parts of larger segments (inside the tile) lower their pairs directly.
// Eight blocks a multiprocessor (32 registers, some spilled) rather than six
// (40): on an H200 this pass 5.27-5.29 -> 4.94-4.95 ms of the 5.5M-triangle
// build, 22.35-22.38 -> 20.95-20.96 at 22M (benchmarks/results/staged_cost_occupancy_h200.md).
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK, 8)
kd_split_costs_candidates(KD_COST_HEAD_PARAMS,
                          const unsigned int* __restrict__ open_close_local,
                          const long long* __restrict__ open_close_tile, KD_COST_TAIL_PARAMS,
                          const unsigned int* __restrict__ cand_mask)
{
    constexpr int CHUNKS = KD_SCAN_TILE / 32;
    static_assert(CHUNKS == 64 && KD_SCAN_BLOCK >= CHUNKS, "warp 0 scans two masks a lane");
    __shared__ unsigned int s_mask[CHUNKS];
    __shared__ int s_before[CHUNKS + 1];
    __shared__ unsigned short s_cand[KD_SCAN_TILE];
    __shared__ KdSegArgmin s_part[2][CHUNKS];  // the first and last segments' parts, a chunk each
    __shared__ int s_end_seg[2];               // those segments
    const KdCostArgs a =
        KD_COST_ARGS(KdPackedScan(open_close_local, open_close_tile, KD_SCAN_TILE));
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const long long e0 = (long long)blockIdx.x * KD_SCAN_TILE;
    const long long k0 = (long long)blockIdx.x * CHUNKS;
    const long long rest = ((num_events + 31) >> 5) - k0;
    const int tile_chunks = rest < CHUNKS ? (int)rest : CHUNKS;
    if (threadIdx.x < 32) {  // the candidates before each chunk: lane l's are 2l and 2l + 1
        const unsigned m0 = 2 * lane < tile_chunks ? cand_mask[k0 + 2 * lane] : 0u;
        const unsigned m1 = 2 * lane + 1 < tile_chunks ? cand_mask[k0 + 2 * lane + 1] : 0u;
        const int x = kd_warp_inclusive_scan(__popc(m0) + __popc(m1));
        const int before = x - __popc(m0) - __popc(m1);
        s_mask[2 * lane] = m0;
        s_mask[2 * lane + 1] = m1;
        s_before[2 * lane] = before;
        s_before[2 * lane + 1] = before + __popc(m0);
        if (lane == 31) s_before[CHUNKS] = x;
        for (int k = 0; k < 2; ++k)
            s_part[k][2 * lane] = s_part[k][2 * lane + 1] = KdSegArgmin{KD_NO_INDEX, KD_NO_INDEX};
        // the tile's first and last candidates' segments: the lowest and highest lanes with
        // candidates take their first and last
        const unsigned with = __ballot_sync(full, (m0 | m1) != 0u);
        const int first_lane = __ffs(with) - 1, last_lane = 31 - __clz(with);
        if (with && (lane == first_lane || lane == last_lane)) {
            int node, axis;
            if (lane == first_lane) {
                const int c = m0 ? 2 * lane : 2 * lane + 1;
                s_end_seg[0] = a.event_seg.of(e0 + 32 * c + __ffs(m0 ? m0 : m1) - 1, node, axis);
            }
            if (lane == last_lane) {
                const int c = m1 ? 2 * lane + 1 : 2 * lane;
                s_end_seg[1] = a.event_seg.of(e0 + 32 * c + 31 - __clz(m1 ? m1 : m0), node, axis);
            }
        }
    }
    __syncthreads();
    if (threadIdx.x < CHUNKS) {
        int out = s_before[threadIdx.x];
        for (unsigned m = s_mask[threadIdx.x]; m; m &= m - 1u)
            s_cand[out++] = (unsigned short)(threadIdx.x * 32 + __ffs(m) - 1);
    }
    __syncthreads();
    const int count = s_before[CHUNKS];
    for (int q = threadIdx.x >> 5; 32 * q < count; q += KD_SCAN_BLOCK / 32) {  // (warp-uniform)
        const int left = count - 32 * q;
        kd_candidate_lane(a, e0, s_cand + 32 * q, left < 32 ? left : 32,
                          [&](int seg, unsigned long long cost, unsigned long long index) {
                              // (a chunk has at most one part of each: its runs' segments differ)
                              if (seg == s_end_seg[0]) s_part[0][q] = KdSegArgmin{cost, index};
                              else if (seg == s_end_seg[1]) s_part[1][q] = KdSegArgmin{cost, index};
                              else kd_seg_argmin_lower(a.seg_argmin, seg, cost, index);
                          });
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // each end segment's parts: the least pair, lowered once
        for (int k = 0; k < 2; ++k) {
            KdSegArgmin p = s_part[k][2 * lane];
            const KdSegArgmin p1 = s_part[k][2 * lane + 1];
            if (kd_pair_less(p1.cost, p1.index, p)) p = p1;
            for (int o = 16; o; o >>= 1) {
                const unsigned long long c = __shfl_xor_sync(full, p.cost, o);
                const unsigned long long i = __shfl_xor_sync(full, p.index, o);
                if (kd_pair_less(c, i, p)) p = KdSegArgmin{c, i};
            }
            if (lane == 0 && p.index != KD_NO_INDEX)
                kd_seg_argmin_lower(a.seg_argmin, s_end_seg[k], p.cost, p.index);
        }
    }
}
