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
