// Watertight ray-triangle intersection (Woop, Benthin and Wald, "Watertight
// Ray/Triangle Intersection", JCGT 2(1), 2013), float32, two-sided.
//
// Shared by the kd-tree traversal (traverse.cu), the brute-force oracle
// (brute.cu) and the path tracer. kdtree_gpu/trace/cpu.py implements the
// same test; both follow these conventions so that they decide alike:
//
//   * kz = the axis of the largest |d| (lowest index on ties), kx = kz + 1,
//     ky = kx + 1 (mod 3); kx and ky swap when d[kz] < 0, which keeps the
//     winding of the projected triangle.
//   * Shear: Sx = d[kx] / d[kz], Sy = d[ky] / d[kz], Sz = 1 / d[kz].
//   * A = v0 - o, B = v1 - o, C = v2 - o; Ax = A[kx] - Sx * A[kz] (likewise y,
//     B, C); edge functions U = Cx*By - Cy*Bx, V = Ax*Cy - Ay*Cx,
//     W = Bx*Ay - By*Ax. When one of them is exactly 0, all three are redone
//     in float64 from the same float32 operands (the products are exact).
//   * A hit needs U, V, W all >= 0 or all <= 0, det = (U + V) + W != 0, and
//     a finite t with tmin <= t <= tmax, t = T / det, T = (U*Az + V*Bz) + W*Cz and
//     Az = Sz * A[kz]. Barycentrics: u = V / det (weight of v1),
//     v = W / det (weight of v2).
//
// Every float operation uses an explicitly rounded intrinsic, so nvcc cannot
// contract a product and a sum into one FMA: the results round as in the
// NumPy/numba version, operation by operation.

#pragma once

#define KD_WT_INF (__int_as_float(0x7f800000))

// Per-ray part of the test, computed once before any triangle.
struct KdWatertightRay {
    float ox, oy, oz;  // origin, permuted to (kx, ky, kz)
    float sx, sy, sz;  // shear constants
    int kx, ky, kz;
};

// Component k (0, 1, 2) of (x, y, z), without indexing a local array.
__device__ __forceinline__ float kd_select_axis(float x, float y, float z, int k) {
    return k == 0 ? x : (k == 1 ? y : z);
}

// Set up the watertight test for the ray o + t d (d must not be all zero).
__device__ __forceinline__ KdWatertightRay kd_setup_watertight(float ox, float oy, float oz,
                                                               float dx, float dy, float dz) {
    KdWatertightRay r;
    const float ax = fabsf(dx), ay = fabsf(dy), az = fabsf(dz);
    // argmax |d| with the lowest index on ties
    int kz = 0;
    if (ay > ax) kz = 1;
    if (az > (kz == 0 ? ax : ay)) kz = 2;
    int kx = kz == 2 ? 0 : kz + 1;
    int ky = kx == 2 ? 0 : kx + 1;
    const float dkz = kd_select_axis(dx, dy, dz, kz);
    if (dkz < 0.0f) {
        const int tmp = kx;
        kx = ky;
        ky = tmp;
    }
    r.kx = kx;
    r.ky = ky;
    r.kz = kz;
    r.sx = __fdiv_rn(kd_select_axis(dx, dy, dz, kx), dkz);
    r.sy = __fdiv_rn(kd_select_axis(dx, dy, dz, ky), dkz);
    r.sz = __fdiv_rn(1.0f, dkz);
    r.ox = kd_select_axis(ox, oy, oz, kx);
    r.oy = kd_select_axis(ox, oy, oz, ky);
    r.oz = kd_select_axis(ox, oy, oz, kz);
    return r;
}

// Test one triangle (vertices in the .xyz of a, b, c). On a hit with
// tmin <= t <= tmax, writes t and the un-normalized edge functions and
// returns true; the caller divides by det only for the hits it keeps.
__device__ __forceinline__ bool kd_hit_triangle(const KdWatertightRay& r, float4 a, float4 b,
                                                float4 c, float tmin, float tmax, float& t_hit,
                                                float& edge_v, float& edge_w, float& det_hit) {
    // vertices relative to the origin, in the permuted frame
    const float akx = __fsub_rn(kd_select_axis(a.x, a.y, a.z, r.kx), r.ox);
    const float aky = __fsub_rn(kd_select_axis(a.x, a.y, a.z, r.ky), r.oy);
    const float akz = __fsub_rn(kd_select_axis(a.x, a.y, a.z, r.kz), r.oz);
    const float bkx = __fsub_rn(kd_select_axis(b.x, b.y, b.z, r.kx), r.ox);
    const float bky = __fsub_rn(kd_select_axis(b.x, b.y, b.z, r.ky), r.oy);
    const float bkz = __fsub_rn(kd_select_axis(b.x, b.y, b.z, r.kz), r.oz);
    const float ckx = __fsub_rn(kd_select_axis(c.x, c.y, c.z, r.kx), r.ox);
    const float cky = __fsub_rn(kd_select_axis(c.x, c.y, c.z, r.ky), r.oy);
    const float ckz = __fsub_rn(kd_select_axis(c.x, c.y, c.z, r.kz), r.oz);

    // shear and scale so that the ray runs along +z
    const float ax = __fsub_rn(akx, __fmul_rn(r.sx, akz));
    const float ay = __fsub_rn(aky, __fmul_rn(r.sy, akz));
    const float bx = __fsub_rn(bkx, __fmul_rn(r.sx, bkz));
    const float by = __fsub_rn(bky, __fmul_rn(r.sy, bkz));
    const float cx = __fsub_rn(ckx, __fmul_rn(r.sx, ckz));
    const float cy = __fsub_rn(cky, __fmul_rn(r.sy, ckz));

    // scaled barycentrics (2D edge functions)
    float u = __fsub_rn(__fmul_rn(cx, by), __fmul_rn(cy, bx));
    float v = __fsub_rn(__fmul_rn(ax, cy), __fmul_rn(ay, cx));
    float w = __fsub_rn(__fmul_rn(bx, ay), __fmul_rn(by, ax));

    // an edge through the ray: decide it exactly in float64, so that the two
    // triangles sharing the edge agree on which side the ray passes
    if (u == 0.0f || v == 0.0f || w == 0.0f) {
        u = __double2float_rn(__dsub_rn(__dmul_rn((double)cx, (double)by),
                                        __dmul_rn((double)cy, (double)bx)));
        v = __double2float_rn(__dsub_rn(__dmul_rn((double)ax, (double)cy),
                                        __dmul_rn((double)ay, (double)cx)));
        w = __double2float_rn(__dsub_rn(__dmul_rn((double)bx, (double)ay),
                                        __dmul_rn((double)by, (double)ax)));
    }

    // two-sided: all edge functions of one sign
    if ((u < 0.0f || v < 0.0f || w < 0.0f) && (u > 0.0f || v > 0.0f || w > 0.0f)) return false;
    const float det = __fadd_rn(__fadd_rn(u, v), w);
    if (det == 0.0f) return false;

    const float az = __fmul_rn(r.sz, akz);
    const float bz = __fmul_rn(r.sz, bkz);
    const float cz = __fmul_rn(r.sz, ckz);
    const float big_t = __fadd_rn(__fadd_rn(__fmul_rn(u, az), __fmul_rn(v, bz)), __fmul_rn(w, cz));
    const float t = __fdiv_rn(big_t, det);
    // a hit has a finite t (an infinite or NaN quotient comes from T
    // overflowing: a hit beyond float32's range is no hit; trace/scale.py)
    if (!(t >= tmin && t <= tmax) || !isfinite(t)) return false;
    t_hit = t;
    edge_v = v;
    edge_w = w;
    det_hit = det;
    return true;
}

// Barycentrics of a kept hit: u = V / det (weight of v1), v = W / det (v2).
__device__ __forceinline__ void kd_hit_barycentrics(float edge_v, float edge_w, float det,
                                                    float& u, float& v) {
    u = __fdiv_rn(edge_v, det);
    v = __fdiv_rn(edge_w, det);
}

// The closest hit kept so far: on equal t the lowest triangle id wins (the
// traversal and the brute force keep hits alike).
struct KdClosestHit {
    float t;
    unsigned int tri;  // 0xffffffff: none yet (above every id)
    float edge_v, edge_w, det;
};

__device__ __forceinline__ KdClosestHit kd_no_hit(float tmax)
{
    KdClosestHit h = {tmax, 0xffffffffu, 0.0f, 0.0f, 1.0f};
    return h;
}

// A hit found with t <= h.t (kd_hit_triangle tested it against h.t).
__device__ __forceinline__ void kd_keep_closer(KdClosestHit& h, float t, unsigned int id,
                                               float edge_v, float edge_w, float det)
{
    if (t < h.t || id < h.tri) {
        h.t = t;
        h.tri = id;
        h.edge_v = edge_v;
        h.edge_w = edge_w;
        h.det = det;
    }
}

// The answer: t, id and barycentrics, or inf, KD_NO_HIT, 0, 0 for a miss.
__device__ __forceinline__ void kd_closest_result(const KdClosestHit& h, float& t, int& tri,
                                                  float& u, float& v)
{
    t = KD_WT_INF;
    tri = KD_NO_HIT;
    u = 0.0f;
    v = 0.0f;
    if (h.tri != 0xffffffffu) {
        t = h.t;
        tri = (int)h.tri;
        kd_hit_barycentrics(h.edge_v, h.edge_w, h.det, u, v);
    }
}
