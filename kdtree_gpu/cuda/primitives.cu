// Parallel primitives of kdtree_gpu/primitives.py that have no exact CuPy
// built-in: the int64 inclusive scan (three launches, or one for small arrays),
// the segmented min / max / argmin over order-preserving unsigned keys, and
// the binary search within segments.
#include "common.cuh"
#include "scan.cuh"

// --- segmented min / max / argmin ------------------------------------------------
//
// Values are turned into unsigned keys whose unsigned order is the values'
// order (kdtree_gpu.primitives.float_to_ordered_uint for floats, a flipped
// sign bit for signed integers), so one native integer atomic gives an exact
// minimum for float32 and float64 alike. CuPy's atomicMin(double*) goes
// through fminf and would round float64 to float32.
//
// Every kernel handles item i = blockIdx.x * blockDim.x + threadIdx.x < n,
// launched through kdtree_gpu.launch.launch. segment[i] is the segment of
// item i (kdtree_gpu.primitives.segment_ids). The outputs start at the
// identity (all ones for min, 0 for max, LLONG_MAX for an index).

// Read the current value first: once a segment's minimum has settled, most
// threads see that they cannot improve it and skip the atomic.
#define KD_ATOMIC_MIN_IF_LESS(T, dst, k) \
    do { if ((k) < *((volatile T*)(dst))) atomicMin((dst), (k)); } while (0)
#define KD_ATOMIC_MAX_IF_GREATER(T, dst, k) \
    do { if ((k) > *((volatile T*)(dst))) atomicMax((dst), (k)); } while (0)

extern "C" __global__ void kd_segmented_min_u32(const unsigned int* key, const int* segment,
                                                long long n, unsigned int* segment_key)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    KD_ATOMIC_MIN_IF_LESS(unsigned int, segment_key + segment[i], key[i]);
}

extern "C" __global__ void kd_segmented_max_u32(const unsigned int* key, const int* segment,
                                                long long n, unsigned int* segment_key)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    KD_ATOMIC_MAX_IF_GREATER(unsigned int, segment_key + segment[i], key[i]);
}

extern "C" __global__ void kd_segmented_min_u64(const unsigned long long* key, const int* segment,
                                                long long n, unsigned long long* segment_key)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    KD_ATOMIC_MIN_IF_LESS(unsigned long long, segment_key + segment[i], key[i]);
}

extern "C" __global__ void kd_segmented_max_u64(const unsigned long long* key, const int* segment,
                                                long long n, unsigned long long* segment_key)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    KD_ATOMIC_MAX_IF_GREATER(unsigned long long, segment_key + segment[i], key[i]);
}

// Second pass of the argmin: among the items whose key equals their segment's
// minimum, keep the lowest index (min is order-independent: deterministic).
extern "C" __global__ void kd_segmented_argmin_u32(const unsigned int* key, const int* segment,
                                                   long long n, const unsigned int* segment_min,
                                                   long long* segment_index)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int s = segment[i];
    if (key[i] == segment_min[s]) KD_ATOMIC_MIN_IF_LESS(long long, segment_index + s, i);
}

extern "C" __global__ void kd_segmented_argmin_u64(const unsigned long long* key, const int* segment,
                                                   long long n, const unsigned long long* segment_min,
                                                   long long* segment_index)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int s = segment[i];
    if (key[i] == segment_min[s]) KD_ATOMIC_MIN_IF_LESS(long long, segment_index + s, i);
}

// --- inclusive scan of int64 -----------------------------------------------------
// Tiles of KD_SCAN_TILE items: per-tile sums, a scan of the tile sums in one
// block, then each tile scans itself starting from its prefix (scan.cuh's
// three passes). No temporary allocation besides the tile sums; CuPy's cumsum
// gives the same numbers with more host work per call, which dominates the
// builder's small levels.
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_scan_tile_sums(const long long* __restrict__ in, long long n, long long* __restrict__ tile_sum)
{
    kd_scan_tile_sum(KdLoadArray{in}, n, tile_sum);
}

extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_scan_tile_prefix(long long* __restrict__ tile_sum, long long num_tiles)
{
    kd_scan_tile_prefixes(tile_sum, num_tiles);
}

// `out` may be `in` (a thread reads its items before the block's barriers and
// writes only them after): no __restrict__ on either.
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_scan_tiles(const long long* in, long long n,
              const long long* __restrict__ tile_prefix, long long* out)
{
    kd_scan_tile(KdLoadArray{in}, n, tile_prefix, out);
}

// Small arrays: one block scans a whole array, one launch instead of three
// (the builder's small levels are bound by launch overhead, not by the scan).
// The output may be the input (kd_block_scan_range reads a tile before writing it).
extern "C" __global__ void __launch_bounds__(KD_SCAN_BLOCK)
kd_scan_small(const long long* in, long long n, long long* out)
{
    kd_block_scan(KdLoadArray{in}, n, out);
}

// --- segmented lower bound ------------------------------------------------------
//
// kdtree_gpu.primitives.segmented_lower_bound on the GPU: query q searches
// values[offsets[s]:offsets[s + 1]] (ascending) for s = query_segment[q] and
// gets the first index whose value is >= its key (offsets[s + 1] if none).
extern "C" __global__ void kd_segmented_lower_bound_u64(const unsigned long long* values,
                                                        const long long* offsets,
                                                        const unsigned long long* queries,
                                                        const long long* query_segment,
                                                        long long num_queries, long long* out)
{
    long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= num_queries) return;
    long long s = query_segment[q];
    out[q] = kd_lower_bound(values, offsets[s], offsets[s + 1], queries[q]);
}
