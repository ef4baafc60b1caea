"""Order-preserving keys: floats as unsigned integers with the same order.

The CUDA twin is ``kd_ordered_bits32`` / ``kd_float_from_ordered_bits32`` in
``cuda/common.cuh``; every sort and integer atomic on floats in the package
goes through one of the two.
"""

from __future__ import annotations

import numpy as np


# (float dtype, unsigned dtype of the same width, sign bit)
_FLOAT_UINT = {
    np.dtype(np.float32): (np.dtype(np.uint32), np.uint32(1 << 31)),
    np.dtype(np.float64): (np.dtype(np.uint64), np.uint64(1 << 63)),
}


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
    """Inverse of :func:`float_to_ordered_uint`: uint32 keys give float32, uint64 keys float64."""
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

