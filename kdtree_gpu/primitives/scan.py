"""Scans: exclusive, inclusive and segmented prefix sums (NumPy and CuPy).

On CuPy, integer scans run the package's own int64 scan
(``cuda/primitives.cu``: three launches, or one block for arrays of up to
``encoding.SCAN_SMALL`` values); CuPy's ``cumsum`` gives the same numbers with
more host work per call, which dominates the builder's small levels. In-place
scans of ``CUB_MIN_ITEMS`` or more take CUB's single pass instead (one read and
one write per item; H100, 1M-63M items: 1.8-2.8x the three launches). Other
dtypes use ``cumsum`` (CUB).
"""

from __future__ import annotations

import numpy as np

from .. import encoding as enc
from ..arrays import get_xp
from ..launch import launch, stage

PRIMITIVES_SOURCE = "primitives.cu"  # the kernels of this package (kdtree_gpu/cuda)


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
        if xp is not np and dtype == np.int64 and x.dtype == np.int64:
            _scan_int64_cuda(x, out[1:], "exclusive scan")
        else:
            xp.cumsum(x, dtype=dtype, out=out[1:])
    return out


def inclusive_scan(x, dtype=None, description: str = "inclusive scan"):
    """Inclusive prefix sum.

    Parameters
    ----------
    x : (n,) bool, int, uint or float
    dtype : dtype, optional
        As in :func:`exclusive_scan`.
    description : str
        Name of the launches in the profile (CuPy int64 input).

    Returns
    -------
    out : (n,) dtype
        ``out[i] = x[0] + ... + x[i]``.
    """
    xp = get_xp(x)
    _check_1d("x", x)
    dtype = _scan_dtype(x, dtype)
    if xp is not np and dtype == np.int64 and x.dtype == np.int64:
        return _scan_int64_cuda(x, xp.empty(x.shape[0], dtype=np.int64), description)
    return xp.cumsum(x, dtype=dtype)


def inclusive_scan_in_place(x, description: str = "inclusive scan"):
    """Inclusive prefix sum of an int64 array, written over it (no second array:
    for scans whose input is not needed after, where memory is the limit).

    Parameters
    ----------
    x : (n,) int64, NumPy or CuPy
        Overwritten with ``x[0] + ... + x[i]``.
    description : str
        Name of the launches in the profile (CuPy).

    Returns
    -------
    x
    """
    xp = get_xp(x)
    _check_1d("x", x)
    if x.dtype != np.int64:
        raise TypeError(f"inclusive_scan_in_place needs an int64 array, got dtype {x.dtype}")
    if xp is np:
        return np.cumsum(x, out=x)
    return _scan_int64_cuda(x, x, description)


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


# in-place scans of at least this many items go through CUB (_scan_int64_cuda;
# benchmarks/probe_scan_cub.py, H100: 0.108 against 0.299 ms at 1M items)
CUB_MIN_ITEMS = 1 << 20


def _scan_kernel(name):
    from ..kernels import get_function

    return get_function(PRIMITIVES_SOURCE, name)


def _scan_int64_cuda(values, out, description):
    """Inclusive scan of an int64 CuPy array into ``out`` (same length); returns ``out``."""
    n = int(values.shape[0])
    if n == 0:
        return out
    i64 = np.int64
    if n <= enc.SCAN_SMALL:
        launch(description, _scan_kernel("kd_scan_small"), enc.SCAN_BLOCK, (values, i64(n), out),
               block=enc.SCAN_BLOCK)
        return out
    import cupy

    if out is values and CUB_MIN_ITEMS <= n <= 0x7FFFFFFF:
        # In place, large: CUB's single-pass scan (decoupled look-back) reads
        # and writes each item once; the three launches below read it twice.
        from cupy.cuda import cub

        with stage(xp=cupy, description=description + ": single pass"):
            if cub.cub_scan(out, cub.CUPY_CUB_CUMSUM) is not None:
                return out
    tile_scan(cupy, n, (_scan_kernel("kd_scan_tile_sums"), lambda tile: (values, i64(n), tile)),
              (_scan_kernel("kd_scan_tiles"), lambda tile: (values, i64(n), tile, out)),
              description)
    return out


def tile_scan(cp, n: int, sums, tiles, description: str):
    """The three-launch inclusive scan of ``n`` values (``cuda/scan.cuh``):
    per-tile sums, one block's scan of them into tile prefixes, then each
    tile's scan from its prefix. The first and last passes are the caller's
    kernels (``kd_scan_tile_sum`` and ``kd_scan_tile`` with a load of their
    own: the values may be derived as they are loaded, never stored).

    Parameters
    ----------
    sums, tiles : (cupy.RawKernel, callable)
        Each pass's kernel and a function from the tile sums array
        ((tiles,) int64, made here) to its arguments; launched with a block
        of ``SCAN_BLOCK`` threads per tile of ``SCAN_TILE`` values.
        ``tiles`` None: the caller's own kernel makes each tile's scan
        again where it needs it.
    description : str
        The launches' name prefix in the profile.

    Returns
    -------
    (tiles,) int64
        Each tile's exclusive prefix.
    """
    num_tiles = (n + enc.SCAN_TILE - 1) // enc.SCAN_TILE
    tile = cp.empty(num_tiles, dtype=np.int64)
    threads = num_tiles * enc.SCAN_BLOCK
    launch(description + ": tile sums", sums[0], threads, sums[1](tile), block=enc.SCAN_BLOCK)
    launch(description + ": tile prefix", _scan_kernel("kd_scan_tile_prefix"), enc.SCAN_BLOCK,
           (tile, np.int64(num_tiles)), block=enc.SCAN_BLOCK)
    if tiles is not None:
        launch(description + ": tiles", tiles[0], threads, tiles[1](tile), block=enc.SCAN_BLOCK)
    return tile
