"""Parallel primitives of the level-by-level builder, for CuPy and NumPy.

Every function takes CuPy or NumPy arrays and returns arrays of the same
kind (``xp = get_xp(...)``); the NumPy path is the CPU fallback and the test
oracle of the CuPy path. CuPy built-ins (CUB/Thrust scans, sorts, binary
searches, ``nonzero``) come first; the custom kernels in
``kdtree_gpu/cuda/primitives.cu`` cover what has no exact built-in: the
segmented min / max / argmin (CuPy's ``atomicMin(double*)`` rounds through
float32).

Segments
--------
Segments are given by ``offsets : (num_segments + 1,)`` with ``offsets[0] ==
0``, ``offsets[-1] == n`` and ``offsets`` non-decreasing: segment ``s`` is
``values[offsets[s]:offsets[s + 1]]``; empty segments are allowed. The NumPy
path checks these conditions; the CuPy path checks only shapes (a check of
the contents would read device memory, a synchronization).

Synchronization
---------------
Only :func:`compact` and :func:`compact_indices` read from the device (the
count that sizes their output). Everything else is launched asynchronously.
"""

from __future__ import annotations

import numpy as np

from .arrays import get_xp
from .launch import launch, stage

REDUCE_OPS = ("sum", "min", "max")

# (float dtype, unsigned dtype of the same width, sign bit)
_FLOAT_UINT = {
    np.dtype(np.float32): (np.dtype(np.uint32), np.uint32(1 << 31)),
    np.dtype(np.float64): (np.dtype(np.uint64), np.uint64(1 << 63)),
}


# --- scans ---------------------------------------------------------------------
def _scan_dtype(x, dtype):
    if dtype is not None:
        return np.dtype(dtype)
    kind = x.dtype.kind
    if kind == "b" or kind == "i":
        return np.dtype(np.int64)
    if kind == "u":
        return np.dtype(np.uint64)
    return x.dtype


def _check_1d(name, a):
    if a.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {a.shape}")


def exclusive_scan(x, dtype=None):
    """Exclusive prefix sum with the total appended.

    Parameters
    ----------
    x : (n,) bool, int, uint or float
    dtype : dtype, optional
        Accumulation and output dtype. Default: int64 for bool and signed
        ints, uint64 for unsigned ints, ``x.dtype`` for floats.

    Returns
    -------
    out : (n + 1,) dtype
        ``out[0] = 0``, ``out[i] = x[0] + ... + x[i-1]``, ``out[n]`` = total;
        the sum of ``x[a:b]`` is ``out[b] - out[a]``.
    """
    xp = get_xp(x)
    _check_1d("x", x)
    dtype = _scan_dtype(x, dtype)
    out = xp.empty(x.shape[0] + 1, dtype=dtype)
    out[0] = 0
    if x.shape[0]:
        xp.cumsum(x, dtype=dtype, out=out[1:])
    return out


def inclusive_scan(x, dtype=None):
    """Inclusive prefix sum.

    Parameters
    ----------
    x : (n,) bool, int, uint or float
    dtype : dtype, optional
        As in :func:`exclusive_scan`.

    Returns
    -------
    out : (n,) dtype
        ``out[i] = x[0] + ... + x[i]``.
    """
    xp = get_xp(x)
    _check_1d("x", x)
    return xp.cumsum(x, dtype=_scan_dtype(x, dtype))


def _check_offsets(offsets, n):
    _check_1d("offsets", offsets)
    if offsets.shape[0] < 1:
        raise ValueError("offsets must have num_segments + 1 >= 1 entries, got an empty array")
    if offsets.dtype.kind not in "iu":
        raise TypeError(f"offsets must be an integer array, got dtype {offsets.dtype}")
    if isinstance(offsets, np.ndarray):
        if offsets[0] != 0 or offsets[-1] != n:
            raise ValueError(f"offsets must start at 0 and end at n={n}, "
                             f"got {int(offsets[0])} .. {int(offsets[-1])}")
        if offsets.shape[0] > 1 and np.any(offsets[1:] < offsets[:-1]):
            raise ValueError("offsets must be non-decreasing")


def _heads_from_offsets(xp, offsets, n):
    # Empty segments share their start with the next segment; any of them
    # marks the same head, and a start at n (trailing empties) marks nothing.
    heads = xp.zeros(n + 1, dtype=bool)
    heads[offsets[:-1]] = True
    return heads[:n]


def segmented_scan(values, *, offsets=None, head_flags=None, exclusive=False, dtype=None):
    """Prefix sums that restart at every segment.

    Parameters
    ----------
    values : (n,) bool, int, uint or float
    offsets : (num_segments + 1,) int, optional
        Segment boundaries (see the module notes). Exactly one of
        ``offsets`` and ``head_flags`` is given.
    head_flags : (n,) bool, optional
        ``True`` at the first element of each segment (element 0 always
        starts a segment).
    exclusive : bool
        ``False``: ``out[i]`` includes ``values[i]``; ``True``: it does not
        (0 at each segment's first element).
    dtype : dtype, optional
        As in :func:`exclusive_scan`.

    Returns
    -------
    out : (n,) dtype

    Notes
    -----
    Integers: a global scan minus the scan at each segment's start (exact).
    Floats: a log-step (Hillis-Steele) segmented scan, so no segment's sum
    is disturbed by the rounding of the others; the summation order differs
    from a sequential loop, results agree to rounding.
    """
    xp = get_xp(values, offsets, head_flags)
    _check_1d("values", values)
    if (offsets is None) == (head_flags is None):
        raise ValueError("segmented_scan needs exactly one of offsets= and head_flags=")
    n = values.shape[0]
    dtype = _scan_dtype(values, dtype)
    if offsets is not None:
        _check_offsets(offsets, n)
        heads = _heads_from_offsets(xp, offsets, n)
    else:
        _check_1d("head_flags", head_flags)
        if head_flags.shape[0] != n:
            raise ValueError(f"head_flags has {head_flags.shape[0]} entries, values has {n}")
        heads = head_flags.astype(bool, copy=True)
    if n == 0:
        return xp.zeros(0, dtype=dtype)
    heads[0] = True
    if dtype.kind in "iub":
        # sum up to i minus sum before the segment start (exact in integers)
        incl = xp.cumsum(values, dtype=dtype)
        seg = xp.cumsum(heads, dtype=np.int64) - 1
        starts = xp.nonzero(heads)[0]
        base = incl[starts] - values[starts].astype(dtype)
        out = incl - base[seg]
        if exclusive:
            out -= values.astype(dtype)
        return out
    out = values.astype(dtype, copy=True)
    flags = heads.copy()
    step = 1
    while step < n:
        add = xp.where(flags[step:], dtype.type(0), out[:-step])
        new_out = out.copy()
        new_out[step:] += add
        new_flags = flags.copy()
        new_flags[step:] |= flags[:-step]
        out, flags = new_out, new_flags
        step *= 2
    if exclusive:
        shifted = xp.zeros_like(out)
        shifted[1:] = out[:-1]
        out = xp.where(heads, dtype.type(0), shifted)
    return out


# --- segment ids and binary search -----------------------------------------------
def segment_ids(offsets, n):
    """Segment index of every element.

    Parameters
    ----------
    offsets : (num_segments + 1,) int
        Segment boundaries; empty segments allowed.
    n : int
        Number of elements (``offsets[-1]``), a host integer.

    Returns
    -------
    segment : (n,) int32
        ``segment[i] = s`` with ``offsets[s] <= i < offsets[s + 1]``.
    """
    xp = get_xp(offsets)
    _check_offsets(offsets, n)
    if offsets.shape[0] > np.iinfo(np.int32).max:
        raise ValueError(f"too many segments for int32 segment ids: {offsets.shape[0] - 1}")
    index = xp.arange(n, dtype=offsets.dtype)
    # the last boundary <= i is the start of i's segment (after any empty ones)
    return (xp.searchsorted(offsets, index, side="right") - 1).astype(np.int32)


def lower_bound(sorted_values, queries):
    """First position where each query could be inserted keeping the order.

    Parameters
    ----------
    sorted_values : (m,) ascending
    queries : (q,) same kind

    Returns
    -------
    index : (q,) int64
        Smallest ``j`` with ``sorted_values[j] >= query`` (``m`` if none).
    """
    xp = get_xp(sorted_values, queries)
    _check_1d("sorted_values", sorted_values)
    return xp.searchsorted(sorted_values, queries, side="left").astype(np.int64, copy=False)


def upper_bound(sorted_values, queries):
    """Last position where each query could be inserted keeping the order.

    Parameters
    ----------
    sorted_values : (m,) ascending
    queries : (q,) same kind

    Returns
    -------
    index : (q,) int64
        Smallest ``j`` with ``sorted_values[j] > query`` (``m`` if none).
    """
    xp = get_xp(sorted_values, queries)
    _check_1d("sorted_values", sorted_values)
    return xp.searchsorted(sorted_values, queries, side="right").astype(np.int64, copy=False)


# --- order-preserving keys ---------------------------------------------------------
def float_to_ordered_uint(x):
    """Map floats to unsigned integers with the same order (a bijection).

    Positive floats get their sign bit set; negative floats have all bits
    flipped. Then ``a < b`` (as floats) iff ``key(a) < key(b)`` (as
    unsigned), so radix sorts and integer atomics work on floats.

    Parameters
    ----------
    x : (...) float32 or float64

    Returns
    -------
    key : (...) uint32 (float32 input) or uint64 (float64 input)

    Notes
    -----
    Bits, not values, are mapped: ``-0.0`` gets a key one below ``+0.0``
    (``0x7FFFFFFF`` and ``0x80000000`` for float32), so a sort by key puts
    ``-0.0`` before ``+0.0`` and a minimum prefers ``-0.0``. NaNs with the
    sign bit clear sort above ``+inf``, with the sign bit set below ``-inf``.
    """
    xp = get_xp(x)
    try:
        udtype, sign = _FLOAT_UINT[x.dtype]
    except KeyError:
        raise TypeError(f"float_to_ordered_uint needs float32 or float64, got {x.dtype}") from None
    bits = x.view(udtype)
    # branch-free: negative (sign bit 1) -> flip all bits, else set the sign bit
    negative = bits >> udtype.type(8 * udtype.itemsize - 1)
    mask = (negative * ~udtype.type(0)) | sign
    return bits ^ mask


def ordered_uint_to_float(key):
    """Inverse of :func:`float_to_ordered_uint`.

    Parameters
    ----------
    key : (...) uint32 or uint64

    Returns
    -------
    x : (...) float32 (uint32 input) or float64 (uint64 input)
    """
    xp = get_xp(key)
    for fdtype, (udtype, sign) in _FLOAT_UINT.items():
        if key.dtype == udtype:
            break
    else:
        raise TypeError(f"ordered_uint_to_float needs uint32 or uint64, got {key.dtype}")
    positive = key >> udtype.type(8 * udtype.itemsize - 1)
    mask = ((udtype.type(1) - positive) * ~udtype.type(0)) | sign
    return (key ^ mask).view(fdtype)


def _to_ordered_key(values):
    """Unsigned key with the order of ``values`` (ints widened to >= 32 bits)."""
    dtype = values.dtype
    if dtype.kind == "f":
        if dtype not in _FLOAT_UINT:
            values = values.astype(np.float32)
        return float_to_ordered_uint(values)
    if dtype.kind == "b":
        values = values.astype(np.uint32)
        dtype = values.dtype
    if dtype.kind == "u":
        return values.astype(np.uint64 if dtype.itemsize == 8 else np.uint32, copy=False)
    if dtype.kind == "i":
        if dtype.itemsize == 8:
            return values.view(np.uint64) ^ np.uint64(1 << 63)
        return values.astype(np.int32, copy=False).view(np.uint32) ^ np.uint32(1 << 31)
    raise TypeError(f"cannot order values of dtype {dtype}")


def _from_ordered_key(key, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return ordered_uint_to_float(key).astype(dtype, copy=False)
    if dtype.kind in "ub":
        return key.astype(dtype)
    if dtype.itemsize == 8:
        return (key ^ np.uint64(1 << 63)).view(np.int64)
    return (key ^ np.uint32(1 << 31)).view(np.int32).astype(dtype)


# --- segmented reductions -------------------------------------------------------
def _identity(dtype, op):
    dtype = np.dtype(dtype)
    if op == "sum":
        return dtype.type(0)
    if dtype.kind == "f":
        return dtype.type(np.inf if op == "min" else -np.inf)
    if dtype.kind == "b":
        return np.bool_(op == "min")
    info = np.iinfo(dtype)
    return dtype.type(info.max if op == "min" else info.min)


def segmented_reduce(values, offsets, op):
    """Sum, minimum or maximum of every segment.

    Parameters
    ----------
    values : (n,) int, uint, bool or float
    offsets : (num_segments + 1,) int
    op : {"sum", "min", "max"}

    Returns
    -------
    out : (num_segments,)
        "sum": dtype as in :func:`exclusive_scan`; "min"/"max": ``values.dtype``.
        Empty segments give the identity: 0, +inf (ints: dtype max) for
        "min", -inf (ints: dtype min) for "max".

    Notes
    -----
    min/max are exact (integer atomics on order-preserving keys on the GPU).
    Integer sums are exact; float sums are the last elements of a
    :func:`segmented_scan` (agree with a sequential loop to rounding).
    """
    if op not in REDUCE_OPS:
        raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")
    xp = get_xp(values, offsets)
    _check_1d("values", values)
    n = values.shape[0]
    _check_offsets(offsets, n)
    num_segments = offsets.shape[0] - 1
    out_dtype = _scan_dtype(values, None) if op == "sum" else values.dtype
    out = xp.full(num_segments, _identity(out_dtype, op), dtype=out_dtype)
    if n == 0 or num_segments == 0:
        return out
    if op == "sum":
        if out_dtype.kind in "iub":
            total = exclusive_scan(values, out_dtype)
            return total[offsets[1:]] - total[offsets[:-1]]
        scan = segmented_scan(values, offsets=offsets, dtype=out_dtype)
        nonempty = offsets[1:] > offsets[:-1]
        return xp.where(nonempty, scan[xp.maximum(offsets[1:] - 1, 0)], out)
    if xp is np:
        starts = offsets[:-1]
        nonempty = offsets[1:] > starts
        ufunc = np.minimum if op == "min" else np.maximum
        out[nonempty] = ufunc.reduceat(values, starts[nonempty])
        return out
    key = _to_ordered_key(values)
    segment_key = _segment_extreme_key_cuda(key, offsets, op, segment_ids(offsets, n))
    nonempty = offsets[1:] > offsets[:-1]
    return xp.where(nonempty, _from_ordered_key(segment_key, values.dtype), out)


def _segment_extreme_key_cuda(key, offsets, op, segment):
    import cupy

    from .kernels import get_function

    n = key.shape[0]
    num_segments = offsets.shape[0] - 1
    wide = key.dtype.itemsize == 8
    suffix = "u64" if wide else "u32"
    init = ~key.dtype.type(0) if op == "min" else key.dtype.type(0)
    segment_key = cupy.full(num_segments, init, dtype=key.dtype)
    kernel = get_function("primitives.cu", f"kd_segmented_{op}_{suffix}")
    launch(f"segmented {op}", kernel, n, (key, segment, np.int64(n), segment_key))
    return segment_key


def segmented_argmin(values, offsets):
    """Index of the minimum of every segment.

    Parameters
    ----------
    values : (n,) float32, float64, int or uint
        No NaN; ``+inf`` and ``-inf`` are allowed.
    offsets : (num_segments + 1,) int

    Returns
    -------
    index : (num_segments,) int64
        Index into ``values`` of each segment's minimum; the LOWEST index on
        ties; -1 for an empty segment.

    Notes
    -----
    Exact for float64 (comparisons on order-preserving 64-bit keys, no
    rounding) and deterministic (an integer minimum does not depend on the
    order of the atomics). ``-0.0`` and ``+0.0`` compare equal, as in the
    NumPy path: the lower index wins.
    """
    xp = get_xp(values, offsets)
    _check_1d("values", values)
    n = values.shape[0]
    _check_offsets(offsets, n)
    num_segments = offsets.shape[0] - 1
    if values.dtype.kind == "f":
        # fold -0.0 into +0.0 so that equal values tie on the index
        values = values + values.dtype.type(0)
    result = xp.full(num_segments, -1, dtype=np.int64)
    if n == 0 or num_segments == 0:
        return result
    nonempty = offsets[1:] > offsets[:-1]
    if xp is np:
        segment_min = segmented_reduce(values, offsets, "min")
        segment = segment_ids(offsets, n)
        is_min = values == segment_min[segment]
        candidate = np.where(is_min, np.arange(n, dtype=np.int64), np.int64(n))
        starts = offsets[:-1][nonempty]
        result[nonempty] = np.minimum.reduceat(candidate, starts)
        return result
    import cupy

    from .kernels import get_function

    key = _to_ordered_key(values)
    segment = segment_ids(offsets, n)
    segment_min = _segment_extreme_key_cuda(key, offsets, "min", segment)
    segment_index = cupy.full(num_segments, np.iinfo(np.int64).max, dtype=np.int64)
    suffix = "u64" if key.dtype.itemsize == 8 else "u32"
    kernel = get_function("primitives.cu", f"kd_segmented_argmin_{suffix}")
    launch("segmented argmin", kernel, n, (key, segment, np.int64(n), segment_min, segment_index))
    return cupy.where(nonempty, segment_index, result)


# --- sorting and compaction ---------------------------------------------------------
def _sort_key(keys):
    if keys.dtype.kind == "f":
        # bits order: -0.0 before +0.0 on both backends (NumPy's argsort ties them)
        return float_to_ordered_uint(keys if keys.dtype in _FLOAT_UINT else keys.astype(np.float32))
    if keys.dtype.kind in "iub":
        return keys
    raise TypeError(f"radix_sort keys must be integers, bools or floats, got dtype {keys.dtype}")


def radix_sort(keys, values=None):
    """Stable sort by key, carrying values along.

    Parameters
    ----------
    keys : (n,) int, uint, bool or float
        Floats are ordered by :func:`float_to_ordered_uint` (``-0.0`` before
        ``+0.0``; NaN with the sign bit clear last).
    values : (n,) array, tuple of (n,) arrays, or None

    Returns
    -------
    keys_sorted : (n,) keys.dtype
    values_sorted : (n,) array or tuple of arrays
        Only when ``values`` is given; a tuple when ``values`` is a tuple.
        Equal keys keep their input order.
    """
    xp = get_xp(keys, *(values if isinstance(values, tuple) else (values,)))
    _check_1d("keys", keys)
    n = keys.shape[0]
    value_list = values if isinstance(values, tuple) else (() if values is None else (values,))
    for i, v in enumerate(value_list):
        if v.shape[0] != n:
            raise ValueError(f"values[{i}] has {v.shape[0]} entries, keys has {n}")
    with stage("radix sort", xp):
        if xp is np:
            order = np.argsort(_sort_key(keys), kind="stable")
        else:
            # CuPy's argsort is Thrust's stable radix sort for primitive keys
            order = xp.argsort(_sort_key(keys))
        keys_sorted = keys[order]
        sorted_values = tuple(v[order] for v in value_list)
    if values is None:
        return keys_sorted
    return keys_sorted, (sorted_values if isinstance(values, tuple) else sorted_values[0])


def compact_indices(mask):
    """Positions of the ``True`` entries, in order.

    Parameters
    ----------
    mask : (n,) bool

    Returns
    -------
    index : (count,) int64

    Notes
    -----
    On the GPU this reads the count from the device (a synchronization).
    """
    xp = get_xp(mask)
    _check_1d("mask", mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"mask must be a bool array, got dtype {mask.dtype}")
    return xp.nonzero(mask)[0].astype(np.int64, copy=False)


def compact(mask, *arrays):
    """Stable stream compaction of several arrays by one mask.

    Parameters
    ----------
    mask : (n,) bool
    *arrays : (n, ...) arrays
        Compacted along their first axis.

    Returns
    -------
    count : int
        Number of ``True`` entries (a host integer; a device-to-host read on
        the GPU).
    compacted : tuple of (count, ...) arrays
        The kept rows of each array, in input order.
    """
    xp = get_xp(mask, *arrays)
    index = compact_indices(mask)
    n = mask.shape[0]
    for i, a in enumerate(arrays):
        if a.shape[0] != n:
            raise ValueError(f"array {i} has {a.shape[0]} rows, mask has {n}")
    count = int(index.shape[0])
    return count, tuple(a[index] for a in arrays)
