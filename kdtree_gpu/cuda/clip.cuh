// Perfect splits' clipped boxes (SAHConfig(clip=True)), shared by the
// per-stage kernels (clip.cu) and the level-loop kernel (build_loop.cu). The
// NumPy twin is kdtree_gpu/builder/clip.py, the oracle cpu_reference/clip.py:
// the clipped boxes must be the same float32 bits, so the float64 arithmetic
// below is written with round-to-nearest intrinsics (__dadd_rn, ...), which the
// compiler never contracts into fused multiply-adds, in the reference's order.
#pragma once

#include "build_stages.cuh"

// An event's order within its segment: position, kind, then its reference
// (any index that keeps the segment's references in order: the index within
// the node on the per-stage path, within the level in the level loop).
__device__ __forceinline__ unsigned long long kd_clip_key(float pos, int kind, long long ref)
{
    return ((unsigned long long)kd_ordered_bits32(pos) << KD_CLIP_POS_SHIFT) |
           ((unsigned long long)kind << KD_CLIP_KIND_SHIFT) | (unsigned long long)ref;
}

// kd_clip_key's three fields, read back.
__device__ __forceinline__ float kd_clip_key_pos(unsigned long long key)
{
    return kd_float_from_ordered_bits32((unsigned int)(key >> KD_CLIP_POS_SHIFT));
}

__device__ __forceinline__ int kd_clip_key_kind(unsigned long long key)
{
    return (int)((key >> KD_CLIP_KIND_SHIFT) & 3);
}

__device__ __forceinline__ long long kd_clip_key_ref(unsigned long long key)
{
    return (long long)(key & ((1ull << KD_CLIP_KIND_SHIFT) - 1));
}

// Event e's bound of its reference's box in its node (R2): the lower bound
// from a START or PLANAR event, the upper bound from an END or PLANAR one.
__device__ __forceinline__ void kd_reference_box_event(const float* event_pos,
                                                       const signed char* event_kind,
                                                       const int* event_ref,
                                                       const KdEventSegment& event_seg,
                                                       long long e, float* ref_lo, float* ref_hi)
{
    long long slot = 3 * (long long)event_ref[e] + event_seg.axis(e);
    int kind = event_kind[e];
    if (kind != KD_EVENT_END) ref_lo[slot] = event_pos[e];
    if (kind != KD_EVENT_START) ref_hi[slot] = event_pos[e];
}

// The largest float32 not above x (down) or the smallest not below it; never -0.0.
__device__ __forceinline__ float kd_round_outward(double x, bool down)
{
    float f = __double2float_rn(x);
    // toward -inf or +inf (bit patterns: NVRTC has no INFINITY macro)
    float toward = __int_as_float(down ? (int)0xff800000u : 0x7f800000);
    if (down ? (double)f > x : (double)f < x) f = nextafterf(f, toward);
    return f + 0.0f;
}

// cpu_reference.clip.clip_triangle_box: Sutherland-Hodgman against
// x >= lo[0], x <= hi[0], y >= lo[1], ... in that order, points on a plane
// inside; false when nothing is left.
__device__ bool kd_clip_triangle_box(const float* v0, const float* v1, const float* v2,
                                     const float* box_lo, const float* box_hi, float* out_lo,
                                     float* out_hi)
{
    double a[KD_CLIP_MAX_POLY][3], b[KD_CLIP_MAX_POLY][3];
    double(*poly)[3] = a;
    double(*work)[3] = b;
    for (int j = 0; j < 3; ++j) {
        poly[0][j] = v0[j];
        poly[1][j] = v1[j];
        poly[2][j] = v2[j];
    }
    int n = 3;
    for (int k = 0; k < 3; ++k) {
        for (int upper = 0; upper < 2; ++upper) {
            double c = upper ? (double)box_hi[k] : (double)box_lo[k];
            int m = 0;
            for (int i = 0; i < n; ++i) {
                int ip = i > 0 ? i - 1 : n - 1;
                bool cur_in = upper ? poly[i][k] <= c : poly[i][k] >= c;
                bool prev_in = upper ? poly[ip][k] <= c : poly[ip][k] >= c;
                if (cur_in != prev_in) {
                    double t = __ddiv_rn(__dsub_rn(c, poly[ip][k]),
                                         __dsub_rn(poly[i][k], poly[ip][k]));
                    for (int j = 0; j < 3; ++j)
                        work[m][j] = __dadd_rn(poly[ip][j],
                                               __dmul_rn(t, __dsub_rn(poly[i][j], poly[ip][j])));
                    work[m][k] = c;
                    ++m;
                }
                if (cur_in) {
                    for (int j = 0; j < 3; ++j) work[m][j] = poly[i][j];
                    ++m;
                }
            }
            if (m == 0) return false;
            n = m;
            double(*swap)[3] = poly;
            poly = work;
            work = swap;
        }
    }
    for (int j = 0; j < 3; ++j) {
        double lo = poly[0][j], hi = poly[0][j];
        for (int i = 1; i < n; ++i) {
            lo = fmin(lo, poly[i][j]);
            hi = fmax(hi, poly[i][j]);
        }
        out_lo[j] = kd_round_outward(lo, true);
        out_hi[j] = kd_round_outward(hi, false);
    }
    return true;
}

// cpu_reference.clip.clip_child_box: the clipped box intersected with the
// previous box and the child's box, or (polygon empty, or that intersection
// empty on some axis) the previous box intersected with the child's box.
__device__ void kd_clip_child_box(const float* v0, const float* v1, const float* v2,
                                  const float* prev_lo, const float* prev_hi,
                                  const float* child_lo, const float* child_hi, float* out_lo,
                                  float* out_hi)
{
    float clip_lo[3], clip_hi[3];
    bool used = kd_clip_triangle_box(v0, v1, v2, child_lo, child_hi, clip_lo, clip_hi);
    if (used) {
        for (int j = 0; j < 3; ++j) {
            float lo = fmaxf(clip_lo[j], fmaxf(prev_lo[j], child_lo[j]));
            float hi = fminf(clip_hi[j], fminf(prev_hi[j], child_hi[j]));
            if (lo > hi) used = false;
            out_lo[j] = lo;
            out_hi[j] = hi;
        }
    }
    if (!used) {
        for (int j = 0; j < 3; ++j) {
            out_lo[j] = fmaxf(prev_lo[j], child_lo[j]);
            out_hi[j] = fminf(prev_hi[j], child_hi[j]);
        }
    }
}
