"""python benchmarks/probe_scan_cub.py (PYTHONPATH=.): the int64 in-place scan's two
paths on packed flag values (two counts per item, as the staged levels' flag scans):
the package's three launches against CUB's single pass (cupy.cuda.cub.cub_scan, which
``inclusive_scan_in_place`` takes from ``scan.CUB_MIN_ITEMS`` items on); checks both
against NumPy. CUDA events, median of 10 after 2 warm-up rounds."""
import statistics

import cupy
import numpy as np
from cupy.cuda import cub

from kdtree_gpu.primitives import inclusive_scan_in_place
from kdtree_gpu.primitives import scan as scan_module

rng = np.random.default_rng(1)
scan_module.CUB_MIN_ITEMS = 1 << 62  # "three launches": the package's own kernels
for n in (1 << 20, 8 << 20, 32 << 20, 60 << 20):
    host = (rng.integers(0, 2, n) | (rng.integers(0, 2, n) << 32)).astype(np.int64)
    ref = np.cumsum(host)
    x = cupy.asarray(host)
    times = {"three launches": [], "cub": []}
    for r in range(12):
        for name in times:
            x.set(host)
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            a.record()
            if name == "cub":
                assert cub.cub_scan(x, cub.CUPY_CUB_CUMSUM) is not None
            else:
                inclusive_scan_in_place(x)
            b.record()
            b.synchronize()
            if r >= 2:
                times[name].append(cupy.cuda.get_elapsed_time(a, b))
            assert np.array_equal(x.get(), ref), name
    ms = {k: statistics.median(v) for k, v in times.items()}
    print(f"n={n:>10,}  " + "  ".join(
        f"{k} {v:.3f} ms ({16 * n / v / 1e6:.0f} GB/s)" for k, v in ms.items()) + "  equal",
        flush=True)
