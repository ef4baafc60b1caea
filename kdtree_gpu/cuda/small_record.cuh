// A deferred node's record (KD_SMALL_RECORD int32; encoding.SMALL_RECORD): tree
// node, depth and count of its references in one word (the count, up to
// KD_MEDIUM_MAX_REFS, in the bits from KD_SMALL_COUNT_SHIFT), start of its
// references, box. Written by the level loop when it
// defers a node (build_loop.cu) and by the small-node levels for the children
// they keep deferring (build_small.cu), which read it. Nine words, not ten:
// the subtree stage holds two buffers of records (80 bytes per deferred
// reference of room at ten).
#pragma once

struct KdSmallRecord {
    int node, depth, start, count;
    float lo[3], hi[3];
};

__device__ __forceinline__ void kd_small_write_record(int* rec, int node, int depth, long long start,
                                                      int count, const float* lo, const float* hi)
{
    rec[0] = node;
    rec[1] = depth | (count << KD_SMALL_COUNT_SHIFT);
    rec[2] = (int)start;
    for (int k = 0; k < 3; ++k) {
        rec[3 + k] = __float_as_int(lo[k]);
        rec[6 + k] = __float_as_int(hi[k]);
    }
}

// The count of a record's references (without reading the rest).
__device__ __forceinline__ int kd_small_record_count(const int* rec)
{
    return (int)((unsigned)rec[1] >> KD_SMALL_COUNT_SHIFT);
}

__device__ __forceinline__ KdSmallRecord kd_small_read_record(const int* rec)
{
    KdSmallRecord r;
    r.node = rec[0];
    r.depth = rec[1] & ((1 << KD_SMALL_COUNT_SHIFT) - 1);
    r.count = kd_small_record_count(rec);
    r.start = rec[2];
    for (int k = 0; k < 3; ++k) {
        r.lo[k] = __int_as_float(rec[3 + k]);
        r.hi[k] = __int_as_float(rec[6 + k]);
    }
    return r;
}
