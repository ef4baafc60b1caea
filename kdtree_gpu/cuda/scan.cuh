// Block-wide scans of int64 values: the building block of every scan kernel
// (kdtree_gpu.primitives.inclusive_scan on CuPy, and the fused scans of the
// builder's stage kernels and level loop).
#pragma once

// x's inclusive scan over the lanes of a warp (every lane calls it).
template <typename T>
__device__ __forceinline__ T kd_warp_inclusive_scan(T x)
{
    const int lane = threadIdx.x & 31;
    for (int o = 1; o < 32; o <<= 1) {
        const T y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    return x;
}

// Exclusive scan of one value per thread across a block of BLOCK threads
// (all of them must call it); *total gets the block's sum.
template <int BLOCK = KD_SCAN_BLOCK>
__device__ __forceinline__ long long kd_block_exclusive_scan(long long value, long long* total)
{
    __shared__ long long warp_sums[BLOCK / 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long x = kd_warp_inclusive_scan(value);
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        const long long w = kd_warp_inclusive_scan(lane < BLOCK / 32 ? warp_sums[lane] : 0);
        if (lane < BLOCK / 32) warp_sums[lane] = w;
    }
    __syncthreads();
    long long warp_prefix = warp > 0 ? warp_sums[warp - 1] : 0;
    *total = warp_sums[BLOCK / 32 - 1];
    __syncthreads();
    return warp_prefix + x - value;
}

// One block of BLOCK threads scans the values load(i) of i in [begin, end),
// in tiles of BLOCK * KD_SCAN_ITEMS, storing carry + the inclusive scan of i
// with store(i, value) (out[i] = value for an array). Ends with a barrier, so
// the block may read what it stored right after.
template <typename Load, int BLOCK = KD_SCAN_BLOCK, typename Store>
__device__ __forceinline__ void kd_block_scan_range(Load load, long long begin, long long end,
                                                    long long carry, Store store)
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
            if (i < end) store(i, prefix);
        }
        carry += total;
    }
    __syncthreads();
}

template <typename Load, int BLOCK = KD_SCAN_BLOCK>
__device__ __forceinline__ void kd_block_scan_range(Load load, long long begin, long long end,
                                                    long long carry, long long* out)
{
    kd_block_scan_range<Load, BLOCK>(load, begin, end, carry,
                                     [out](long long i, long long value) { out[i] = value; });
}

// The first step of a warp-striped tile scan (kd_scan_tile,
// kd_block_scan_flags_local, build_stages.cuh's kd_event_lr_tile): from the
// sum of each lane's items, the sum of the block's warps before this one, in
// every lane; *total gets the block's sum. Every thread of the block calls it.
template <int BLOCK = KD_SCAN_BLOCK, typename T>
__device__ __forceinline__ T kd_block_warp_prefix(T sum, long long* total)
{
    const unsigned full = 0xffffffffu;
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(full, sum, o);
    // lane 0 carries its warp's total: its exclusive scan is the warps' before it
    const T prefix =
        (T)kd_block_exclusive_scan<BLOCK>((threadIdx.x & 31) == 0 ? (long long)sum : 0, total);
    return __shfl_sync(full, prefix, 0);
}

// The rounds of a warp-striped tile scan: lane l of a warp holds v[j], item
// base + 32 j (base: the warp's first item plus l); each round scans 32
// consecutive items across the lanes and stores carry plus each one's
// inclusive scan with store(j, i, value) where i < end. Every lane calls it.
// Returns carry plus the warp's items' sum.
template <typename T, typename Store>
__device__ __forceinline__ T kd_warp_scan_rounds(const T (&v)[KD_SCAN_ITEMS], long long base,
                                                 long long end, T carry, Store store)
{
    const unsigned full = 0xffffffffu;
    for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
        const T x = kd_warp_inclusive_scan(v[j]);
        const long long i = base + 32 * j;
        if (i < end) store(j, i, carry + x);
        carry += __shfl_sync(full, x, 31);
    }
    return carry;
}

// Packed (low, high << 32) counts of at most 0xffff each as one 32-bit word
// (high << 16 | low), and back: the counts of a scan since the start of its
// chunk or tile, where every item adds at most 1 to each count.
__device__ __forceinline__ unsigned int kd_lr16(long long f)
{
    return (unsigned int)(KD_HIGH(f) << 16 | KD_LOW(f));
}

__device__ __forceinline__ long long kd_lr64(unsigned int v)
{
    return ((long long)(v >> 16) << 32) + (v & 0xffffu);
}

// A scan of packed (low, high << 32) counts, read as whole int64 values.
// Stored whole (one int64 per item), or in half the bytes where every item
// adds at most 1 to each count (the level loop's flag scans): the counts
// since the start of the item's chunk, 16 bits each (kd_block_scan_flags_local),
// beside the scan's value before each chunk. Chunks hold `chunk` items, at
// most KD_SCAN_CHUNK_MAX, so that a count fits in 16 bits.
struct KdPackedScan {
    const long long* whole = nullptr;
    const unsigned int* local = nullptr;
    const long long* chunk_base = nullptr;
    unsigned int chunk = 1;

    KdPackedScan() = default;
    __device__ KdPackedScan(const long long* w) : whole(w) {}
    __device__ KdPackedScan(const unsigned int* l, const long long* b, long long c)
        : local(l), chunk_base(b), chunk((unsigned int)c) {}

    __device__ __forceinline__ long long operator[](long long i) const
    {
        if (whole) return whole[i];
        // (the items of a chunked scan number fewer than 2**32)
        return chunk_base[(unsigned int)i / chunk] + kd_lr64(local[i]);
    }
};

// The chunked form of KdPackedScan, written: one block of BLOCK threads
// scans the flags load(i) (each adds 0 or 1 to each count) of its chunk
// [begin, end), of at most KD_SCAN_CHUNK_MAX items, into local[i], the counts
// since begin, 16 bits each. The counts are scanned as such 32-bit words
// (half the registers and shuffles of int64 values). Each warp scans
// 32 * KD_SCAN_ITEMS consecutive items of a tile, 32 at a time, as
// kd_scan_tile does, so that every load and store of a warp covers
// consecutive items: with kd_block_scan_range's consecutive items a thread,
// a warp's 4-byte stores were 32 bytes apart (H100, conference: the level
// loop's open/close scan took 0.84 ms of the loop's 7.8, its sums 0.21;
// 0.34 ms this way).
// Ends with a barrier; returns the chunk's sum (16-bit counts, as local's).
template <typename Load, int BLOCK>
__device__ __forceinline__ unsigned int kd_block_scan_flags_local(Load load, long long begin,
                                                                  long long end,
                                                                  unsigned int* local)
{
    const int lane = threadIdx.x & 31;
    unsigned int carry = 0;
    for (long long tile = begin; tile < end; tile += (long long)BLOCK * KD_SCAN_ITEMS) {
        const long long base = tile + (long long)(threadIdx.x >> 5) * 32 * KD_SCAN_ITEMS + lane;
        unsigned int v[KD_SCAN_ITEMS];
        unsigned int sum = 0;
        for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
            const long long i = base + 32 * j;
            const long long f = i < end ? load(i) : 0;
            v[j] = kd_lr16(f);
            sum += v[j];
        }
        long long total;
        const unsigned int prefix = kd_block_warp_prefix<BLOCK>(sum, &total) + carry;
        kd_warp_scan_rounds(v, base, end, prefix,
                            [local](int, long long i, unsigned int value) { local[i] = value; });
        carry += (unsigned int)total;
    }
    __syncthreads();
    return carry;
}

// The first of the ascending values v[lo, hi) that is not below key (hi if
// none), found by the BLOCK threads of a block together: each round tests
// BLOCK evenly spaced values at once, so that about log(hi - lo) / log(BLOCK)
// dependent loads replace one thread's log2(hi - lo). Every thread calls it
// and gets the answer.
template <int BLOCK = KD_SCAN_BLOCK>
__device__ __forceinline__ long long kd_block_lower_bound(const long long* v, long long lo,
                                                          long long hi, long long key)
{
    // the answer lies in [lo, hi]: v[hi] is not below key, or hi is the end
    while (lo < hi) {
        const long long step = (hi - lo + BLOCK - 1) / BLOCK;
        const long long p = lo + threadIdx.x * step;
        // the values below key are a prefix of the samples: count them
        const int below = __syncthreads_count(p < hi && v[p] < key);
        if (below == 0) return lo;
        lo += (below - 1) * step + 1;
        hi = min(hi, lo - 1 + step);
    }
    return lo;
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

// The three-launch scan of n values load(i) (kdtree_gpu.primitives'
// inclusive scan of an array, and the builder's scans of flags it derives as
// it loads them: nothing is stored before the scan), in tiles of
// KD_SCAN_TILE items, one block of KD_SCAN_BLOCK threads a tile.
// Pass 1: each tile's sum into tile_sum[tile].
template <typename Load>
__device__ __forceinline__ void kd_scan_tile_sum(Load load, long long n, long long* tile_sum)
{
    long long base = (long long)blockIdx.x * KD_SCAN_TILE;
    long long sum = 0;
    for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
        long long i = base + (long long)j * KD_SCAN_BLOCK + threadIdx.x;
        if (i < n) sum += load(i);
    }
    long long total;
    kd_block_exclusive_scan(sum, &total);
    if (threadIdx.x == 0) tile_sum[blockIdx.x] = total;
}

// Pass 2: one block scans the tile sums in place into exclusive tile
// prefixes, KD_SCAN_ITEMS consecutive sums a thread per round. (With one sum a
// thread, a round's block scan and barriers came every 256 sums: H100, 5.5M
// triangles, about 45 us a level for the 30k tiles of 60M events.)
__device__ __forceinline__ void kd_scan_tile_prefixes(long long* tile_sum, long long num_tiles)
{
    long long carry = 0;
    for (long long base = 0; base < num_tiles; base += KD_SCAN_TILE) {
        const long long first = base + (long long)threadIdx.x * KD_SCAN_ITEMS;
        long long v[KD_SCAN_ITEMS];
        long long sum = 0;
        for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
            v[j] = first + j < num_tiles ? tile_sum[first + j] : 0;
            sum += v[j];
        }
        long long total;
        long long ex = kd_block_exclusive_scan(sum, &total) + carry;
        for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
            if (first + j < num_tiles) tile_sum[first + j] = ex;
            ex += v[j];
        }
        carry += total;
    }
}

// Pass 3: each tile's inclusive scan from its prefix into out. Each warp
// scans 32 * KD_SCAN_ITEMS consecutive items of its tile, 32 at a time: every
// load and store of a warp covers consecutive items. (With each thread
// scanning KD_SCAN_ITEMS consecutive items, a warp's accesses were 64 bytes
// apart: H100, 32M items, 1.25 TB/s, against 3 TB/s for a copy.) Every item
// is loaded before the block's barriers and stored after them, so out may be
// what load reads.
template <typename Load>
__device__ __forceinline__ void kd_scan_tile(Load load, long long n,
                                             const long long* __restrict__ tile_prefix,
                                             long long* out)
{
    const int lane = threadIdx.x & 31;
    long long base = (long long)blockIdx.x * KD_SCAN_TILE
                     + (long long)(threadIdx.x >> 5) * 32 * KD_SCAN_ITEMS + lane;
    long long v[KD_SCAN_ITEMS];
    long long sum = 0;
    for (int j = 0; j < KD_SCAN_ITEMS; ++j) {
        long long i = base + 32 * j;
        v[j] = i < n ? load(i) : 0;
        sum += v[j];
    }
    long long total;
    const long long carry = kd_block_warp_prefix(sum, &total) + tile_prefix[blockIdx.x];
    kd_warp_scan_rounds(v, base, n, carry,
                        [out](int, long long i, long long value) { out[i] = value; });
}
