"""python benchmarks/probe_device_memory.py: what the build's device allocations cost the host,
and whether a stream-ordered pool (cudaMallocFromPoolAsync) would let it free without waiting.

The workspace (``builder/gpu/workspace.py``) gives its blocks back with cudaFree between
phases, so that the next phase's blocks do not sit beside them (the peak bar), and cudaFree
waits for every queued kernel. A stream-ordered pool frees in stream order instead, and a
later allocation on the same stream may take the freed range. This probe measures, on one
GPU:

1. cudaMalloc + cudaFree of 16 MB to 1 GB (host ms, idle GPU), and the same from a
   dedicated pool: the first allocation (the pool maps memory), and again after a free
   (the pool hands the range back);
2. cudaFree of an unrelated block while a ~20 ms kernel runs: how long the host waits;
   and freeAsync in the same situation;
3. with the pool keeping what is freed (release threshold at its maximum): whether a
   200 MB allocation after two 100 MB frees on the same stream takes their ranges (the
   pool's reserved bytes), and whether three 60 MB allocations take one 200 MB range;
4. whether memPoolTrimTo gives back a range whose free is still queued behind a kernel.

Prints one line per measurement (host times: median of 5, ``time.perf_counter``).
"""
import statistics
import time

import cupy
from cupy.cuda import runtime as rt

MB = 1 << 20
SPIN = cupy.RawKernel(r"""
extern "C" __global__ void spin(long long cycles, int* out) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = 1;
}""", "spin")


def ms(f, repeats=5):
    times = []
    for _ in range(repeats):
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def spin(milliseconds):
    """Queue a kernel that runs about ``milliseconds`` (one block; the clock rate)."""
    rate = rt.deviceGetAttribute(rt.cudaDevAttrClockRate, cupy.cuda.Device().id)  # kHz
    SPIN((1,), (32,), (cupy.int64(int(milliseconds * rate)), FLAG))


def make_pool(keep_all=True):
    props = rt.MemPoolProps(rt.cudaMemAllocationTypePinned, rt.cudaMemHandleTypeNone,
                            rt.cudaMemLocationTypeDevice, cupy.cuda.Device().id)
    pool = rt.memPoolCreate(props)
    if keep_all:
        rt.memPoolSetAttribute(pool, rt.cudaMemPoolAttrReleaseThreshold, (1 << 64) - 1)
    return pool


def reserved(pool):
    return int(rt.memPoolGetAttribute(pool, rt.cudaMemPoolAttrReservedMemCurrent)) // MB


FLAG = cupy.zeros(1, dtype=cupy.int32)
stream = cupy.cuda.get_current_stream().ptr
print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), flush=True)

# 1. the host cost of an allocation and its free, GPU idle
for size in (16 * MB, 256 * MB, 1024 * MB):
    def sync_pair():
        rt.free(rt.malloc(size))
    pool = make_pool()
    first = []

    def pooled_first():
        p = rt.mallocFromPoolAsync(size, pool, stream)
        rt.freeAsync(p, stream)
        cupy.cuda.Device().synchronize()
        rt.memPoolTrimTo(pool, 0)  # (the next one maps memory again)
    first = ms(pooled_first)
    p = rt.mallocFromPoolAsync(size, pool, stream)
    rt.freeAsync(p, stream)

    def pooled_again():
        rt.freeAsync(rt.mallocFromPoolAsync(size, pool, stream), stream)
    again = ms(pooled_again)
    print(f"{size // MB:>5} MB: cudaMalloc+cudaFree {ms(sync_pair):.3f} ms; pool, mapping "
          f"{first:.3f} ms (with a synchronize and a trim); pool, reused {again:.4f} ms",
          flush=True)
    cupy.cuda.Device().synchronize()
    rt.memPoolDestroy(pool)

# 2. a free while a kernel runs
block = rt.malloc(64 * MB)
spin(20)
t = time.perf_counter()
rt.free(block)
wait = (time.perf_counter() - t) * 1e3
pool = make_pool()
block = rt.mallocFromPoolAsync(64 * MB, pool, stream)
cupy.cuda.Device().synchronize()
spin(20)
t = time.perf_counter()
rt.freeAsync(block, stream)
queued = (time.perf_counter() - t) * 1e3
cupy.cuda.Device().synchronize()
print(f"free while a 20 ms kernel runs: cudaFree waits {wait:.2f} ms, freeAsync returns "
      f"in {queued:.3f} ms", flush=True)

# 3. ranges taken again in stream order (the pool keeps what is freed)
rt.memPoolTrimTo(pool, 0)
a = rt.mallocFromPoolAsync(100 * MB, pool, stream)
b = rt.mallocFromPoolAsync(100 * MB, pool, stream)
before = reserved(pool)
spin(20)  # (the frees are still queued when the next allocations are made)
rt.freeAsync(a, stream)
rt.freeAsync(b, stream)
c = rt.mallocFromPoolAsync(200 * MB, pool, stream)
after = reserved(pool)
rt.freeAsync(c, stream)
small = [rt.mallocFromPoolAsync(60 * MB, pool, stream) for _ in range(3)]
split = reserved(pool)
for p in small:
    rt.freeAsync(p, stream)
print(f"two 100 MB blocks: pool holds {before} MB; freed in stream order, then 200 MB "
      f"asked: {after} MB; freed, then three of 60 MB: {split} MB", flush=True)

# 4. a trim while the frees wait behind a kernel
cupy.cuda.Device().synchronize()
rt.memPoolTrimTo(pool, 0)
p = rt.mallocFromPoolAsync(256 * MB, pool, stream)
spin(20)
rt.freeAsync(p, stream)
rt.memPoolTrimTo(pool, 0)
pending = reserved(pool)
cupy.cuda.Device().synchronize()
rt.memPoolTrimTo(pool, 0)
print(f"256 MB freed behind a 20 ms kernel: trimmed at once {pending} MB held; after a "
      f"synchronize and a trim {reserved(pool)} MB", flush=True)
rt.memPoolDestroy(pool)
