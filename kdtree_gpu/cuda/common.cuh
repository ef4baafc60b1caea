// Small helpers shared by every CUDA source of the package.
//
// The KD_* constants come from the generated define block
// (kdtree_gpu/encoding.py); nothing here repeats a number defined there.
#pragma once

// Thread index of a 1-D launch (kdtree_gpu.launch.launch: thread i handles item i).
__device__ __forceinline__ long long kd_tid()
{
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

// Packed pairs of 32-bit counts in one int64: low | high << 32.
#define KD_LOW(x) ((long long)((unsigned long long)(x) & 0xffffffffull))
#define KD_HIGH(x) ((long long)((unsigned long long)(x) >> 32))

// The order-preserving key of a float32 (the CUDA twin of
// kdtree_gpu.primitives.float_to_ordered_uint): positive floats get their
// sign bit set, negative floats have every bit flipped, so unsigned order is
// float order. Integer atomics and radix sorts then work on floats.
__device__ __forceinline__ unsigned int kd_ordered_bits32(float x)
{
    unsigned int u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The first index in [lo, hi) whose value is not below key (hi if none), in
// values ascending there: the binary search of every lower bound on the device
// (kdtree_gpu.primitives.lower_bound and segmented_lower_bound).
// below(i) says whether item i is below the key (false from some index on).
template <typename Below>
__device__ __forceinline__ long long kd_lower_bound_if(long long lo, long long hi, Below below)
{
    while (lo < hi) {
        long long mid = lo + (hi - lo) / 2;
        if (below(mid)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

template <typename T>
__device__ __forceinline__ long long kd_lower_bound(const T* values, long long lo, long long hi,
                                                    T key)
{
    return kd_lower_bound_if(lo, hi, [&](long long i) { return values[i] < key; });
}

// Inverse of kd_ordered_bits32 (kdtree_gpu.primitives.ordered_uint_to_float).
__device__ __forceinline__ float kd_float_from_ordered_bits32(unsigned int bits)
{
    return __uint_as_float((bits & 0x80000000u) ? (bits & 0x7fffffffu) : ~bits);
}
