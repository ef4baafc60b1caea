// Brute-force ray casting over every triangle: the GPU oracle for the
// kd-tree traversal (traverse.cu). Same watertight test, same ray interval
// rule (tmin <= t <= tmax), and on equal t the lowest triangle id wins,
// which falls out of testing the triangles in ascending id order and
// keeping only strictly closer hits.
//
// Inputs:
//   tris     (3 * num_tris,) float4  three vertices per triangle, ascending
//                                    triangle id, id in the first vertex's .w
//                                    (degenerate triangles left out, as in the
//                                    tree)
//   origins, directions (num_rays, 3) float32; ray_tmin, ray_tmax (num_rays,)
//   scale    the trace scale (kdtree_gpu/trace/scale.py): tris hold the
//            vertices times it, and every ray is scaled the same way
//
// Each block stages KD_BRUTE_TILE triangles in shared memory at a time, and
// every thread of the block tests its ray against all of them.

#include "watertight.cuh"

#define KD_BRUTE_TILE KD_BRUTE_BLOCK

template <bool ANY_HIT>
__device__ __forceinline__ void kd_brute_ray(const float4* __restrict__ tris, int num_tris,
                                             const float* __restrict__ origins,
                                             const float* __restrict__ directions,
                                             const float* __restrict__ ray_tmin,
                                             const float* __restrict__ ray_tmax, int num_rays,
                                             float scale, float& out_t, int& out_tri,
                                             float& out_u, float& out_v) {
    __shared__ float4 tile[3 * KD_BRUTE_TILE];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const bool active = i < num_rays;
    // threads past the end set up a dummy ray and only help with the staging
    const long long r = active ? i : 0;
    // in the trace scale's space, as the triangles (kdtree_gpu/trace/scale.py)
    const KdWatertightRay wr = kd_setup_watertight(
        __fmul_rn(origins[3 * r], scale), __fmul_rn(origins[3 * r + 1], scale),
        __fmul_rn(origins[3 * r + 2], scale), __fmul_rn(directions[3 * r], scale),
        __fmul_rn(directions[3 * r + 1], scale), __fmul_rn(directions[3 * r + 2], scale));
    const float tmin = active ? ray_tmin[r] : 0.0f;
    const float tmax = active ? ray_tmax[r] : -1.0f;
    float best_t = tmax;
    unsigned int best_tri = 0xffffffffu;
    float best_v = 0.0f, best_w = 0.0f, best_det = 1.0f;
    bool done = !(active && tmin <= tmax);

    for (int base = 0; base < num_tris; base += KD_BRUTE_TILE) {
        // every thread takes part in the staging, active or not
        const int num_tile = min(KD_BRUTE_TILE, num_tris - base);
        // also the barrier that protects the previous tile; a block whose
        // rays all have their answer stops here
        if (__syncthreads_and(done)) break;
        for (int k = threadIdx.x; k < 3 * num_tile; k += blockDim.x) {
            tile[k] = tris[3 * (long long)base + k];
        }
        __syncthreads();
        if (done) continue;
        for (int j = 0; j < num_tile; ++j) {
            const float4 a = tile[3 * j];
            float t, ev, ew, det;
            if (kd_hit_triangle(wr, a, tile[3 * j + 1], tile[3 * j + 2], tmin,
                                ANY_HIT ? tmax : best_t, t, ev, ew, det)) {
                const unsigned int id = (unsigned int)__float_as_int(a.w);
                if (ANY_HIT) {
                    best_tri = id;
                    done = true;
                    break;
                }
                if (t < best_t || best_tri == 0xffffffffu) {
                    best_t = t;
                    best_tri = id;
                    best_v = ev;
                    best_w = ew;
                    best_det = det;
                }
            }
        }
    }

    out_t = KD_WT_INF;
    out_tri = KD_NO_HIT;
    out_u = 0.0f;
    out_v = 0.0f;
    if (best_tri != 0xffffffffu) {
        out_t = best_t;
        out_tri = (int)best_tri;
        kd_hit_barycentrics(best_v, best_w, best_det, out_u, out_v);
    }
}

// Closest hit over all triangles: t (inf on a miss), id (KD_NO_HIT), u, v.
extern "C" __global__ void __launch_bounds__(KD_BRUTE_BLOCK)
kd_brute_closest(const float4* __restrict__ tris, int num_tris, const float* __restrict__ origins,
                 const float* __restrict__ directions, const float* __restrict__ ray_tmin,
                 const float* __restrict__ ray_tmax, int num_rays, float scale,
                 float* __restrict__ hit_t,
                 int* __restrict__ hit_tri, float* __restrict__ hit_u,
                 float* __restrict__ hit_v) {
    float t, u, v;
    int tri;
    kd_brute_ray<false>(tris, num_tris, origins, directions, ray_tmin, ray_tmax, num_rays, scale,
                        t, tri, u, v);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= num_rays) return;
    hit_t[i] = t;
    hit_tri[i] = tri;
    hit_u[i] = u;
    hit_v[i] = v;
}

// Any hit over all triangles: 1 when some triangle has tmin <= t <= tmax.
extern "C" __global__ void __launch_bounds__(KD_BRUTE_BLOCK)
kd_brute_any(const float4* __restrict__ tris, int num_tris, const float* __restrict__ origins,
             const float* __restrict__ directions, const float* __restrict__ ray_tmin,
             const float* __restrict__ ray_tmax, int num_rays, float scale,
             unsigned char* __restrict__ hit_any) {
    float t, u, v;
    int tri;
    kd_brute_ray<true>(tris, num_tris, origins, directions, ray_tmin, ray_tmax, num_rays, scale,
                       t, tri, u, v);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= num_rays) return;
    hit_any[i] = tri != KD_NO_HIT ? 1 : 0;
}
