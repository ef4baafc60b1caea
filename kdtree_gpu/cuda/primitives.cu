// Segmented min / max / argmin over order-preserving unsigned keys.
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
