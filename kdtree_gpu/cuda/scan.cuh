// Block-wide scans of int64 values: the building block of every scan kernel
// (kdtree_gpu.primitives.inclusive_scan on CuPy, and the fused scans of the
// builder's stage kernels and level loop).
#pragma once

// Exclusive scan of one value per thread across a block of BLOCK threads
// (all of them must call it); *total gets the block's sum.
template <int BLOCK = KD_SCAN_BLOCK>
__device__ __forceinline__ long long kd_block_exclusive_scan(long long value, long long* total)
{
    __shared__ long long warp_sums[BLOCK / 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    long long x = value;
    for (int o = 1; o < 32; o <<= 1) {
        long long y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        long long w = lane < BLOCK / 32 ? warp_sums[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            long long y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        if (lane < BLOCK / 32) warp_sums[lane] = w;
    }
    __syncthreads();
    long long warp_prefix = warp > 0 ? warp_sums[warp - 1] : 0;
    *total = warp_sums[BLOCK / 32 - 1];
    __syncthreads();
    return warp_prefix + x - value;
}

// One block of BLOCK threads scans the values load(i) of i in [begin, end),
// in tiles of BLOCK * KD_SCAN_ITEMS, writing carry + the inclusive scan to
// out[i]. Ends with a barrier, so the block may read `out` right after.
template <typename Load, int BLOCK = KD_SCAN_BLOCK>
__device__ __forceinline__ void kd_block_scan_range(Load load, long long begin, long long end,
                                                    long long carry, long long* out)
{
    for (long long tile = begin; tile < end; tile += (long long)BLOCK * KD_SCAN_ITEMS) {
        long long base = tile + (long long)threadIdx.x * KD_SCAN_ITEMS;
        long long v[KD_SCAN_ITEMS];
        long long sum = 0;
        for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
            long long i = base + j;
            v[j] = i < end ? load(i) : 0;
            sum += v[j];
        }
        long long total;
        long long prefix = kd_block_exclusive_scan<BLOCK>(sum, &total) + carry;
        for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
            long long i = base + j;
            prefix += v[j];
            if (i < end) out[i] = prefix;
        }
        carry += total;
    }
    __syncthreads();
}

// One block scans a whole array of n values.
template <typename Load, int BLOCK = KD_SCAN_BLOCK>
__device__ __forceinline__ void kd_block_scan(Load load, long long n, long long* out)
{
    kd_block_scan_range<Load, BLOCK>(load, 0, n, 0, out);
}

struct KdLoadArray {
    const long long* a;
    __device__ long long operator()(long long i) const { return a[i]; }
};
