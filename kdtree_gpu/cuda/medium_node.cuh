// A medium node of the subtree stage (SMALL_MAX_REFS + 1 .. KD_MEDIUM_MAX_REFS
// references), one block per node (KD_MEDIUM_BLOCK threads): its best plane
// and its step, with the rules of the warp's nodes (kd_small_wide_node).
// Part of build_small.cu, which includes it.
//
// The counts are small_split.cuh's, for each candidate p of an axis:
//   N_L = #{t : lo_t < p},  N_P = #{t : lo_t == hi_t == p},  N_R = N - #{t : hi_t <= p}
// which a warp finds by comparing p with every reference (quadratic: 64
// references are 8k comparisons, 1024 are two million an axis). A medium
// node keeps its events instead, as the level loop does: per axis, a START
// at each reference's low and an END at its high (one PLANAR where they are
// equal), sorted by position. Over that list the counts are prefix counts:
// at the first event of a position p, N_L is the number of STARTs and
// PLANARs before it, and #{hi_t <= p} the number of ENDs and PLANARs up to
// the last event at p; N_P counts the PLANARs at p. The order of the events
// at one position changes none of them. The candidates are the positions of
// the events inside the node: the warp's candidates, each once. The choice
// is the lowest (cost, axis, position), as the warp's (small_split.cuh says
// why it is the level stages' plane).
//
// An event is 16 bits: its reference's index in the node << 2 | its kind
// (encoding.EVENT_*), its position read from the reference's box. A child
// keeps its parent's events in their order (the events of its references,
// renumbered), so only a subtree's first node sorts them: the deferred
// nodes' records carry no events, and their block makes and sorts them.
#pragma once
#include "small_level.cuh"

#define KD_MEDIUM_INF __int_as_float(0x7f800000)
#define KD_MEDIUM_EVENTS (2 * KD_MEDIUM_MAX_REFS)  // an axis' events at most
#define KD_MEDIUM_NONE 0xffffu  // no event; no index in a child
#define KD_MEDIUM_CHUNK (KD_MEDIUM_EVENTS / KD_MEDIUM_BLOCK)  // an axis' events a thread

// A medium node in shared memory: its references' boxes, its events and
// (once it is split) each reference's index in each child.
struct KdMediumShared {
    float lo[3][KD_MEDIUM_MAX_REFS];
    float hi[3][KD_MEDIUM_MAX_REFS];
    unsigned short events[3][KD_MEDIUM_EVENTS];
    unsigned short to_child[2][KD_MEDIUM_MAX_REFS];
    int num_events[3];
    KdSmallSplit warp_best[KD_MEDIUM_BLOCK / 32];
    int warp_count[2][KD_MEDIUM_BLOCK / 32];
    unsigned long long slots[5];  // what the node's five atomics gave, for every thread
};

// An event's opens (STARTs and PLANARs) | closes (ENDs and PLANARs) << 32.
__device__ __forceinline__ long long kd_medium_open_close(unsigned code)
{
    const int kind = code & 3;
    return (kind != KD_EVENT_END ? 1ll : 0ll) + (kind != KD_EVENT_START ? 1ll << 32 : 0ll);
}

__device__ __forceinline__ float kd_medium_event_pos(const KdMediumShared& sh, int axis,
                                                     unsigned code)
{
    return (code & 3) == KD_EVENT_END ? sh.hi[axis][code >> 2] : sh.lo[axis][code >> 2];
}

// The events of one axis made from the references' boxes (in reference
// order) and sorted by position (a bitonic network over the next power of
// two, KD_MEDIUM_NONE past the events sorting last; ties by code, so the
// order is the same on every run). Every thread of the block calls it.
__device__ __forceinline__ void kd_medium_make_events(KdMediumShared& sh, int axis, int r)
{
    unsigned short* ev = sh.events[axis];
    // each reference's first event after those of the references before it
    int count[KD_MEDIUM_MAX_REFS / KD_MEDIUM_BLOCK], sum = 0;
#pragma unroll
    for (int q = 0; q < KD_MEDIUM_MAX_REFS / KD_MEDIUM_BLOCK; ++q) {
        const int i = KD_MEDIUM_MAX_REFS / KD_MEDIUM_BLOCK * threadIdx.x + q;
        count[q] = i < r ? (sh.lo[axis][i] == sh.hi[axis][i] ? 1 : 2) : 0;
        sum += count[q];
    }
    long long total;
    int at = (int)kd_block_exclusive_scan<KD_MEDIUM_BLOCK>(sum, &total);
    const int n = (int)total;
    int n2 = 2;
    while (n2 < n) n2 <<= 1;
#pragma unroll
    for (int q = 0; q < KD_MEDIUM_MAX_REFS / KD_MEDIUM_BLOCK; ++q) {
        const int i = KD_MEDIUM_MAX_REFS / KD_MEDIUM_BLOCK * threadIdx.x + q;
        if (count[q] == 1) ev[at] = (unsigned short)(i << 2 | KD_EVENT_PLANAR);
        if (count[q] == 2) {
            ev[at] = (unsigned short)(i << 2 | KD_EVENT_START);
            ev[at + 1] = (unsigned short)(i << 2 | KD_EVENT_END);
        }
        at += count[q];
    }
    for (int j = n + threadIdx.x; j < n2; j += KD_MEDIUM_BLOCK) ev[j] = KD_MEDIUM_NONE;
    if (threadIdx.x == 0) sh.num_events[axis] = n;
    __syncthreads();
    for (int k = 2; k <= n2; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n2 / 2; i += KD_MEDIUM_BLOCK) {
                const int x = 2 * i - (i & (j - 1)), y = x + j;
                const unsigned a = ev[x], b = ev[y];
                const float pa = a == KD_MEDIUM_NONE ? KD_MEDIUM_INF
                                                     : kd_medium_event_pos(sh, axis, a);
                const float pb = b == KD_MEDIUM_NONE ? KD_MEDIUM_INF
                                                     : kd_medium_event_pos(sh, axis, b);
                const bool b_first = pb < pa || (pb == pa && b < a);
                if (b_first == ((x & k) == 0)) {  // out of order for this direction
                    ev[x] = (unsigned short)b;
                    ev[y] = (unsigned short)a;
                }
            }
            __syncthreads();
        }
    }
}

// The node's best plane (every thread gets it) from its events, r references,
// box nlo, nhi.
__device__ __forceinline__ KdSmallSplit kd_medium_best_split(KdMediumShared& sh, int r,
                                                              const float* nlo, const float* nhi,
                                                              const KdLoopSettings& cfg)
{
    KdSmallSplit best = kd_small_no_split();
    const KdSmallBox box = kd_small_box(nlo, nhi);
#pragma unroll 1
    for (int axis = 0; axis < 3; ++axis) {
        if (cfg.longest_only && axis != box.longest) continue;
        const float lo_k = kd_pick3(nlo, axis), hi_k = kd_pick3(nhi, axis);
        const unsigned short* ev = sh.events[axis];
        const int n = sh.num_events[axis];
        // this thread's events [j0, j1): their STARTs and PLANARs (opens),
        // ENDs and PLANARs (closes), and the counts before them
        const int j0 = min(n, KD_MEDIUM_CHUNK * (int)threadIdx.x);
        const int j1 = min(n, j0 + KD_MEDIUM_CHUNK);
        long long counts = 0;  // opens | closes << 32
        for (int j = j0; j < j1; ++j) counts += kd_medium_open_close(ev[j]);
        long long total;
        long long before = kd_block_exclusive_scan<KD_MEDIUM_BLOCK>(counts, &total);
        float prev = j0 > 0 ? kd_medium_event_pos(sh, axis, ev[j0 - 1]) : -KD_MEDIUM_INF;
        for (int j = j0; j < j1; ++j) {
            const unsigned code = ev[j];
            const float p = kd_medium_event_pos(sh, axis, code);
            if (p != prev && p > lo_k && p < hi_k) {
                // the first event at p: its run's closes and planars
                long long closed = before >> 32;
                int planar = 0;
                for (int k = j; k < n; ++k) {
                    const unsigned c = ev[k];
                    if (kd_medium_event_pos(sh, axis, c) != p) break;
                    closed += (c & 3) != KD_EVENT_START;
                    planar += (c & 3) == KD_EVENT_PLANAR;
                }
                kd_small_consider(best, box.ext, box.area, axis, lo_k, hi_k, p,
                                  before & 0xffffffffll, planar, (long long)r - closed, cfg);
            }
            prev = p;
            before += kd_medium_open_close(code);
        }
    }
    best = kd_small_warp_best(best);
    if ((threadIdx.x & 31) == 0) sh.warp_best[threadIdx.x >> 5] = best;
    __syncthreads();
    best = sh.warp_best[0];
    for (int w = 1; w < KD_MEDIUM_BLOCK / 32; ++w) {
        const KdSmallSplit other = sh.warp_best[w];
        if (kd_small_better(other.cost, other.axis, other.pos, best.cost, best.axis, best.pos))
            best = other;
    }
    return best;
}

// A medium child's events: those of the references it holds, in their order,
// renumbered (sh.to_child[side]), each axis' list after the previous one's
// (at most twice its references each: 6 * count from `out` on). Every thread
// of the block calls it.
__device__ __forceinline__ void kd_medium_child_events(KdMediumShared& sh, int side, int count,
                                                       unsigned short* out)
{
    const unsigned short* to = sh.to_child[side];
    for (int axis = 0; axis < 3; ++axis) {
        const unsigned short* ev = sh.events[axis];
        const int n = sh.num_events[axis];
        const int j0 = min(n, KD_MEDIUM_CHUNK * (int)threadIdx.x);
        const int j1 = min(n, j0 + KD_MEDIUM_CHUNK);
        long long kept = 0;
        for (int j = j0; j < j1; ++j) kept += to[ev[j] >> 2] != KD_MEDIUM_NONE;
        long long total;
        long long at = kd_block_exclusive_scan<KD_MEDIUM_BLOCK>(kept, &total);
        unsigned short* list = out + 2ll * count * axis;
        for (int j = j0; j < j1; ++j) {
            const unsigned code = ev[j];
            const unsigned idx = to[code >> 2];
            if (idx != KD_MEDIUM_NONE) list[at++] = (unsigned short)(idx << 2 | (code & 3));
        }
    }
}

// A node of KD_SMALL_MAX_REFS + 1 .. KD_MEDIUM_MAX_REFS references (or a
// deferred one), one block: kd_small_wide_node's steps, rule for rule, with
// the references' boxes and the events in shared memory. Every thread of the
// block calls it.
__device__ __forceinline__ void kd_medium_node(const KdSmallLevel& L, const int* rec_words,
                                               const KdLoopSettings& cfg, KdMediumShared& sh)
{
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned lanes_below = (1u << lane) - 1u;
    const KdSmallRecord rec = kd_small_read_record(rec_words);
    const int r = rec.count;
    const long long events = rec_words[KD_SMALL_RECORD];  // -1: none yet
    const int* tri = L.in_refs + rec.start;
    __syncthreads();  // (the previous node's threads are done with sh)
    for (int i = threadIdx.x; i < r; i += KD_MEDIUM_BLOCK) {
        const int t = tri[i];
        for (int k = 0; k < 3; ++k) {
            sh.lo[k][i] = L.tri_lo[3 * t + k];
            sh.hi[k][i] = L.tri_hi[3 * t + k];
        }
    }
    __syncthreads();
    for (int axis = 0; axis < 3; ++axis) {
        if (events < 0) {
            kd_medium_make_events(sh, axis, r);
            continue;
        }
        // the parent wrote 2 * r - (planar references) events of each axis
        int planar = 0;
        for (int base = 0; base < r; base += KD_MEDIUM_BLOCK) {
            const int i = base + threadIdx.x;
            planar += __syncthreads_count(i < r && sh.lo[axis][i] == sh.hi[axis][i]);
        }
        const int n = 2 * r - planar;
        const unsigned short* in = L.in_events + events + 2ll * r * axis;
        for (int j = threadIdx.x; j < n; j += KD_MEDIUM_BLOCK) sh.events[axis][j] = in[j];
        if (threadIdx.x == 0) sh.num_events[axis] = n;
    }
    __syncthreads();
    KdSmallSplit best = kd_small_no_split();
    if (rec.depth < cfg.max_depth && r > cfg.leaf_size)
        best = kd_medium_best_split(sh, r, rec.lo, rec.hi, cfg);
    const bool split = best.axis < 3 && best.cost < __dmul_rn(cfg.k_intersect, (double)r);
    // a root's level-loop leaf is replaced: its entries become unused
    if (threadIdx.x == 0 && L.level == 0)
        atomicAdd(L.counters + KD_SMALL_HOLES, (unsigned long long)r);
    if (!split) {
        if (threadIdx.x == 0)
            sh.slots[0] = L.leaves_before + atomicAdd(L.row + KD_SMALL_LEVEL_LEAVES,
                                                      (unsigned long long)r);
        __syncthreads();
        const unsigned long long first = sh.slots[0];
        if (first + r > (unsigned long long)L.leaf_capacity) {
            if (threadIdx.x == 0) kd_small_full(L, KD_SMALL_FULL_LEAVES);
            return;  // (block-uniform: the level's other nodes still count their needs)
        }
        for (int i = threadIdx.x; i < r; i += KD_MEDIUM_BLOCK) *L.tree.leaf(first + i) = tri[i];
        if (threadIdx.x == 0) {
            L.tree.set_node(rec.node, KD_AXIS_LEAF, 0.0f, (int)first, r);
            atomicMax(L.counters + KD_SMALL_DEPTH, (unsigned long long)rec.depth);
        }
        return;
    }
    // classify_triangles (R9)
    const float* lo_a = sh.lo[best.axis];
    const float* hi_a = sh.hi[best.axis];
    int num_left = 0, num_right = 0;
    for (int base = 0; base < r; base += KD_MEDIUM_BLOCK) {
        const int i = base + threadIdx.x;
        const unsigned cls = i < r ? kd_class_of(lo_a[i], hi_a[i], best.pos, best.side) : 0;
        num_left += __syncthreads_count(cls & KD_CLASS_LEFT);
        num_right += __syncthreads_count(cls & KD_CLASS_RIGHT);
    }
    const int counts[2] = {num_left, num_right};
    int live = 0, back = 0, medium = 0, medium_events = 0;
    for (int side = 0; side < 2; ++side) {
        medium += counts[side] > KD_SMALL_MAX_REFS;
        medium_events += counts[side] > KD_SMALL_MAX_REFS ? 6 * counts[side] : 0;
        live += counts[side] > 0 && counts[side] <= KD_SMALL_MAX_REFS;
        back += counts[side] > 0 && counts[side] <= KD_SMALL_TINY_REFS;
    }
    if (threadIdx.x == 0) {
        sh.slots[0] = L.nodes_before + atomicAdd(L.row + KD_SMALL_LEVEL_NODES, 2ull);
        sh.slots[1] = live ? atomicAdd(L.next + KD_SMALL_LEVEL_RECORDS,
                                       (unsigned long long)(live - back)
                                           | (unsigned long long)back
                                                 << KD_SMALL_RECORDS_BACK_SHIFT)
                           : 0ull;
        sh.slots[2] = medium ? atomicAdd(L.next + KD_SMALL_LEVEL_MEDIUM, (unsigned long long)medium)
                             : 0ull;
        sh.slots[3] = atomicAdd(L.next + KD_SMALL_LEVEL_REFS,
                                (unsigned long long)(num_left + num_right));
        sh.slots[4] = medium_events ? atomicAdd(L.next + KD_SMALL_LEVEL_EVENTS,
                                                (unsigned long long)medium_events)
                                    : 0ull;
    }
    __syncthreads();
    const unsigned long long child = sh.slots[0], slot = sh.slots[1], first = sh.slots[3];
    const long long medium_at = (long long)sh.slots[2];
    const unsigned long long events_at = sh.slots[4];
    const unsigned long long full_bits = kd_small_split_full(
        L, child, slot, live, medium_at + medium, first + num_left + num_right,
        events_at + medium_events);
    if (full_bits) {
        if (threadIdx.x == 0) kd_small_full(L, full_bits);
        return;
    }
    // the children's references in the node's order: the left ones, then the right ones
    int left = 0, right = 0;
    for (int base = 0; base < r; base += KD_MEDIUM_BLOCK) {
        const int i = base + threadIdx.x;
        const unsigned cls = i < r ? kd_class_of(lo_a[i], hi_a[i], best.pos, best.side) : 0;
        const unsigned to_left = __ballot_sync(full, cls & KD_CLASS_LEFT);
        const unsigned to_right = __ballot_sync(full, cls & KD_CLASS_RIGHT);
        if (lane == 0) {
            sh.warp_count[0][warp] = __popc(to_left);
            sh.warp_count[1][warp] = __popc(to_right);
        }
        __syncthreads();
        int at_left = left + __popc(to_left & lanes_below);
        int at_right = right + __popc(to_right & lanes_below);
        for (int w = 0; w < KD_MEDIUM_BLOCK / 32; ++w) {
            const int a = sh.warp_count[0][w], b = sh.warp_count[1][w];
            at_left += w < warp ? a : 0;
            at_right += w < warp ? b : 0;
            left += a;
            right += b;
        }
        if (cls & KD_CLASS_LEFT) L.out_refs[first + at_left] = tri[i];
        if (cls & KD_CLASS_RIGHT) L.out_refs[first + num_left + at_right] = tri[i];
        if (i < r) {
            sh.to_child[0][i] = cls & KD_CLASS_LEFT ? at_left : KD_MEDIUM_NONE;
            sh.to_child[1][i] = cls & KD_CLASS_RIGHT ? at_right : KD_MEDIUM_NONE;
        }
        __syncthreads();  // (the counts are written again)
    }
    // a medium child's events (the left one's first)
    unsigned long long events_next = events_at;
    for (int side = 0; side < 2; ++side) {
        if (counts[side] <= KD_SMALL_MAX_REFS) continue;
        kd_medium_child_events(sh, side, counts[side], L.out_events + events_next);
        events_next += 6 * counts[side];
    }
    if (threadIdx.x == 0) {
        const int deepest = kd_small_children(L, rec, best.axis, best.pos, (long long)child, slot,
                                               medium_at, events_at, first, num_left, num_right);
        if (deepest >= 0) atomicMax(L.counters + KD_SMALL_DEPTH, (unsigned long long)deepest);
    }
}
