"""Sorting, binary search and stream compaction (NumPy and CuPy).

Only :func:`compact` and :func:`compact_indices` read from the device (the
count that sizes their output). Everything else is launched asynchronously.
"""

from __future__ import annotations

import numpy as np

from ..arrays import get_xp
from ..launch import launch, stage
from .keys import _FLOAT_UINT, float_to_ordered_uint
from .scan import PRIMITIVES_SOURCE, _check_1d


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
    return _search(sorted_values, queries, "left")


def upper_bound(sorted_values, queries):
    """Smallest ``j`` with ``sorted_values[j] > query`` (``m`` if none): the last
    position where each query could be inserted; as :func:`lower_bound`."""
    return _search(sorted_values, queries, "right")


def segmented_lower_bound(sorted_values, offsets, queries, query_segment, max_length=None):
    """:func:`lower_bound` of each query within its own segment.

    Parameters
    ----------
    sorted_values : (m,)
        Ascending within each segment (the segments need not be ordered
        among each other).
    offsets : (num_segments + 1,) int64
        Segment ``s`` is ``sorted_values[offsets[s]:offsets[s + 1]]``.
    queries : (q,) same kind
    query_segment : (q,) int
        The segment each query searches.
    max_length : int, optional
        A bound on the longest segment (a host number: the bisection's step
        count); default ``m``.

    Returns
    -------
    index : (q,) int64
        Smallest ``j`` in ``[offsets[s], offsets[s + 1]]`` with
        ``sorted_values[j] >= query`` (``offsets[s + 1]`` if none), an index
        into ``sorted_values``.
    """
    xp = get_xp(sorted_values, offsets, queries, query_segment)
    _check_1d("sorted_values", sorted_values)
    m = sorted_values.shape[0]
    seg = query_segment.astype(np.int64, copy=False)
    if xp is not np and sorted_values.dtype == np.uint64 and queries.dtype == np.uint64:
        return _segmented_lower_bound_cuda(sorted_values, offsets, queries, seg)
    lo = offsets[seg].astype(np.int64)
    hi = offsets[seg + 1].astype(np.int64)
    if m == 0:
        return lo
    # bisection: every query's range at least halves per step
    for _ in range(int(m if max_length is None else max_length).bit_length()):
        mid = (lo + hi) // 2
        below = (mid < hi) & (sorted_values[xp.minimum(mid, m - 1)] < queries)
        hi = xp.where(below, hi, xp.minimum(mid, hi))
        lo = xp.where(below, mid + 1, lo)
    return lo


def _segmented_lower_bound_cuda(sorted_values, offsets, queries, segment):
    import cupy

    from ..kernels import get_function

    out = cupy.empty(queries.shape[0], dtype=np.int64)
    kernel = get_function(PRIMITIVES_SOURCE, "kd_segmented_lower_bound_u64")
    launch("segmented lower bound", kernel, queries.shape[0],
           (cupy.ascontiguousarray(sorted_values), cupy.ascontiguousarray(offsets, dtype=np.int64),
            cupy.ascontiguousarray(queries), cupy.ascontiguousarray(segment),
            np.int64(queries.shape[0]), out))
    return out


def _search(sorted_values, queries, side):
    xp = get_xp(sorted_values, queries)
    _check_1d("sorted_values", sorted_values)
    return xp.searchsorted(sorted_values, queries, side=side).astype(np.int64, copy=False)


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
    get_xp(mask, *arrays)  # host and device arrays mixed: a TypeError
    index = compact_indices(mask)
    n = mask.shape[0]
    for i, a in enumerate(arrays):
        if a.shape[0] != n:
            raise ValueError(f"array {i} has {a.shape[0]} rows, mask has {n}")
    count = int(index.shape[0])
    return count, tuple(a[index] for a in arrays)
