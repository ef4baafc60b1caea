"""Segments: segment ids, segmented reductions and the segmented arg-min.

Segments are given by ``offsets : (num_segments + 1,)`` with ``offsets[0] ==
0``, ``offsets[-1] == n`` and ``offsets`` non-decreasing; empty segments are
allowed. The NumPy path checks these conditions; the CuPy path checks only
shapes (a check of the contents would read device memory, a synchronization).
"""

from __future__ import annotations

import numpy as np

from ..arrays import get_xp
from ..launch import launch
from .keys import _from_ordered_key, _to_ordered_key
from .scan import (PRIMITIVES_SOURCE, _check_1d, _check_offsets, _scan_dtype, exclusive_scan,
                   segmented_scan)

REDUCE_OPS = ("sum", "min", "max")


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

    from ..kernels import get_function

    n = key.shape[0]
    num_segments = offsets.shape[0] - 1
    wide = key.dtype.itemsize == 8
    suffix = "u64" if wide else "u32"
    init = ~key.dtype.type(0) if op == "min" else key.dtype.type(0)
    segment_key = cupy.full(num_segments, init, dtype=key.dtype)
    kernel = get_function(PRIMITIVES_SOURCE, f"kd_segmented_{op}_{suffix}")
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

    from ..kernels import get_function

    key = _to_ordered_key(values)
    segment = segment_ids(offsets, n)
    segment_min = _segment_extreme_key_cuda(key, offsets, "min", segment)
    segment_index = cupy.full(num_segments, np.iinfo(np.int64).max, dtype=np.int64)
    suffix = "u64" if key.dtype.itemsize == 8 else "u32"
    kernel = get_function(PRIMITIVES_SOURCE, f"kd_segmented_argmin_{suffix}")
    launch("segmented argmin", kernel, n, (key, segment, np.int64(n), segment_min, segment_index))
    return cupy.where(nonempty, segment_index, result)

