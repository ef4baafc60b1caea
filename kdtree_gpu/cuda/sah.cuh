// The SAH cost model of kdtree_gpu/config.py, written once for CUDA.
//
// Every operation rounds to nearest with an explicit intrinsic, so the
// compiler cannot fuse a multiply and an add into an FMA: the costs then
// equal, bit for bit, the float64 costs of the NumPy and numba builders, and
// all builders pick the same plane even where two planes nearly tie.
#pragma once

// Half surface area (dx*dy + dy*dz) + dz*dx, in this order.
__device__ __forceinline__ double kd_half_area(double dx, double dy, double dz)
{
    return __dadd_rn(__dadd_rn(__dmul_rn(dx, dy), __dmul_rn(dy, dz)), __dmul_rn(dz, dx));
}

// lambda * (K_T + K_I * (A_L * N_L + A_R * N_R) / A), lambda = empty_bonus if a side is empty.
__device__ __forceinline__ double kd_split_cost(double k_traversal, double k_intersect,
                                                double empty_bonus, double area_left,
                                                double area_right, double area_node,
                                                long long n_left, long long n_right)
{
    double weighted = __dadd_rn(__dmul_rn(area_left, (double)n_left),
                                __dmul_rn(area_right, (double)n_right));
    double cost = __dadd_rn(k_traversal, __dmul_rn(k_intersect, __ddiv_rn(weighted, area_node)));
    if (n_left == 0 || n_right == 0) cost = __dmul_rn(cost, empty_bonus);
    return cost;
}

// The cost of the plane at p on `axis` of a node box (ext: its float64
// extents, area: its half area) with n_left references below p, n_planar
// in it and n_right above, the planar ones on the cheaper side (rule R7):
// *side is KD_SIDE_LEFT when that side costs no more than the right.
__device__ __forceinline__ double kd_plane_cost(const double* ext, double area, int axis,
                                                float lo_k, float hi_k, float p,
                                                long long n_left, long long n_planar,
                                                long long n_right, double k_traversal,
                                                double k_intersect, double empty_bonus, int* side)
{
    // selects, not an indexed store: with an axis known only at run time an
    // indexed array would live in local memory
    const double left = __dsub_rn((double)p, (double)lo_k);
    const double right = __dsub_rn((double)hi_k, (double)p);
    double ext_l[3], ext_r[3];
#pragma unroll
    for (int k = 0; k < 3; ++k) {
        ext_l[k] = k == axis ? left : ext[k];
        ext_r[k] = k == axis ? right : ext[k];
    }
    double area_l = kd_half_area(ext_l[0], ext_l[1], ext_l[2]);
    double area_r = kd_half_area(ext_r[0], ext_r[1], ext_r[2]);
    double cost_l = kd_split_cost(k_traversal, k_intersect, empty_bonus, area_l, area_r, area,
                                  n_left + n_planar, n_right);
    // (without planar references both sides are the same sum: one division, not two)
    double cost_r = n_planar == 0 ? cost_l
                                  : kd_split_cost(k_traversal, k_intersect, empty_bonus, area_l,
                                                  area_r, area, n_left, n_right + n_planar);
    *side = cost_l <= cost_r ? KD_SIDE_LEFT : KD_SIDE_RIGHT;
    return cost_l <= cost_r ? cost_l : cost_r;
}
