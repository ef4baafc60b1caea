"""Time each CuPy primitive with CUDA events at 1M, 16M and 128M elements.

Usage (on a GPU machine)::

    python benchmarks/bench_primitives.py [--sizes 1M,16M,128M] [--repeats 5]
                                          [--out benchmarks/results/primitives.json]

Each case runs once to warm up (compilation, memory pool), then ``repeats``
times between CUDA events; the median is reported. Inputs are made once per
size. A case that fails (e.g. out of memory) is recorded with its error and
the run goes on. Prints a table and writes one JSON document with device,
commit and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kdtree_gpu import primitives as P  # noqa: E402
from kdtree_gpu.device import device_memory_info, require_gpu  # noqa: E402


def parse_size(text):
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def time_case(fn, repeats):
    """Median and min time (ms) of ``fn()`` between CUDA events, after one warm-up."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _common import gpu_time_ms

    median, times = gpu_time_ms(fn, repeats, warmup=1)
    return median, min(times)


def make_cases(n, rng):
    """(name, function) pairs over inputs of n elements."""
    import cupy

    ints = rng.integers(0, 8, size=n, dtype=cupy.int32)
    flags = ints < 3
    f32 = rng.random(n, dtype=cupy.float32)
    f64 = rng.random(n, dtype=cupy.float64)
    keys_u32 = rng.integers(0, 1 << 30, size=n, dtype=cupy.int64).astype(cupy.uint32)
    payload = cupy.arange(n, dtype=cupy.int32)
    # segments of about 64 elements (many small nodes) and 1 segment (the root)
    num_segments = max(1, n // 64)
    offsets_many = cupy.linspace(0, n, num_segments + 1).astype(cupy.int64)
    offsets_one = cupy.asarray(np.array([0, n], dtype=np.int64))
    sorted_u32 = cupy.sort(keys_u32)
    queries = keys_u32[: max(1, n // 8)]
    return [
        ("exclusive_scan int32->int64", lambda: P.exclusive_scan(ints)),
        ("exclusive_scan bool->int32", lambda: P.exclusive_scan(flags, dtype=np.int32)),
        ("inclusive_scan int32->int64", lambda: P.inclusive_scan(ints)),
        ("segmented_scan int32 (64/seg)", lambda: P.segmented_scan(ints, offsets=offsets_many)),
        ("segmented_reduce sum int32 (64/seg)", lambda: P.segmented_reduce(ints, offsets_many, "sum")),
        ("segmented_reduce min float64 (64/seg)", lambda: P.segmented_reduce(f64, offsets_many, "min")),
        ("segmented_reduce min float64 (1 seg)", lambda: P.segmented_reduce(f64, offsets_one, "min")),
        ("segmented_argmin float64 (64/seg)", lambda: P.segmented_argmin(f64, offsets_many)),
        ("segmented_argmin float64 (1 seg)", lambda: P.segmented_argmin(f64, offsets_one)),
        ("segmented_argmin float32 (64/seg)", lambda: P.segmented_argmin(f32, offsets_many)),
        ("segment_ids (64/seg)", lambda: P.segment_ids(offsets_many, n)),
        ("lower_bound uint32 (n/8 queries)", lambda: P.lower_bound(sorted_u32, queries)),
        ("float_to_ordered_uint float32", lambda: P.float_to_ordered_uint(f32)),
        ("radix_sort uint32 + int32 values", lambda: P.radix_sort(keys_u32, payload)),
        ("radix_sort float32 keys", lambda: P.radix_sort(f32)),
        ("compact 3 int32 arrays (37%)", lambda: P.compact(flags, ints, payload, keys_u32)),
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,16M,128M")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "primitives.json"))
    parser.add_argument("--only", default="", help="run only cases whose name contains this text")
    args = parser.parse_args(argv)
    try:
        require_gpu("bench_primitives.py")
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 2
    import cupy

    info = device_memory_info()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _common import git_commit

    commit = git_commit()
    results = []
    print(f"device: {info['name']}  commit: {commit}")
    print(f"{'case':<42} {'n':>11} {'median ms':>10} {'min ms':>9} {'Gelem/s':>8}")
    for size_text in args.sizes.split(","):
        n = parse_size(size_text)
        rng = cupy.random.default_rng(0)
        try:
            cases = make_cases(n, rng)
        except cupy.cuda.memory.OutOfMemoryError as exc:
            print(f"size {n}: out of memory making inputs ({exc})")
            results.append({"n": n, "case": "inputs", "error": str(exc)})
            continue
        for name, fn in cases:
            if args.only and args.only not in name:
                continue
            record = {"case": name, "n": n}
            try:
                median, best = time_case(fn, args.repeats)
                record.update(median_ms=median, min_ms=best, repeats=args.repeats,
                              gelem_per_s=n / (median * 1e6) if median > 0 else None)
                print(f"{name:<42} {n:>11d} {median:>10.3f} {best:>9.3f} {n / (median * 1e6):>8.2f}")
            except Exception as exc:  # one failing case must not lose the others
                record["error"] = f"{type(exc).__name__}: {exc}"
                print(f"{name:<42} {n:>11d} failed: {record['error'][:80]}")
            results.append(record)
        del cases
        cupy.get_default_memory_pool().free_all_blocks()
    document = {
        "benchmark": "primitives",
        "device": info["name"],
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cupy": cupy.__version__,
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
