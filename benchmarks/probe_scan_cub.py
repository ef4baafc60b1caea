"""python benchmarks/probe_scan_cub.py (PYTHONPATH=.): next lead for the staged levels' scans: CUB's single-pass scan (decoupled look-back, in place)
against kdtree_gpu's three-launch scan, on packed int64 flag values; checks equality."""
import sys, statistics
import cupy, numpy as np
from cupy.cuda import cub
from kdtree_gpu.primitives import inclusive_scan_in_place
rng = np.random.default_rng(1)
for n in (1 << 20, 8 << 20, 32 << 20, 60 << 20):
    host = (rng.integers(0, 2, n) | (rng.integers(0, 2, n) << 32)).astype(np.int64)
    ref = np.cumsum(host)
    x = cupy.asarray(host)
    T = {"ours": [], "cub": []}
    for r in range(12):
        for name in ("ours", "cub"):
            x.set(host)
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            a.record()
            if name == "ours":
                inclusive_scan_in_place(x)
            else:
                assert cub.cub_scan(x, cub.CUPY_CUB_CUMSUM) is not None
            b.record(); b.synchronize()
            if r >= 2: T[name].append(cupy.cuda.get_elapsed_time(a, b))
            assert np.array_equal(x.get(), ref), name
    ms = {k: statistics.median(v) for k, v in T.items()}
    print(f"n={n:>10,}  ours {ms['ours']:.3f} ms ({16 * n / ms['ours'] / 1e6:.0f} GB/s)  "
          f"cub {ms['cub']:.3f} ms ({16 * n / ms['cub'] / 1e6:.0f} GB/s)  equal", flush=True)
