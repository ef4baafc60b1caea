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
//                                    tree), times the trace scale
//   KdTraceParams, KdRays, KdHits     as for the traversal (traverse.cu)
//
// Each block stages KD_BRUTE_TILE triangles in shared memory at a time, and
// every thread of the block tests its ray against all of them.

#include "watertight.cuh"

#define KD_BRUTE_TILE KD_BRUTE_BLOCK

// One thread per ray: rays come as in the traversal kernel (KdRays with
// per-ray or, through KdTraceParams, shared tmin/tmax; the trace scale in
// KdTraceParams), answers go to KdHits (hit_t/hit_tri/hit_u/hit_v, or
// hit_any). The traversal's ray checks are not repeated here: the caller
// checked the rays.
template <bool ANY_HIT>
__global__ void __launch_bounds__(KD_BRUTE_BLOCK)
kd_brute(const float4* __restrict__ tris, int num_tris, KdTraceParams p, KdRays rays,
         KdHits hits)
{
    __shared__ float4 tile[3 * KD_BRUTE_TILE];
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const bool active = i < p.num_rays;
    // threads past the end set up a dummy ray and only help with the staging
    const long long r = active ? i : 0;
    const float* o = rays.ray_origin + 3 * r;
    const float* d = rays.ray_direction + 3 * r;
    // in the trace scale's space, as the triangles (kdtree_gpu/trace/scale.py)
    const KdWatertightRay wr = kd_setup_watertight(
        __fmul_rn(o[0], p.scale), __fmul_rn(o[1], p.scale), __fmul_rn(o[2], p.scale),
        __fmul_rn(d[0], p.scale), __fmul_rn(d[1], p.scale), __fmul_rn(d[2], p.scale));
    const float tmin = active ? (rays.ray_tmin ? rays.ray_tmin[r] : p.tmin) : 0.0f;
    const float tmax = active ? (rays.ray_tmax ? rays.ray_tmax[r] : p.tmax) : -1.0f;
    KdClosestHit best = kd_no_hit(tmax);
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
                                ANY_HIT ? tmax : best.t, t, ev, ew, det)) {
                // ids ascend: on equal t the first (lowest) id is kept
                kd_keep_closer(best, t, (unsigned int)__float_as_int(a.w), ev, ew, det);
                if (ANY_HIT) {
                    done = true;
                    break;
                }
            }
        }
    }
    if (!active) return;
    if (ANY_HIT) {
        hits.hit_any[i] = best.tri != 0xffffffffu ? 1 : 0;
    } else {
        kd_closest_result(best, hits.hit_t[i], hits.hit_tri[i], hits.hit_u[i], hits.hit_v[i]);
    }
}

template __global__ void kd_brute<false>(const float4*, int, KdTraceParams, KdRays, KdHits);
template __global__ void kd_brute<true>(const float4*, int, KdTraceParams, KdRays, KdHits);
