// Perfect splits (SAHConfig(clip=True)) in the per-stage builder
// (kdtree_gpu/builder/gpu/level_stages.py); the level-loop kernel clips with
// the same device functions (clip.cuh). The NumPy twin is
// kdtree_gpu/builder/clip.py, the oracle cpu_reference/clip.py.
#include "clip.cuh"

// Every reference's box in its node, read off its events.
extern "C" __global__ void kd_reference_boxes(KdEvents ev, long long num_events,
                                              long long num_nodes, float* __restrict__ ref_lo,
                                              float* __restrict__ ref_hi)
{
    long long e = kd_tid();
    if (e < num_events)
        kd_reference_box_event(ev.event_pos, ev.event_kind, ev.event_ref,
                               {ev.event_seg, nullptr, nullptr, nullptr, num_nodes}, e, ref_lo,
                               ref_hi);
}

// A test kernel, one thread per row: kdtree_gpu.builder.clip.clip_child_boxes'
// rows on the GPU (the tests compare its bits with cpu_reference.clip). Row r
// of `rows` holds v0, v1, v2, prev_lo, prev_hi, child_lo, child_hi (7 x 3
// floats); row r of `out` the box (lo, hi).
extern "C" __global__ void kd_clip_child_boxes(const float* __restrict__ rows, long long m,
                                               float* __restrict__ out)
{
    long long r = kd_tid();
    if (r >= m) return;
    const float* p = rows + 21 * r;
    kd_clip_child_box(p, p + 3, p + 6, p + 9, p + 12, p + 15, p + 18, out + 6 * r,
                      out + 6 * r + 3);
}

// The straddling references' copies, 2 * num_both threads: copy c is the left
// (c < num_both) or right copy of reference both[c % num_both]. Writes its
// box in the child, its reference in the next level and its child segment per
// axis (the inputs of kdtree_gpu.builder.clip.make_clipped_events).
extern "C" __global__ void kd_clip_copies(const float* __restrict__ vertices,
                                          const int* __restrict__ faces,
                                          const int* __restrict__ ref_tri,
                                          const int* __restrict__ ref_node,
                                          const float* __restrict__ ref_lo,
                                          const float* __restrict__ ref_hi,
                                          const long long* __restrict__ both, long long num_both,
                                          const long long* __restrict__ ref_lr_ex,
                                          const long long* __restrict__ node_ref_offset,
                                          const long long* __restrict__ split_leaf_ex,
                                          const long long* __restrict__ child_ref_offset,
                                          const float* __restrict__ child_lo,
                                          const float* __restrict__ child_hi,
                                          long long num_nodes, float* __restrict__ copy_lo,
                                          float* __restrict__ copy_hi,
                                          long long* __restrict__ copy_ref,
                                          long long* __restrict__ copy_seg)  // (3, 2 * num_both)
{
    long long c = kd_tid();
    long long num_copies = 2 * num_both;
    if (c >= num_copies) return;
    int side = c >= num_both;
    long long r = both[c - side * num_both];
    int node = ref_node[r];
    long long num_split = KD_LOW(split_leaf_ex[num_nodes]);
    long long child = 2 * KD_LOW(split_leaf_ex[node]) + side;
    const int* f = faces + 3 * (long long)ref_tri[r];
    kd_clip_child_box(vertices + 3 * (long long)f[0], vertices + 3 * (long long)f[1],
                      vertices + 3 * (long long)f[2], ref_lo + 3 * r, ref_hi + 3 * r,
                      child_lo + 3 * child, child_hi + 3 * child, copy_lo + 3 * c,
                      copy_hi + 3 * c);
    long long dl, dr;
    kd_ref_destinations(r, node, ref_lr_ex, node_ref_offset, split_leaf_ex, child_ref_offset,
                        &dl, &dr);
    copy_ref[c] = side ? dr : dl;
    for (int k = 0; k < 3; ++k)
        copy_seg[k * num_copies + c] =
            kd_child_group(k * num_nodes + node, num_nodes, split_leaf_ex, num_split) + side;
}

// --- the copies' events, sorted and merged into the kept ones ------------------
// The CUDA form of kdtree_gpu.builder.clip.make_clipped_events and
// merge_events: one key per event slot, one sort, then every event written
// straight to its place in the merged list (no per-kind passes, no counts
// read back but the number of new events).
//
// Slot (2 k + j) * num_copies + c holds copy c's event on axis k: j = 0 its
// END (or PLANAR when its box is flat there), j = 1 its START (none when
// flat: the slot's key is ~0 and sorts last). Equal keys are then in the
// order the twin lists them (axis, kind, copy), so a stable sort agrees.

// The event of slot `slot` (the slot must hold one).
__device__ __forceinline__ void kd_clip_slot_event(long long slot, long long num_copies,
                                                   const float* copy_lo, const float* copy_hi,
                                                   float* pos, int* kind, long long* copy)
{
    long long kj = slot / num_copies;
    long long c = slot - kj * num_copies;
    int k = (int)(kj >> 1);
    float lo = copy_lo[3 * c + k], hi = copy_hi[3 * c + k];
    if (kj & 1) {
        *kind = KD_EVENT_START;
        *pos = lo;
    } else {
        *kind = lo == hi ? KD_EVENT_PLANAR : KD_EVENT_END;
        *pos = lo == hi ? lo : hi;
    }
    *copy = c;
}

// Order within a segment: position, kind, the reference's index in its node.
__device__ __forceinline__ unsigned long long kd_clip_local_key(float pos, int kind, long long ref,
                                                                int seg, long long num_children,
                                                                const long long* child_ref_offset)
{
    return kd_clip_key(pos, kind, ref - child_ref_offset[seg % num_children]);
}

// 3 * num_copies threads, one per (axis, copy): the sort keys of its two
// slots; counts the flat (PLANAR) ones, whose second slot stays empty.
extern "C" __global__ void kd_clip_event_keys(const float* __restrict__ copy_lo,
                                              const float* __restrict__ copy_hi,
                                              const long long* __restrict__ copy_seg,
                                              long long num_copies,
                                              unsigned long long* __restrict__ keys,
                                              unsigned long long* __restrict__ num_planar)
{
    long long i = kd_tid();
    if (i >= 3 * num_copies) return;
    int k = (int)(i / num_copies);
    long long c = i - k * num_copies;
    float lo = copy_lo[3 * c + k], hi = copy_hi[3 * c + k];
    unsigned long long base = (unsigned long long)copy_seg[i] << KD_CLIP_SEG_SHIFT;
    long long first = 2 * k * num_copies + c;
    if (lo == hi) {
        keys[first] = base | ((unsigned long long)kd_ordered_bits32(lo) << KD_CLIP_NEW_POS_SHIFT) |
                      KD_EVENT_PLANAR;
        keys[first + num_copies] = ~0ull;
        atomicAdd(num_planar, 1ull);
    } else {
        keys[first] = base | ((unsigned long long)kd_ordered_bits32(hi) << KD_CLIP_NEW_POS_SHIFT) |
                      KD_EVENT_END;
        keys[first + num_copies] =
            base | ((unsigned long long)kd_ordered_bits32(lo) << KD_CLIP_NEW_POS_SHIFT) |
            KD_EVENT_START;
    }
}

// The kept events' keys within their segments.
extern "C" __global__ void kd_clip_kept_keys(KdEvents kept, long long num_events,
                                             long long num_children,
                                             const long long* __restrict__ child_ref_offset,
                                             unsigned long long* __restrict__ key)
{
    long long e = kd_tid();
    if (e >= num_events) return;
    key[e] = kd_clip_local_key(kept.event_pos[e], kept.event_kind[e], kept.event_ref[e],
                               kept.event_seg[e], num_children, child_ref_offset);
}

// num_new threads, new event r in sorted order: its place among the kept
// events of its segment (a binary search on their keys), written at that
// place plus r (the new events before it) in the merged list.
extern "C" __global__ void kd_clip_place_new(const unsigned long long* __restrict__ sorted_slot,
                                             long long num_new, long long num_copies,
                                             const float* __restrict__ copy_lo,
                                             const float* __restrict__ copy_hi,
                                             const long long* __restrict__ copy_ref,
                                             const long long* __restrict__ copy_seg,
                                             const unsigned long long* __restrict__ kept_key,
                                             const long long* __restrict__ kept_offset,
                                             long long num_children,
                                             const long long* __restrict__ child_ref_offset,
                                             long long* __restrict__ place, KdEvents out)
{
    long long r = kd_tid();
    if (r >= num_new) return;
    long long slot = (long long)sorted_slot[r];
    float pos;
    int kind;
    long long c;
    kd_clip_slot_event(slot, num_copies, copy_lo, copy_hi, &pos, &kind, &c);
    int k = (int)(slot / num_copies) >> 1;
    int seg = (int)copy_seg[k * num_copies + c];
    long long ref = copy_ref[c];
    unsigned long long key = kd_clip_local_key(pos, kind, ref, seg, num_children,
                                               child_ref_offset);
    long long lo = kd_lower_bound(kept_key, kept_offset[seg], kept_offset[seg + 1], key);
    place[r] = lo;
    long long dst = lo + r;
    out.event_pos[dst] = pos;
    out.event_kind[dst] = (signed char)kind;
    out.event_ref[dst] = (int)ref;
    out.event_seg[dst] = seg;
}

// max(num_kept, num_segments + 1) threads: kept event e goes after the new
// events placed at or before it (place ascends with r); segment s of the
// merged list starts after the kept and new events of the segments before it
// (sorted_key's segment bits ascend).
extern "C" __global__ void kd_clip_place_kept(KdEvents kept, long long num_kept,
                                              const long long* __restrict__ place,
                                              const unsigned long long* __restrict__ sorted_key,
                                              long long num_new,
                                              const long long* __restrict__ kept_offset,
                                              long long num_segments, KdEvents out,
                                              long long* __restrict__ out_offset)
{
    long long e = kd_tid();
    if (e < num_kept) {
        // the new events placed at or before e: place's upper bound of e
        long long dst = e + kd_lower_bound(place, 0ll, num_new, e + 1);
        out.event_pos[dst] = kept.event_pos[e];
        out.event_kind[dst] = kept.event_kind[e];
        out.event_ref[dst] = kept.event_ref[e];
        out.event_seg[dst] = kept.event_seg[e];
    }
    if (e <= num_segments) {
        unsigned long long first = (unsigned long long)e << KD_CLIP_SEG_SHIFT;
        out_offset[e] = kept_offset[e] + kd_lower_bound(sorted_key, 0ll, num_new, first);
    }
}
