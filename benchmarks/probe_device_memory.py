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

Then what a pool given back at every build's end would pay at the next build (the bar of
400 B per triangle, and nothing held after a build):
5. per size, 16 MB to 4 GB: cudaMalloc + cudaFree (best of 3, GPU idle); a fresh pool's
   first allocation with a synchronize (mapping); freeAsync, synchronize and trim to 0
   (unmapping); an allocation and freeAsync after that trim (mapping again);
6. 1 GB asked as 64 and as 8 parts of a fresh pool (host, and with a synchronize);
7. a pool growing behind a ~20 ms kernel: does the host wait?
8. reuse beside a live block: 200 MB and 100 MB live, the 200 MB freed, 250 MB asked;
   then the 100 MB freed and 300 MB asked (the pool's reserved MB after each);
9. 400 random requests of 1-64 MB, 45% of the steps freeing one: the most live against
   the pool's reserved high-water mark.

Prints one line per measurement (host times: median of 5 unless said, ``time.perf_counter``).
"""
import random
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


# 5. mapping and unmapping apart, up to 4 GB
print("size MB | cudaMalloc+cudaFree ms | pool mapping ms | pool unmapping ms | mapping again ms",
      flush=True)
for size in (16 * MB, 64 * MB, 256 * MB, 1024 * MB, 4096 * MB):
    pair = min(ms(lambda: rt.free(rt.malloc(size)), repeats=1) for _ in range(3))
    pool = make_pool()
    cupy.cuda.Device().synchronize()
    t = time.perf_counter()
    p = rt.mallocFromPoolAsync(size, pool, stream)
    cupy.cuda.runtime.streamSynchronize(stream)
    mapping = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    rt.freeAsync(p, stream)
    cupy.cuda.runtime.streamSynchronize(stream)
    rt.memPoolTrimTo(pool, 0)
    unmapping = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    rt.freeAsync(rt.mallocFromPoolAsync(size, pool, stream), stream)
    again = (time.perf_counter() - t) * 1e3
    cupy.cuda.Device().synchronize()
    rt.memPoolTrimTo(pool, 0)
    rt.memPoolDestroy(pool)
    print(f"{size // MB} | {pair:.3f} | {mapping:.3f} | {unmapping:.3f} | {again:.3f}", flush=True)

# 6. 1 GB in parts
for parts in (64, 8):
    pool = make_pool()
    cupy.cuda.Device().synchronize()
    t = time.perf_counter()
    blocks = [rt.mallocFromPoolAsync(1024 * MB // parts, pool, stream) for _ in range(parts)]
    host = (time.perf_counter() - t) * 1e3
    cupy.cuda.runtime.streamSynchronize(stream)
    synced = (time.perf_counter() - t) * 1e3
    for p in blocks:
        rt.freeAsync(p, stream)
    cupy.cuda.Device().synchronize()
    rt.memPoolTrimTo(pool, 0)
    rt.memPoolDestroy(pool)
    print(f"1 GB as {parts} parts: host {host:.3f} ms, with a synchronize {synced:.3f} ms",
          flush=True)

# 7. a pool growing behind a kernel
pool = make_pool()
spin(20)
t = time.perf_counter()
p = rt.mallocFromPoolAsync(256 * MB, pool, stream)
grow = (time.perf_counter() - t) * 1e3
t = time.perf_counter()
rt.freeAsync(p, stream)
queued = (time.perf_counter() - t) * 1e3
t = time.perf_counter()
p = rt.mallocFromPoolAsync(300 * MB, pool, stream)
larger = (time.perf_counter() - t) * 1e3
print(f"behind a ~20 ms kernel: 256 MB (the pool grows) {grow:.3f} ms, freeAsync {queued:.3f} ms, "
      f"then 300 MB {larger:.3f} ms; the pool holds {reserved(pool)} MB", flush=True)
rt.freeAsync(p, stream)
cupy.cuda.Device().synchronize()
rt.memPoolTrimTo(pool, 0)

# 8. reuse beside a live block
a = rt.mallocFromPoolAsync(200 * MB, pool, stream)
b = rt.mallocFromPoolAsync(100 * MB, pool, stream)
rt.freeAsync(a, stream)
c = rt.mallocFromPoolAsync(250 * MB, pool, stream)
first = reserved(pool)
rt.freeAsync(b, stream)
d = rt.mallocFromPoolAsync(300 * MB, pool, stream)
print(f"200 and 100 MB live, the 200 freed, 250 asked: the pool holds {first} MB for 350 live; "
      f"the 100 freed, 300 asked: {reserved(pool)} MB for 550", flush=True)
for p in (c, d):
    rt.freeAsync(p, stream)
cupy.cuda.Device().synchronize()
rt.memPoolTrimTo(pool, 0)

# 9. random requests
random.seed(1)
live, most, now = [], 0, 0
for _ in range(400):
    if live and random.random() < 0.45:
        p, size = live.pop(random.randrange(len(live)))
        rt.freeAsync(p, stream)
        now -= size
    else:
        size = random.randint(1, 64) * MB
        live.append((rt.mallocFromPoolAsync(size, pool, stream), size))
        now += size
        most = max(most, now)
high = int(rt.memPoolGetAttribute(pool, rt.cudaMemPoolAttrReservedMemHigh)) // MB
print(f"400 random requests of 1-64 MB: at most {most // MB} MB live, the pool held {high} MB "
      f"at most", flush=True)
for p, _ in live:
    rt.freeAsync(p, stream)
cupy.cuda.Device().synchronize()
rt.memPoolTrimTo(pool, 0)
rt.memPoolDestroy(pool)
