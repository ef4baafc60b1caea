"""python benchmarks/probe_pool_mapping.py: what a stream-ordered pool costs when it maps and
unmaps memory, against cudaMalloc and cudaFree, and whether it reuses freed ranges for a
larger request. The question behind it: could the build's workspace give its blocks back
with freeAsync (no wait for queued kernels) and still give everything back when the build
ends (``probe_device_memory.py`` measured the waits; this one the mapping that a pool given
back at every build's end pays at the next build).

Prints, on one GPU (host times with ``time.perf_counter``):
1. per size (16 MB to 4 GB): cudaMalloc + cudaFree (best of 3, GPU idle); a fresh pool's
   first allocation with a synchronize (mapping); freeAsync, synchronize and trim to 0
   (unmapping); an allocation and freeAsync again after that trim (mapping once more);
2. 1 GB asked as 64 and as 8 parts of a fresh pool;
3. a pool growing behind a ~20 ms kernel (does the host wait?);
4. reuse: 200 MB and 100 MB live, the 200 MB freed, then 250 MB asked; then the 100 MB
   freed and 300 MB asked (reserved bytes after each);
5. 400 random allocations and frees of 1-64 MB (45% frees): the most live against the
   pool's reserved high-water mark.
"""
import time, cupy as cp, numpy as np
R = cp.cuda.runtime
dev = cp.cuda.Device()
s = cp.cuda.get_current_stream()
def new_pool():
    props = R.MemPoolProps(R.cudaMemAllocationTypePinned if hasattr(R,'cudaMemAllocationTypePinned') else 1,
                           R.cudaMemHandleTypeNone if hasattr(R,'cudaMemHandleTypeNone') else 0,
                           R.cudaMemLocationTypeDevice if hasattr(R,'cudaMemLocationTypeDevice') else 1, dev.id)
    p = R.memPoolCreate(props)
    R.memPoolSetAttribute(p, R.cudaMemPoolAttrReleaseThreshold, 2**63)
    return p
def reserved(p): return R.memPoolGetAttribute(p, R.cudaMemPoolAttrReservedMemCurrent)
spin = cp.RawKernel(r'''extern "C" __global__ void spin(long long n){long long t=clock64(); while(clock64()-t<n);}''', 'spin')
spin((1,),(1,),(np.int64(1000),)); dev.synchronize()
MB = 1 << 20
print("size MB | cudaMalloc+free ms | pool map (alloc+sync) ms | pool free+sync+trim ms | pool alloc again ms")
for mb in [16, 64, 256, 1024, 4096]:
    n = mb * MB
    ts = []
    for _ in range(3):
        dev.synchronize(); t = time.perf_counter(); ptr = R.malloc(n); R.free(ptr); ts.append(time.perf_counter() - t)
    a = min(ts)
    p = new_pool()
    dev.synchronize(); t = time.perf_counter(); ptr = R.mallocFromPoolAsync(n, p, s.ptr); s.synchronize(); b = time.perf_counter() - t
    t = time.perf_counter(); R.freeAsync(ptr, s.ptr); s.synchronize(); R.memPoolTrimTo(p, 0); c = time.perf_counter() - t
    t = time.perf_counter(); ptr = R.mallocFromPoolAsync(n, p, s.ptr); R.freeAsync(ptr, s.ptr); d = time.perf_counter() - t
    s.synchronize(); R.memPoolTrimTo(p, 0); R.memPoolDestroy(p)
    print(f"{mb} | {a*1e3:.3f} | {b*1e3:.3f} | {c*1e3:.3f} | {d*1e3:.3f}")
# many chunks: 1 GB as 64 x 16 MB in a fresh pool, and as 8 x 128 MB
for parts in (64, 8):
    p = new_pool(); dev.synchronize(); t = time.perf_counter()
    ptrs = [R.mallocFromPoolAsync(1024 * MB // parts, p, s.ptr) for _ in range(parts)]
    h = time.perf_counter() - t; s.synchronize(); w = time.perf_counter() - t
    for q in ptrs: R.freeAsync(q, s.ptr)
    s.synchronize(); R.memPoolTrimTo(p, 0); R.memPoolDestroy(p)
    print(f"1 GB as {parts} parts: host {h*1e3:.3f} ms, synced {w*1e3:.3f} ms")
# host wait while the GPU is busy: grow the pool behind a 20 ms kernel
p = new_pool()
spin((1,),(1,),(np.int64(40_000_000),))
t = time.perf_counter(); ptr = R.mallocFromPoolAsync(256 * MB, p, s.ptr); h = time.perf_counter() - t
t = time.perf_counter(); R.freeAsync(ptr, s.ptr); f = time.perf_counter() - t
t = time.perf_counter(); ptr = R.mallocFromPoolAsync(300 * MB, p, s.ptr); g = time.perf_counter() - t
print(f"behind a ~20 ms kernel: alloc 256 MB (grows) host {h*1e3:.3f} ms, freeAsync {f*1e3:.3f} ms, alloc 300 MB after it {g*1e3:.3f} ms, reserved {reserved(p)/MB:.0f} MB")
R.freeAsync(ptr, s.ptr); s.synchronize(); R.memPoolTrimTo(p, 0)
# reuse pattern: a 200 MB, b 100 MB, free a, c 250 MB, free b, d 300 MB
dev.synchronize()
a = R.mallocFromPoolAsync(200*MB, p, s.ptr); b = R.mallocFromPoolAsync(100*MB, p, s.ptr)
R.freeAsync(a, s.ptr); c = R.mallocFromPoolAsync(250*MB, p, s.ptr); r1 = reserved(p)
R.freeAsync(b, s.ptr); d = R.mallocFromPoolAsync(300*MB, p, s.ptr); r2 = reserved(p)
print(f"reuse: after a200,b100,free a,c250: reserved {r1/MB:.0f} MB (live 350); after free b, d300: {r2/MB:.0f} MB (live 550)")
R.freeAsync(c, s.ptr); R.freeAsync(d, s.ptr); s.synchronize(); R.memPoolTrimTo(p, 0)
# many small: 200 allocations of 1-8 MB alternating frees
import random; random.seed(1); live = []; mx = 0; cur = 0
for i in range(400):
    if live and random.random() < 0.45:
        q, n = live.pop(random.randrange(len(live))); R.freeAsync(q, s.ptr); cur -= n
    else:
        n = random.randint(1, 64) * MB; live.append((R.mallocFromPoolAsync(n, p, s.ptr), n)); cur += n; mx = max(mx, cur)
print(f"random 1-64 MB: max live {mx/MB:.0f} MB, reserved high {R.memPoolGetAttribute(p, R.cudaMemPoolAttrReservedMemHigh)/MB:.0f} MB")
for q, n in live: R.freeAsync(q, s.ptr)
s.synchronize(); R.memPoolTrimTo(p, 0); R.memPoolDestroy(p)
