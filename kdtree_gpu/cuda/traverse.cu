// Kd-tree ray traversal: closest hit and any hit for batches of rays.
//
// One thread per ray, front to back in the style of pbrt's KdTreeAggregate
// and Havran's thesis (TA_B_rec without recursion): the ray is clipped to
// the root box, then descends with a per-thread stack of (node, t_near,
// t_far) entries for the far children it still has to visit. The loop is
// Aila and Laine's "while-while" (HPG 2009): descend to a leaf, test its
// triangles, pop; neighbouring rays then spend their steps on the same kind
// of work.
//
// Inputs (see kdtree_gpu/trace/gpu.py for the host side):
//   nodes   (num_nodes,) int2     packed nodes (kdtree_gpu/encoding.py):
//                                 .x split bits or leaf count,
//                                 .y (child_or_offset << KD_PACK_SHIFT) | axis
//   tris    (3 * num_refs,) float4  three vertices per leaf reference, in
//                                 leaf_tris order; the first vertex's .w holds
//                                 the triangle id (int bits)
//   origins, directions (num_rays, 3) float32; ray_tmin, ray_tmax (num_rays,)
//
// Robustness. Leaf triangles are tested against the whole ray interval
// [tmin, closest hit so far], never the leaf's own interval, so a node
// interval only decides which children are visited. Those decisions keep a
// child whenever the split plane is within t_eps of the node's interval
// (t_eps = KD_TRAVERSE_EPS times the scene's extent seen from the origin, in
// units of t). That covers the rounding of the slab distances and of the
// watertight test, so a ray that passes through a shared edge or vertex on
// a split plane reaches both sides: rays shot from inside a closed mesh do
// not escape.

#include "watertight.cuh"

// KD_MAX_DEPTH_CAP (a stack entry per level), KD_TRAVERSE_BLOCK and
// KD_TRAVERSE_EPS come from the generated defines (kdtree_gpu/encoding.py).

// Clip the slab [lo, hi] on one axis; a direction component of 0 (an
// infinite reciprocal) keeps the ray only when its origin is inside the slab,
// instead of computing 0 * inf = NaN.
__device__ __forceinline__ bool kd_clip_slab(float lo, float hi, float o, float inv, float& t0,
                                             float& t1) {
    if (fabsf(inv) == KD_WT_INF) return o >= lo && o <= hi;
    const float ta = __fmul_rn(__fsub_rn(lo, o), inv);
    const float tb = __fmul_rn(__fsub_rn(hi, o), inv);
    t0 = fmaxf(t0, fminf(ta, tb));
    t1 = fminf(t1, fmaxf(ta, tb));
    return true;
}

template <bool ANY_HIT, bool COUNT>
__device__ __forceinline__ void kd_trace_ray(const int2* __restrict__ nodes,
                                             const float4* __restrict__ tris, float lo_x,
                                             float lo_y, float lo_z, float hi_x, float hi_y,
                                             float hi_z, const float* __restrict__ origins,
                                             const float* __restrict__ directions,
                                             const float* __restrict__ ray_tmin,
                                             const float* __restrict__ ray_tmax, int i,
                                             float& out_t, int& out_tri, float& out_u,
                                             float& out_v, int& out_nodes, int& out_tests) {
    const float ox = __ldg(origins + 3 * (long long)i);
    const float oy = __ldg(origins + 3 * (long long)i + 1);
    const float oz = __ldg(origins + 3 * (long long)i + 2);
    const float dx = __ldg(directions + 3 * (long long)i);
    const float dy = __ldg(directions + 3 * (long long)i + 1);
    const float dz = __ldg(directions + 3 * (long long)i + 2);
    const float tmin = __ldg(ray_tmin + i);
    const float tmax = __ldg(ray_tmax + i);

    out_t = KD_WT_INF;
    out_tri = KD_NO_HIT;
    out_u = 0.0f;
    out_v = 0.0f;
    int num_nodes = 0;
    int num_tests = 0;

    // Clip to the root box
    const float inv_x = __fdiv_rn(1.0f, dx);
    const float inv_y = __fdiv_rn(1.0f, dy);
    const float inv_z = __fdiv_rn(1.0f, dz);
    float t0 = tmin, t1 = tmax;
    bool alive = kd_clip_slab(lo_x, hi_x, ox, inv_x, t0, t1);
    alive &= kd_clip_slab(lo_y, hi_y, oy, inv_y, t0, t1);
    alive &= kd_clip_slab(lo_z, hi_z, oz, inv_z, t0, t1);

    const KdWatertightRay wr = kd_setup_watertight(ox, oy, oz, dx, dy, dz);
    // the largest coordinate difference between the origin and the root box,
    // in units of t along the dominant axis, is the scale of every rounding
    // error; explicit roundings (no FMA) keep the CPU traversal's decisions
    const float extent = fmaxf(fmaxf(fmaxf(fabsf(lo_x - ox), fabsf(hi_x - ox)),
                                     fmaxf(fabsf(lo_y - oy), fabsf(hi_y - oy))),
                               fmaxf(fabsf(lo_z - oz), fabsf(hi_z - oz)));
    const float t_eps = __fmul_rn(__fmul_rn(KD_TRAVERSE_EPS, extent), fabsf(wr.sz));
    // a zero direction (infinite 1 / d[kz]) hits nothing
    alive &= (tmin <= tmax) && (t0 <= __fadd_rn(t1, t_eps)) && fabsf(wr.sz) != KD_WT_INF;

    // bit k set: the ray goes toward -k, so the right child (upper half) comes first
    const int neg_mask = (__float_as_int(dx) < 0 ? 1 : 0) | (__float_as_int(dy) < 0 ? 2 : 0) |
                         (__float_as_int(dz) < 0 ? 4 : 0);

    int stack_node[KD_MAX_DEPTH_CAP];
    float stack_tn[KD_MAX_DEPTH_CAP];
    float stack_tf[KD_MAX_DEPTH_CAP];
    int sp = 0;

    int node = 0;
    float tn = t0, tf = t1;
    float best_t = tmax;
    unsigned int best_tri = 0xffffffffu;  // KD_NO_HIT as unsigned: above every id
    float best_v = 0.0f, best_w = 0.0f, best_det = 1.0f;
    bool found = false;

    while (alive) {
        int2 nd = __ldg(nodes + node);
        // Descend to a leaf, pushing far children that the ray also crosses
        while ((nd.y & KD_PACK_AXIS_MASK) != KD_AXIS_LEAF) {
            if (COUNT) ++num_nodes;
            const int axis = nd.y & KD_PACK_AXIS_MASK;
            const int left = nd.y >> KD_PACK_SHIFT;
            const float o_a = kd_select_axis(ox, oy, oz, axis);
            const float inv_a = kd_select_axis(inv_x, inv_y, inv_z, axis);
            // NaN when the ray lies in the plane: then both tests below fail
            // and both children are visited over the whole interval
            const float ts = __fmul_rn(__fsub_rn(__int_as_float(nd.x), o_a), inv_a);
            const int neg = (neg_mask >> axis) & 1;
            const int first = left + neg;
            const int second = left + (neg ^ 1);
            if (ts > __fadd_rn(tf, t_eps)) {
                node = first;
            } else if (ts < __fsub_rn(tn, t_eps)) {
                node = second;
            } else {
                stack_node[sp] = second;
                stack_tn[sp] = fmaxf(ts, tn);
                stack_tf[sp] = tf;
                ++sp;
                node = first;
                tf = fminf(ts, tf);
            }
            nd = __ldg(nodes + node);
        }
        if (COUNT) ++num_nodes;

        // Test the leaf's triangles against the whole ray interval
        const int count = nd.x;
        const float4* tri = tris + 3 * (long long)(nd.y >> KD_PACK_SHIFT);
        for (int k = 0; k < count; ++k, tri += 3) {
            if (COUNT) ++num_tests;
            const float4 a = __ldg(tri);
            const float4 b = __ldg(tri + 1);
            const float4 c = __ldg(tri + 2);
            float t, ev, ew, det;
            if (kd_hit_triangle(wr, a, b, c, tmin, ANY_HIT ? tmax : best_t, t, ev, ew, det)) {
                const unsigned int id = (unsigned int)__float_as_int(a.w);
                if (ANY_HIT) {
                    found = true;
                    break;
                }
                // equal t: the lowest triangle id wins, as in the brute force
                if (t < best_t || id < best_tri) {
                    best_t = t;
                    best_tri = id;
                    best_v = ev;
                    best_w = ew;
                    best_det = det;
                }
            }
        }
        if (ANY_HIT && found) break;

        // Stop when the closest hit lies before everything still on the stack
        if (!ANY_HIT && best_tri != 0xffffffffu && best_t <= tf) break;
        if (sp == 0) break;
        --sp;
        node = stack_node[sp];
        tn = stack_tn[sp];
        tf = stack_tf[sp];
    }

    if (ANY_HIT) {
        out_tri = found ? 1 : 0;
    } else if (best_tri != 0xffffffffu) {
        out_t = best_t;
        out_tri = (int)best_tri;
        kd_hit_barycentrics(best_v, best_w, best_det, out_u, out_v);
    }
    out_nodes = num_nodes;
    out_tests = num_tests;
}

// Closest hit: t (inf on a miss), triangle id (KD_NO_HIT), barycentrics u, v.
extern "C" __global__ void __launch_bounds__(KD_TRAVERSE_BLOCK)
kd_intersect_closest(const int2* __restrict__ nodes, const float4* __restrict__ tris, float lo_x,
                     float lo_y, float lo_z, float hi_x, float hi_y, float hi_z,
                     const float* __restrict__ origins, const float* __restrict__ directions,
                     const float* __restrict__ ray_tmin, const float* __restrict__ ray_tmax,
                     int num_rays, float* __restrict__ hit_t, int* __restrict__ hit_tri,
                     float* __restrict__ hit_u, float* __restrict__ hit_v) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= num_rays) return;
    float t, u, v;
    int tri, num_nodes, num_tests;
    kd_trace_ray<false, false>(nodes, tris, lo_x, lo_y, lo_z, hi_x, hi_y, hi_z, origins,
                               directions, ray_tmin, ray_tmax, i, t, tri, u, v, num_nodes,
                               num_tests);
    hit_t[i] = t;
    hit_tri[i] = tri;
    hit_u[i] = u;
    hit_v[i] = v;
}

// Any hit: 1 when some triangle is hit with tmin <= t <= tmax, else 0.
extern "C" __global__ void __launch_bounds__(KD_TRAVERSE_BLOCK)
kd_intersect_any(const int2* __restrict__ nodes, const float4* __restrict__ tris, float lo_x,
                 float lo_y, float lo_z, float hi_x, float hi_y, float hi_z,
                 const float* __restrict__ origins, const float* __restrict__ directions,
                 const float* __restrict__ ray_tmin, const float* __restrict__ ray_tmax,
                 int num_rays, unsigned char* __restrict__ hit_any) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= num_rays) return;
    float t, u, v;
    int found, num_nodes, num_tests;
    kd_trace_ray<true, false>(nodes, tris, lo_x, lo_y, lo_z, hi_x, hi_y, hi_z, origins,
                              directions, ray_tmin, ray_tmax, i, t, found, u, v, num_nodes,
                              num_tests);
    hit_any[i] = (unsigned char)found;
}

// Counting variants (benchmarks): the same traversal, plus the nodes visited
// (interior and leaves) and the ray-triangle tests of each ray. Separate
// kernels, so that the ones above carry no counters.
extern "C" __global__ void __launch_bounds__(KD_TRAVERSE_BLOCK)
kd_intersect_closest_counted(const int2* __restrict__ nodes, const float4* __restrict__ tris,
                             float lo_x, float lo_y, float lo_z, float hi_x, float hi_y,
                             float hi_z, const float* __restrict__ origins,
                             const float* __restrict__ directions,
                             const float* __restrict__ ray_tmin,
                             const float* __restrict__ ray_tmax, int num_rays,
                             float* __restrict__ hit_t, int* __restrict__ hit_tri,
                             float* __restrict__ hit_u, float* __restrict__ hit_v,
                             int* __restrict__ ray_nodes, int* __restrict__ ray_tests) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= num_rays) return;
    float t, u, v;
    int tri, num_nodes, num_tests;
    kd_trace_ray<false, true>(nodes, tris, lo_x, lo_y, lo_z, hi_x, hi_y, hi_z, origins,
                              directions, ray_tmin, ray_tmax, i, t, tri, u, v, num_nodes,
                              num_tests);
    hit_t[i] = t;
    hit_tri[i] = tri;
    hit_u[i] = u;
    hit_v[i] = v;
    ray_nodes[i] = num_nodes;
    ray_tests[i] = num_tests;
}

extern "C" __global__ void __launch_bounds__(KD_TRAVERSE_BLOCK)
kd_intersect_any_counted(const int2* __restrict__ nodes, const float4* __restrict__ tris,
                         float lo_x, float lo_y, float lo_z, float hi_x, float hi_y, float hi_z,
                         const float* __restrict__ origins, const float* __restrict__ directions,
                         const float* __restrict__ ray_tmin, const float* __restrict__ ray_tmax,
                         int num_rays, unsigned char* __restrict__ hit_any,
                         int* __restrict__ ray_nodes, int* __restrict__ ray_tests) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= num_rays) return;
    float t, u, v;
    int found, num_nodes, num_tests;
    kd_trace_ray<true, true>(nodes, tris, lo_x, lo_y, lo_z, hi_x, hi_y, hi_z, origins,
                             directions, ray_tmin, ray_tmax, i, t, found, u, v, num_nodes,
                             num_tests);
    hit_any[i] = (unsigned char)found;
    ray_nodes[i] = num_nodes;
    ray_tests[i] = num_tests;
}
