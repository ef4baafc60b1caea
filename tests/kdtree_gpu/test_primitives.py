"""Primitives: NumPy path against Python-loop oracles; CuPy path against NumPy.

GPU tests: ``python -m pytest tests/kdtree_gpu/test_primitives.py -m gpu -q``.
"""

import numpy as np
import pytest

from kdtree_gpu import primitives as P
from kdtree_gpu.device import gpu_available

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")

SIZES = [0, 1, 255, 256, 257, 1023, 1025, 100003]


def random_offsets(rng, n, num_segments, empty_share=0.3):
    """(num_segments + 1,) int64 boundaries over n elements, some segments empty."""
    if num_segments == 0:
        return np.array([0], dtype=np.int64) if n == 0 else None
    cuts = np.sort(rng.integers(0, n + 1, size=num_segments - 1))
    empties = rng.random(num_segments - 1) < empty_share
    cuts[empties] = np.maximum.accumulate(cuts)[empties]
    return np.concatenate([[0], np.sort(cuts), [n]]).astype(np.int64)


def small_integers(rng, n, low, high, dtype):
    """n integers in [low, high) as dtype (their absolute values for unsigned types)."""
    values = rng.integers(low, high, size=n)
    if np.dtype(dtype).kind == "u":
        values = np.abs(values)
    return values.astype(dtype)


def offsets_cases(rng, n):
    """Named segmentations of n elements: one segment, singletons, random with empties."""
    cases = {
        "one": np.array([0, n], dtype=np.int64),
        "random": random_offsets(rng, n, max(1, n // 7 + 1)),
        "leading_trailing_empty": np.array([0, 0, n, n], dtype=np.int64),
    }
    if n <= 2000:
        cases["singletons"] = np.arange(n + 1, dtype=np.int64)
    return cases


# --- oracles (Python loops) -----------------------------------------------------
def loop_segmented_scan(values, offsets, exclusive):
    out = np.zeros(len(values), dtype=np.float64)
    for s in range(len(offsets) - 1):
        acc = 0.0
        for i in range(offsets[s], offsets[s + 1]):
            if exclusive:
                out[i] = acc
                acc += float(values[i])
            else:
                acc += float(values[i])
                out[i] = acc
    return out


def loop_reduce(values, offsets, op, identity):
    out = []
    for s in range(len(offsets) - 1):
        seg = [values[i].item() for i in range(offsets[s], offsets[s + 1])]
        if not seg:
            out.append(identity)
        else:
            out.append({"sum": sum, "min": min, "max": max}[op](seg))
    return np.array(out)


def loop_argmin(values, offsets):
    out = []
    for s in range(len(offsets) - 1):
        best = -1
        for i in range(offsets[s], offsets[s + 1]):
            if best < 0 or values[i] < values[best]:
                best = i
        out.append(best)
    return np.array(out, dtype=np.int64)


# --- NumPy path against the oracles -------------------------------------------------
@pytest.mark.parametrize("n", [0, 1, 5, 300])
def test_scans_match_loops(n):
    rng = np.random.default_rng(n)
    x = rng.integers(-5, 9, size=n).astype(np.int32)
    excl = P.exclusive_scan(x)
    assert excl.shape == (n + 1,) and excl.dtype == np.int64
    running = 0
    for i in range(n):
        assert excl[i] == running
        running += int(x[i])
    assert excl[n] == running
    incl = P.inclusive_scan(x, dtype=np.int32)
    assert incl.dtype == np.int32
    assert incl.tolist() == [sum(int(v) for v in x[: i + 1]) for i in range(n)]
    flags = rng.random(n) < 0.5
    assert P.exclusive_scan(flags)[-1] == flags.sum()


def test_in_place_scan_overwrites_its_input_and_takes_only_int64():
    x = np.array([3, -1, 0, 7, 2], dtype=np.int64)
    out = P.inclusive_scan_in_place(x)
    assert out is x and x.tolist() == [3, 2, 2, 9, 11]
    with pytest.raises(TypeError, match="int64 array, got dtype int32"):
        P.inclusive_scan_in_place(np.zeros(3, dtype=np.int32))
    with pytest.raises(ValueError, match="one-dimensional"):
        P.inclusive_scan_in_place(np.zeros((2, 2), dtype=np.int64))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64, np.bool_])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("n", [0, 1, 40, 257])
def test_segmented_scan_matches_loop(dtype, exclusive, n):
    rng = np.random.default_rng(7 + n)
    values = (rng.integers(0, 5, size=n) if dtype == np.bool_ else rng.integers(-9, 9, size=n)).astype(dtype)
    for name, offsets in offsets_cases(rng, n).items():
        expected = loop_segmented_scan(values, offsets, exclusive)
        got = P.segmented_scan(values, offsets=offsets, exclusive=exclusive)
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=1e-6, err_msg=name)
        heads = np.zeros(n, dtype=bool)
        heads[offsets[:-1][offsets[:-1] < n]] = True
        got_flags = P.segmented_scan(values, head_flags=heads, exclusive=exclusive)
        np.testing.assert_allclose(got_flags.astype(np.float64), expected, rtol=1e-6, err_msg=name)


def test_segmented_scan_float_segments_are_independent():
    # a huge first segment must not swallow the small sums after it
    values = np.array([1e20, -1e20, 1.0, 2.0, 3.0], dtype=np.float64)
    out = P.segmented_scan(values, offsets=np.array([0, 2, 5]))
    assert out[2:].tolist() == [1.0, 3.0, 6.0]


def test_segmented_scan_rejects_bad_arguments():
    v = np.ones(4)
    with pytest.raises(ValueError, match="exactly one"):
        P.segmented_scan(v)
    with pytest.raises(ValueError, match="exactly one"):
        P.segmented_scan(v, offsets=np.array([0, 4]), head_flags=np.ones(4, bool))
    with pytest.raises(ValueError, match="end at n=4"):
        P.segmented_scan(v, offsets=np.array([0, 3]))
    with pytest.raises(ValueError, match="non-decreasing"):
        P.segmented_scan(v, offsets=np.array([0, 3, 2, 4]))


@pytest.mark.parametrize("op", ["sum", "min", "max"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.float32, np.float64, np.int8])
def test_segmented_reduce_matches_loop(op, dtype):
    rng = np.random.default_rng(3)
    n = 211
    values = small_integers(rng, n, -50, 50, dtype)
    identity = P.segmented._identity(np.dtype(P.scan._scan_dtype(values, None) if op == "sum" else dtype), op)
    for name, offsets in offsets_cases(rng, n).items():
        got = P.segmented_reduce(values, offsets, op)
        expected = loop_reduce(values, offsets, op, identity)
        assert got.shape == (len(offsets) - 1,)
        np.testing.assert_array_equal(got, expected.astype(got.dtype), err_msg=name)


def test_segmented_reduce_identities():
    offsets = np.array([0, 0, 2, 2])
    f = np.array([3.0, -1.0], dtype=np.float32)
    assert P.segmented_reduce(f, offsets, "min").tolist() == [np.inf, -1.0, np.inf]
    assert P.segmented_reduce(f, offsets, "max").tolist() == [-np.inf, 3.0, -np.inf]
    assert P.segmented_reduce(f, offsets, "sum").tolist() == [0.0, 2.0, 0.0]
    i = np.array([3, -1], dtype=np.int32)
    assert P.segmented_reduce(i, offsets, "min").tolist() == [2**31 - 1, -1, 2**31 - 1]
    assert P.segmented_reduce(i, offsets, "max").tolist() == [-(2**31), 3, -(2**31)]
    with pytest.raises(ValueError, match="op must be"):
        P.segmented_reduce(f, offsets, "mean")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_segmented_argmin_matches_loop_with_ties(dtype):
    rng = np.random.default_rng(11)
    n = 500
    values = rng.integers(0, 4, size=n).astype(dtype)  # ties everywhere
    for name, offsets in offsets_cases(rng, n).items():
        got = P.segmented_argmin(values, offsets)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, loop_argmin(values, offsets), err_msg=name)


def test_segmented_argmin_exact_in_float64_and_signed_zero():
    a = 1.0
    b = np.nextafter(1.0, 2.0)  # equal in float32, distinct in float64
    values = np.array([b, a, b, np.inf, np.inf, 0.0, -0.0, -np.inf, 5.0], dtype=np.float64)
    offsets = np.array([0, 3, 3, 5, 7, 9])
    assert P.segmented_argmin(values, offsets).tolist() == [1, -1, 3, 5, 7]


def test_segment_ids_and_binary_search():
    offsets = np.array([0, 0, 2, 2, 5, 5])
    assert P.segment_ids(offsets, 5).tolist() == [1, 1, 3, 3, 3]
    assert P.segment_ids(offsets, 5).dtype == np.int32
    assert P.segment_ids(np.array([0]), 0).shape == (0,)
    s = np.array([1, 3, 3, 3, 7])
    q = np.array([0, 1, 3, 4, 7, 8])
    assert P.lower_bound(s, q).tolist() == [0, 0, 1, 4, 4, 5]
    assert P.upper_bound(s, q).tolist() == [0, 1, 4, 4, 5, 5]


def segmented_search_case(rng, n):
    """Values sorted within random segments (some empty), queries with their segments."""
    offsets = random_offsets(rng, n, max(1, n // 7))
    values = rng.integers(0, 40, size=n).astype(np.uint64)
    for s in range(offsets.size - 1):
        values[offsets[s]:offsets[s + 1]].sort()
    query_segment = rng.integers(0, offsets.size - 1, size=501)
    queries = rng.integers(-1, 42, size=501).clip(0).astype(np.uint64)
    return values, offsets, queries, query_segment


def segmented_lower_bound_loop(values, offsets, queries, query_segment):
    """The oracle: NumPy's searchsorted in each query's segment."""
    return np.array([offsets[s] + np.searchsorted(values[offsets[s]:offsets[s + 1]], q)
                     for q, s in zip(queries, query_segment)], dtype=np.int64)


@pytest.mark.parametrize("n", SIZES[:-1])
def test_segmented_lower_bound_matches_a_search_per_segment(n):
    case = segmented_search_case(np.random.default_rng(n), n)
    expected = segmented_lower_bound_loop(*case)
    np.testing.assert_array_equal(P.segmented_lower_bound(*case), expected)
    # a bound on the longest segment is enough for the bisection
    longest = int(np.diff(case[1]).max())
    np.testing.assert_array_equal(P.segmented_lower_bound(*case, max_length=longest), expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ordered_uint_is_an_order_preserving_bijection(dtype):
    rng = np.random.default_rng(5)
    special = np.array([-np.inf, -1e30, -1.0, -np.finfo(dtype).tiny, -0.0, 0.0,
                        np.finfo(dtype).tiny, 1.0, 1e30, np.inf], dtype=dtype)
    x = np.concatenate([special, rng.standard_normal(1000).astype(dtype)])
    key = P.float_to_ordered_uint(x)
    assert key.dtype == (np.uint32 if dtype == np.float32 else np.uint64)
    back = P.ordered_uint_to_float(key)
    assert back.dtype == dtype
    np.testing.assert_array_equal(back.view(key.dtype), x.view(key.dtype))  # bits, incl. -0.0
    special_keys = P.float_to_ordered_uint(special)
    assert np.all(special_keys[1:] > special_keys[:-1])  # strictly increasing, -0.0 < +0.0
    order = np.argsort(x, kind="stable")
    assert np.all(np.diff(key[order].astype(np.float64)) >= 0) or np.all(key[order][1:] >= key[order][:-1])
    with pytest.raises(TypeError, match="float32 or float64"):
        P.float_to_ordered_uint(np.arange(3))


@pytest.mark.parametrize("dtype", [np.uint32, np.int32, np.int64, np.float32, np.float64])
def test_radix_sort_is_stable(dtype):
    rng = np.random.default_rng(9)
    n = 300
    keys = small_integers(rng, n, -3, 4, dtype)
    payload = np.arange(n)
    extra = rng.random(n)
    keys_sorted, (p_sorted, e_sorted) = P.radix_sort(keys, (payload, extra))
    expected = sorted(range(n), key=lambda i: (keys[i], i))  # Python sort is stable
    assert p_sorted.tolist() == expected
    np.testing.assert_array_equal(keys_sorted, keys[expected])
    np.testing.assert_array_equal(e_sorted, extra[expected])
    k_only = P.radix_sort(keys)
    np.testing.assert_array_equal(k_only, keys_sorted)
    k2, v2 = P.radix_sort(keys, payload)
    assert v2.tolist() == expected


def test_radix_sort_orders_signed_zero():
    keys = np.array([0.0, -0.0, -1.0, 0.0, -0.0], dtype=np.float32)
    k, v = P.radix_sort(keys, np.arange(5))
    assert v.tolist() == [2, 1, 4, 0, 3]
    assert np.signbit(k).tolist() == [True, True, True, False, False]


def test_compact_is_stable():
    rng = np.random.default_rng(1)
    mask = rng.random(100) < 0.4
    a = np.arange(100)
    b = rng.random((100, 3))
    count, (ca, cb) = P.compact(mask, a, b)
    assert count == mask.sum()
    assert ca.tolist() == [i for i in range(100) if mask[i]]
    np.testing.assert_array_equal(cb, b[mask])
    assert P.compact_indices(mask).tolist() == ca.tolist()
    assert P.compact(np.zeros(0, bool), np.zeros(0))[0] == 0
    with pytest.raises(TypeError, match="bool"):
        P.compact_indices(np.ones(3, dtype=np.int32))
    with pytest.raises(ValueError, match="rows"):
        P.compact(mask, np.arange(5))


# --- CuPy path against NumPy -----------------------------------------------------------
@gpu
@needs_gpu
@pytest.mark.parametrize("n", SIZES)
def test_gpu_scans(n):
    import cupy

    rng = np.random.default_rng(100 + n)
    x = rng.integers(-5, 9, size=n).astype(np.int32)
    np.testing.assert_array_equal(P.exclusive_scan(cupy.asarray(x)).get(), P.exclusive_scan(x))
    np.testing.assert_array_equal(P.inclusive_scan(cupy.asarray(x)).get(), P.inclusive_scan(x))
    np.testing.assert_array_equal(P.exclusive_scan(cupy.asarray(x), dtype=np.int32).get(),
                                  P.exclusive_scan(x, dtype=np.int32))
    f = rng.random(n).astype(np.float32)
    np.testing.assert_allclose(P.exclusive_scan(cupy.asarray(f)).get(), P.exclusive_scan(f), rtol=1e-4)


@gpu
@needs_gpu
@pytest.mark.parametrize("n", [(1 << 20) - 1, (1 << 20) + 7, 3_000_017])
def test_gpu_large_in_place_scans_of_packed_flags(n):
    # from CUB_MIN_ITEMS on, in-place scans take CUB's single pass: the
    # staged levels' flag scans (two counts per int64) and the leaf packing
    import cupy

    assert P.scan.CUB_MIN_ITEMS == 1 << 20  # (the sizes above straddle it)
    rng = np.random.default_rng(n)
    x = (rng.integers(0, 2, n) | (rng.integers(0, 3, n) << 32)).astype(np.int64)
    d = cupy.asarray(x)
    assert P.inclusive_scan_in_place(d) is d
    np.testing.assert_array_equal(d.get(), np.cumsum(x))
    np.testing.assert_array_equal(P.inclusive_scan(cupy.asarray(x)).get(), np.cumsum(x))


@gpu
@needs_gpu
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("exclusive", [False, True])
def test_gpu_segmented_scan(n, exclusive):
    import cupy

    rng = np.random.default_rng(200 + n)
    ints = rng.integers(-9, 9, size=n).astype(np.int32)
    floats = rng.random(n)
    for name, offsets in offsets_cases(rng, n).items():
        d_off = cupy.asarray(offsets)
        np.testing.assert_array_equal(
            P.segmented_scan(cupy.asarray(ints), offsets=d_off, exclusive=exclusive).get(),
            P.segmented_scan(ints, offsets=offsets, exclusive=exclusive), err_msg=name)
        np.testing.assert_allclose(
            P.segmented_scan(cupy.asarray(floats), offsets=d_off, exclusive=exclusive).get(),
            P.segmented_scan(floats, offsets=offsets, exclusive=exclusive), rtol=1e-12, err_msg=name)


@gpu
@needs_gpu
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.float32, np.float64])
def test_gpu_segmented_reduce_and_argmin(n, dtype):
    import cupy

    rng = np.random.default_rng(300 + n)
    if np.dtype(dtype).kind == "f":
        values = rng.standard_normal(n).astype(dtype)
        if n:
            values[rng.random(n) < 0.05] = np.inf
            values[rng.random(n) < 0.05] = -0.0
            values[rng.random(n) < 0.05] = 0.0
            values[-1] = -1e30  # the last element holds a minimum: a skipped tail fails
    else:
        values = rng.integers(0, 1000, size=n).astype(dtype)
        if n:
            values[-1] = 0
    d_values = cupy.asarray(values)
    for name, offsets in offsets_cases(rng, n).items():
        d_off = cupy.asarray(offsets)
        for op in ("min", "max"):
            got = P.segmented_reduce(d_values, d_off, op).get()
            np.testing.assert_array_equal(got, P.segmented_reduce(values, offsets, op), err_msg=f"{name} {op}")
        got_sum = P.segmented_reduce(d_values, d_off, "sum").get()
        want_sum = P.segmented_reduce(values, offsets, "sum")
        if np.dtype(dtype).kind == "f":
            np.testing.assert_allclose(got_sum, want_sum, rtol=1e-4, err_msg=name)
        else:
            np.testing.assert_array_equal(got_sum, want_sum, err_msg=name)
        np.testing.assert_array_equal(P.segmented_argmin(d_values, d_off).get(),
                                      P.segmented_argmin(values, offsets), err_msg=name)


@gpu
@needs_gpu
def test_gpu_segmented_argmin_ties_and_float64_exactness():
    import cupy

    rng = np.random.default_rng(4)
    n = 100003
    base = np.float64(1.0)
    values = np.where(rng.random(n) < 0.5, base, np.nextafter(base, 2.0))  # one float32 value
    values[rng.random(n) < 0.1] = np.inf
    for offsets in (np.array([0, n]), random_offsets(rng, n, 997), np.arange(n + 1)):
        got = P.segmented_argmin(cupy.asarray(values), cupy.asarray(offsets)).get()
        np.testing.assert_array_equal(got, P.segmented_argmin(values, offsets))
    ties = np.zeros(n)
    ties[rng.random(n) < 0.5] = -0.0  # -0.0 ties with +0.0: the lowest index wins
    offsets = random_offsets(rng, n, 50)
    expected = P.segmented_argmin(ties, offsets)
    assert expected[offsets[1:] > offsets[:-1]].tolist() == offsets[:-1][offsets[1:] > offsets[:-1]].tolist()
    for _ in range(3):  # same answer run after run
        got = P.segmented_argmin(cupy.asarray(ties), cupy.asarray(offsets)).get()
        np.testing.assert_array_equal(got, expected)


@gpu
@needs_gpu
@pytest.mark.parametrize("n", SIZES)
def test_gpu_segment_ids_search_order_sort_compact(n):
    import cupy

    rng = np.random.default_rng(400 + n)
    for name, offsets in offsets_cases(rng, n).items():
        np.testing.assert_array_equal(P.segment_ids(cupy.asarray(offsets), n).get(),
                                      P.segment_ids(offsets, n), err_msg=name)
    s = np.sort(rng.integers(0, 50, size=n))
    q = rng.integers(-1, 52, size=777)
    np.testing.assert_array_equal(P.lower_bound(cupy.asarray(s), cupy.asarray(q)).get(), P.lower_bound(s, q))
    np.testing.assert_array_equal(P.upper_bound(cupy.asarray(s), cupy.asarray(q)).get(), P.upper_bound(s, q))
    case = segmented_search_case(rng, n)
    np.testing.assert_array_equal(P.segmented_lower_bound(*(cupy.asarray(a) for a in case)).get(),
                                  segmented_lower_bound_loop(*case))
    for dtype in (np.float32, np.float64):
        x = rng.standard_normal(n).astype(dtype)
        if n:
            x[rng.random(n) < 0.1] = -0.0
            x[rng.random(n) < 0.1] = 0.0
            x[rng.random(n) < 0.05] = np.inf
        k = P.float_to_ordered_uint(cupy.asarray(x))
        np.testing.assert_array_equal(k.get(), P.float_to_ordered_uint(x))
        np.testing.assert_array_equal(P.ordered_uint_to_float(k).get().view(k.dtype), x.view(k.dtype))
        keys = np.round(x * 3).astype(dtype)  # many ties
        ks, vs = P.radix_sort(cupy.asarray(keys), (cupy.arange(n), cupy.asarray(x)))
        hks, (hv, hx) = P.radix_sort(keys, (np.arange(n), x))
        np.testing.assert_array_equal(ks.get().view(k.dtype), hks.view(k.dtype))
        np.testing.assert_array_equal(vs[0].get(), hv)
        np.testing.assert_array_equal(vs[1].get(), hx)
    ikeys = rng.integers(-3, 3, size=n).astype(np.int64)
    np.testing.assert_array_equal(P.radix_sort(cupy.asarray(ikeys), cupy.arange(n))[1].get(),
                                  P.radix_sort(ikeys, np.arange(n))[1])
    mask = rng.random(n) < 0.3
    a = rng.integers(0, 100, size=(n, 2))
    count, (ca,) = P.compact(cupy.asarray(mask), cupy.asarray(a))
    hcount, (hca,) = P.compact(mask, a)
    assert count == hcount
    np.testing.assert_array_equal(ca.get(), hca)


@gpu
@needs_gpu
@pytest.mark.slow
def test_gpu_large_2_27():
    import cupy

    n = 1 << 27
    rng = cupy.random.default_rng(0)
    values = rng.random(n, dtype=cupy.float64)
    values[-1] = -1.0  # minimum at the very last element
    offsets = cupy.asarray(np.array([0, n // 3, n // 3, n - 1, n], dtype=np.int64))
    idx = P.segmented_argmin(values, offsets).get()
    h_values = values.get()
    h_offsets = offsets.get()
    np.testing.assert_array_equal(idx, P.segmented_argmin(h_values, h_offsets))
    assert idx[-1] == n - 1
    flags = (rng.random(n) < 0.5)
    excl = P.exclusive_scan(flags, dtype=np.int64)
    assert int(excl[-1]) == int(flags.sum())
    keys = rng.integers(0, 1 << 20, size=n, dtype=cupy.int64).astype(cupy.uint32)
    ks, order = P.radix_sort(keys, cupy.arange(n, dtype=cupy.int32))
    assert bool(cupy.all(ks[1:] >= ks[:-1]))
    same = ks[1:] == ks[:-1]
    assert bool(cupy.all(order[1:][same] > order[:-1][same]))  # stable
    np.testing.assert_array_equal(P.segmented_reduce(values, offsets, "min").get(),
                                  P.segmented_reduce(h_values, h_offsets, "min"))
