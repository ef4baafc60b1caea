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
//   refs    (num_refs,) int       the leaves' triangles, as rows of tris:
//                                 leaf k's are refs[offset, offset + count)
//   tris    (3 * num_packed,) float4  three vertices per triangle, once each
//                                 however many leaves hold it, in the order of
//                                 their first reference; the first vertex's
//                                 .w holds the triangle id (int bits)
//   KdRays  origins, directions (num_rays, 3) float32; tmin, tmax (num_rays,)
//           float32 or null, then KdTraceParams.tmin / .tmax hold one value
//           for every ray
//   KdTraceParams  the root box, the ray count, the scalar interval, the
//           trace scale (a power of two, kdtree_gpu/trace/gpu.py): the layout
//           holds vertices and split positions times the scale, and every ray
//           is scaled the same way, which leaves t, u and v unchanged.
//   Both structs are generated from kdtree_gpu/trace/soa.py.
//
// Ray checks are part of the launch: a ray with a NaN or infinite origin or
// direction, a zero direction, a NaN tmin or tmax, or tmin > tmax is a miss,
// and when a status record is given the kernel counts such rays and keeps
// the first one (index and kind, encoding.RAY_BAD_*), which the host reads
// with one small copy to name it.
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

// The kind of problem of a ray (encoding.RAY_BAD_*), 0 for a good one.
__device__ __forceinline__ int kd_ray_problem(float ox, float oy, float oz, float dx, float dy,
                                              float dz, float tmin, float tmax)
{
    if (!(isfinite(ox) && isfinite(oy) && isfinite(oz))) return KD_RAY_BAD_ORIGIN;
    if (!(isfinite(dx) && isfinite(dy) && isfinite(dz))) return KD_RAY_BAD_DIRECTION;
    if (dx == 0.0f && dy == 0.0f && dz == 0.0f) return KD_RAY_ZERO_DIRECTION;
    if (isnan(tmin)) return KD_RAY_NAN_TMIN;
    if (isnan(tmax)) return KD_RAY_NAN_TMAX;
    if (tmin > tmax) return KD_RAY_EMPTY_INTERVAL;
    return 0;
}

// status[0]: number of bad rays; status[1]: ~(index << KD_RAY_KIND_BITS | kind)
// of the first one (a maximum of the complement is the minimum, and a record
// of zeros means none).
__device__ __forceinline__ void kd_record_bad_ray(unsigned long long* status, long long i,
                                                  int kind)
{
    atomicAdd(status, 1ull);
    atomicMax(status + 1, ~(((unsigned long long)i << KD_RAY_KIND_BITS) | (unsigned)kind));
}

template <bool ANY_HIT, bool COUNT>
__device__ __forceinline__ void kd_trace_ray(const int2* __restrict__ nodes,
                                             const int* __restrict__ refs,
                                             const float4* __restrict__ tris,
                                             const KdTraceParams& p, const KdRays& rays,
                                             long long i, unsigned long long* status,
                                             float& out_t, int& out_tri, float& out_u,
                                             float& out_v, int& out_nodes, int& out_tests) {
    const float* o = rays.ray_origin + 3 * i;
    const float* d = rays.ray_direction + 3 * i;
    const float tmin = rays.ray_tmin ? __ldg(rays.ray_tmin + i) : p.tmin;
    const float tmax = rays.ray_tmax ? __ldg(rays.ray_tmax + i) : p.tmax;
    // scaling by a power of two is exact: t, u and v are those of the unscaled ray
    const float ox = __fmul_rn(__ldg(o), p.scale), oy = __fmul_rn(__ldg(o + 1), p.scale);
    const float oz = __fmul_rn(__ldg(o + 2), p.scale);
    const float dx = __fmul_rn(__ldg(d), p.scale), dy = __fmul_rn(__ldg(d + 1), p.scale);
    const float dz = __fmul_rn(__ldg(d + 2), p.scale);

    out_t = KD_WT_INF;
    out_tri = KD_NO_HIT;
    out_u = 0.0f;
    out_v = 0.0f;
    out_nodes = 0;
    out_tests = 0;
    // One cheap test lets every good ray through: the sum of six finite
    // values is finite unless it overflows (then the full test below clears
    // the ray), and !(tmin <= tmax) also catches a NaN bound.
    const float sum = __fadd_rn(__fadd_rn(__fadd_rn(ox, oy), __fadd_rn(oz, dx)),
                                __fadd_rn(dy, dz));
    if (!isfinite(sum) || !(tmin <= tmax) || (dx == 0.0f && dy == 0.0f && dz == 0.0f)) {
        const int problem = kd_ray_problem(__ldg(o), __ldg(o + 1), __ldg(o + 2), __ldg(d),
                                           __ldg(d + 1), __ldg(d + 2), tmin, tmax);
        if (problem != 0) {
            if (status) kd_record_bad_ray(status, i, problem);
            return;
        }
    }
    int num_nodes = 0;
    int num_tests = 0;

    // Clip to the root box
    const float inv_x = __fdiv_rn(1.0f, dx);
    const float inv_y = __fdiv_rn(1.0f, dy);
    const float inv_z = __fdiv_rn(1.0f, dz);
    float t0 = tmin, t1 = tmax;
    bool alive = kd_clip_slab(p.lo_x, p.hi_x, ox, inv_x, t0, t1);
    alive &= kd_clip_slab(p.lo_y, p.hi_y, oy, inv_y, t0, t1);
    alive &= kd_clip_slab(p.lo_z, p.hi_z, oz, inv_z, t0, t1);

    const KdWatertightRay wr = kd_setup_watertight(ox, oy, oz, dx, dy, dz);
    // the largest coordinate difference between the origin and the root box,
    // in units of t along the dominant axis, is the scale of every rounding
    // error; explicit roundings (no FMA) keep the CPU traversal's decisions
    const float extent = fmaxf(fmaxf(fmaxf(fabsf(p.lo_x - ox), fabsf(p.hi_x - ox)),
                                     fmaxf(fabsf(p.lo_y - oy), fabsf(p.hi_y - oy))),
                               fmaxf(fabsf(p.lo_z - oz), fabsf(p.hi_z - oz)));
    const float t_eps = __fmul_rn(__fmul_rn(KD_TRAVERSE_EPS, extent), fabsf(wr.sz));
    // a direction whose reciprocal overflows hits nothing
    alive &= (t0 <= __fadd_rn(t1, t_eps)) && fabsf(wr.sz) != KD_WT_INF;

    // bit k set: the ray goes toward -k, so the right child (upper half) comes first
    const int neg_mask = (__float_as_int(dx) < 0 ? 1 : 0) | (__float_as_int(dy) < 0 ? 2 : 0) |
                         (__float_as_int(dz) < 0 ? 4 : 0);

    int stack_node[KD_MAX_DEPTH_CAP];
    float stack_tn[KD_MAX_DEPTH_CAP];
    float stack_tf[KD_MAX_DEPTH_CAP];
    int sp = 0;

    int node = 0;
    float tn = t0, tf = t1;
    KdClosestHit best = kd_no_hit(tmax);
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
                // no tree is deeper than KD_MAX_DEPTH_CAP (SAHConfig caps it),
                // so the stack never overflows; a file that claims otherwise
                // loses the far child rather than memory beyond the stack
                if (sp < KD_MAX_DEPTH_CAP) {
                    stack_node[sp] = second;
                    stack_tn[sp] = fmaxf(ts, tn);
                    stack_tf[sp] = tf;
                    ++sp;
                }
                node = first;
                tf = fminf(ts, tf);
            }
            nd = __ldg(nodes + node);
        }
        if (COUNT) ++num_nodes;

        // Test the leaf's triangles against the whole ray interval. A leaf
        // lists rows of tris (4 bytes a reference) and the vertices are kept
        // once per triangle: a tree holds several references per triangle
        // (6 on the bunny), so per-reference copies of the vertices would make
        // the layout 3-5x larger. Rows follow the leaves' order (kd_pack_layout),
        // so that a leaf's triangles mostly lie side by side as before. The
        // next row is loaded before the current triangle is tested, so its
        // latency overlaps the test. (Leaves marked as runs of consecutive
        // rows, read without the list, measured slower on an H100: 0.91-0.93x
        // for any hit, against 0.94-0.97x for this.)
        const int count = nd.x;
        const int* ref = refs + (nd.y >> KD_PACK_SHIFT);
        int next = count > 0 ? __ldg(ref) : 0;
        for (int k = 0; k < count; ++k) {
            if (COUNT) ++num_tests;
            const int row = next;
            if (k + 1 < count) next = __ldg(ref + k + 1);
            const float4* tri = tris + 3 * (long long)row;
            const float4 a = __ldg(tri);
            const float4 b = __ldg(tri + 1);
            const float4 c = __ldg(tri + 2);
            float t, ev, ew, det;
            if (kd_hit_triangle(wr, a, b, c, tmin, ANY_HIT ? tmax : best.t, t, ev, ew, det)) {
                if (ANY_HIT) {
                    found = true;
                    break;
                }
                kd_keep_closer(best, t, (unsigned int)__float_as_int(a.w), ev, ew, det);
            }
        }
        if (ANY_HIT && found) break;

        // Stop when the closest hit lies before everything still on the stack
        if (!ANY_HIT && best.tri != 0xffffffffu && best.t <= tf) break;
        if (sp == 0) break;
        --sp;
        node = stack_node[sp];
        tn = stack_tn[sp];
        tf = stack_tf[sp];
    }

    if (ANY_HIT) {
        out_tri = found ? 1 : 0;
    } else {
        kd_closest_result(best, out_t, out_tri, out_u, out_v);
    }
    out_nodes = num_nodes;
    out_tests = num_tests;
}

// One kernel for every query: ANY_HIT (occluded: hits.hit_any) or closest
// hit (hits.hit_t, hit_tri, hit_u, hit_v), and with COUNT the nodes visited
// (interior and leaves) and ray-triangle tests of each ray (benchmarks; the
// other instances carry no counters). status may be null: then bad rays are
// misses and nothing is recorded.
template <bool ANY_HIT, bool COUNT>
__global__ void __launch_bounds__(KD_TRAVERSE_BLOCK)
kd_trace(const int2* __restrict__ nodes, const int* __restrict__ refs,
         const float4* __restrict__ tris, KdTraceParams p, KdRays rays, KdHits hits,
         unsigned long long* status) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.num_rays) return;
    float t, u, v;
    int tri, num_nodes, num_tests;
    kd_trace_ray<ANY_HIT, COUNT>(nodes, refs, tris, p, rays, i, status, t, tri, u, v, num_nodes,
                                 num_tests);
    if (ANY_HIT) {
        hits.hit_any[i] = tri > 0 ? 1 : 0;  // tri: 1 hit, 0 none, KD_NO_HIT a bad ray
    } else {
        hits.hit_t[i] = t;
        hits.hit_tri[i] = tri;
        hits.hit_u[i] = u;
        hits.hit_v[i] = v;
    }
    if (COUNT) {
        hits.ray_nodes[i] = num_nodes;
        hits.ray_tests[i] = num_tests;
    }
}

// The four queries (kdtree_gpu/trace/gpu.py looks them up by these names);
// explicit instances, so that nvcc compiles each of them in CI.
template __global__ void kd_trace<false, false>(const int2*, const int*, const float4*,
                                                KdTraceParams, KdRays, KdHits, unsigned long long*);
template __global__ void kd_trace<true, false>(const int2*, const int*, const float4*,
                                               KdTraceParams, KdRays, KdHits, unsigned long long*);
template __global__ void kd_trace<false, true>(const int2*, const int*, const float4*,
                                               KdTraceParams, KdRays, KdHits, unsigned long long*);
template __global__ void kd_trace<true, true>(const int2*, const int*, const float4*,
                                              KdTraceParams, KdRays, KdHits, unsigned long long*);

// --- the traversal layout, packed on the device ------------------------------------

// Three launches and a scan (trace/gpu.py's pack_layout):
//   kd_pack_layout      node i packed (encoding.pack_nodes: split bits times
//                       the trace scale, or the leaf's triangle count;
//                       (child or leaf offset << KD_PACK_SHIFT) | axis), and
//                       first[t] = the lowest reference to triangle t;
//   kd_layout_firsts    first_ref[r] = 1 where reference r is its triangle's first;
//   (inclusive scan of first_ref: row[r] - 1 is the row of such a reference)
//   kd_layout_tris      refs[r] = its triangle's row; a first reference packs the
//                       triangle's vertices (times the scale) into its row.
// Rows in the order of first references put the triangles of a leaf, and of
// leaves written side by side, next to each other in memory.
extern "C" __global__ void kd_pack_layout(KdTreeNodes tree, long long num_nodes, float scale,
                                          const int* __restrict__ leaf_tris, long long num_refs,
                                          int* __restrict__ first, int2* __restrict__ packed_nodes)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < num_nodes) {
        const int axis = tree.node_axis[i];
        int2 out;
        out.x = axis == KD_AXIS_LEAF ? tree.node_count[i]
                                     : __float_as_int(__fmul_rn(tree.node_split[i], scale));
        out.y = (tree.node_child[i] << KD_PACK_SHIFT) | axis;
        packed_nodes[i] = out;
    }
    if (i < num_refs) atomicMin(first + leaf_tris[i], (int)i);
}

extern "C" __global__ void kd_layout_firsts(const int* __restrict__ leaf_tris, long long num_refs,
                                            const int* __restrict__ first,
                                            long long* __restrict__ first_ref)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < num_refs) first_ref[i] = first[leaf_tris[i]] == i ? 1 : 0;
}

extern "C" __global__ void kd_layout_tris(const int* __restrict__ leaf_tris, long long num_refs,
                                          const int* __restrict__ first,
                                          const long long* __restrict__ row,
                                          const float* __restrict__ vertices,
                                          const int* __restrict__ faces, float scale,
                                          int* __restrict__ refs, float4* __restrict__ packed_tris)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= num_refs) return;
    const int t = leaf_tris[i];
    const int f = first[t];
    const long long r = row[f] - 1;
    refs[i] = (int)r;
    if (f != i) return;
    for (int j = 0; j < 3; ++j) {
        const long long v = faces[3 * (long long)t + j];
        float4 out = make_float4(__fmul_rn(vertices[3 * v], scale),
                                 __fmul_rn(vertices[3 * v + 1], scale),
                                 __fmul_rn(vertices[3 * v + 2], scale), 0.0f);
        if (j == 0) out.w = __int_as_float(t);
        packed_tris[3 * r + j] = out;
    }
}
