"""The order the CPU traverses rays in: neighbours start close together and point alike.

Incoherent rays (a path tracer's bounces) are put in an order where
neighbours start close together and point alike (:func:`ray_order`: a radix
sort on the octant, ``kz``, and Morton codes of the origin's cell in the root
box and of the direction), so that packets fill up and neighbouring rays find
the same nodes in the cache; rays that come coherent (a camera's, row by row)
keep their order.
"""

from __future__ import annotations

import numba
import numpy as np

from .watertight import _F32_INF, _F32_ZERO

# the ray order: bits per axis of the origin's cell in the root box and of the
# direction's cell in the rays' direction box; rays below SORT_MIN_RAYS keep
# their order
ORIGIN_BITS = 5
DIRECTION_BITS = 2
SORT_MIN_RAYS = 8192
KEY_CHUNK = 65536  # rays per parallel task of the key pass
COHERENCE_SAMPLES = 256  # neighbour pairs that decide whether rays come coherent


# Spread bits: entry c has bit b of c at bit 3 b (Morton interleaving).
_SPREAD = np.array([sum(((c >> b) & 1) << (3 * b) for b in range(8)) for c in range(256)],
                   np.uint32)


@numba.njit(cache=True, error_model="numpy")
def _cell(x, lo, scale, top):
    # the cell of x in [lo, lo + (top + 1) / scale), clamped to 0..top, with
    # selects rather than branches (the rays come in no order)
    f = (x - lo) * scale
    f = f if f > _F32_ZERO else _F32_ZERO
    c = int(f if f < np.float32(top) else np.float32(top))
    return c


@numba.njit(cache=True, error_model="numpy", inline="always")
def _ray_key(origins, directions, i, grid):
    # kz and octant, then the Morton codes of the origin's and the direction's
    # cells interleaved; grid: lo and scale of origins (rows 0, 1) and of
    # directions (rows 2, 3)
    code = np.uint32(0)
    octant = np.uint32(0)
    for k in range(3):
        d = directions[i, k]
        co = _cell(origins[i, k], grid[0, k], grid[1, k], (1 << ORIGIN_BITS) - 1)
        cd = _cell(d, grid[2, k], grid[3, k], (1 << DIRECTION_BITS) - 1)
        code |= ((_SPREAD[co] << np.uint32(3 * DIRECTION_BITS)) | _SPREAD[cd]) << np.uint32(k)
        octant |= np.uint32(1 << k) if d < _F32_ZERO else np.uint32(0)
    ax, ay, az = abs(directions[i, 0]), abs(directions[i, 1]), abs(directions[i, 2])
    kz = 2 if (az > ax and az > ay) else (1 if ay > ax else 0)
    top = np.uint32(3 * (ORIGIN_BITS + DIRECTION_BITS))
    return code | (octant << top) | (np.uint32(kz) << (top + np.uint32(3)))


_KEY_BITS = 3 * (ORIGIN_BITS + DIRECTION_BITS) + 5


@numba.njit(cache=True, error_model="numpy")
def _direction_box(directions, samples):
    # per-axis minimum and maximum of the directions, (2, 3): of all of them
    # (samples 0), or of the neighbour pairs _coherent reads
    n = directions.shape[0]
    lx = ly = lz = _F32_INF
    hx = hy = hz = -_F32_INF
    for r in range(2 * samples if samples else n):
        i = (r // 2 * (n - 1)) // samples + r % 2 if samples else r
        x, y, z = directions[i, 0], directions[i, 1], directions[i, 2]
        lx = x if x < lx else lx
        ly = y if y < ly else ly
        lz = z if z < lz else lz
        hx = x if x > hx else hx
        hy = y if y > hy else hy
        hz = z if z > hz else hz
    return np.array([[lx, ly, lz], [hx, hy, hz]], np.float32)


@numba.njit(cache=True, error_model="numpy")
def _coherent(origins, directions, grid, samples):
    # whether rays come in a coherent order already: most of ``samples``
    # neighbour pairs spread over the batch share their key
    n = origins.shape[0]
    same = 0
    for s in range(samples):
        i = (s * (n - 1)) // samples
        if _ray_key(origins, directions, i, grid) == _ray_key(origins, directions, i + 1, grid):
            same += 1
    return 2 * same >= samples


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _ray_keys(origins, directions, grid, keys):
    # every core, KEY_CHUNK rays a task (inlined _ray_key: no call per ray)
    n = origins.shape[0]
    for c in numba.prange((n + KEY_CHUNK - 1) // KEY_CHUNK):
        for i in range(c * KEY_CHUNK, min(n, (c + 1) * KEY_CHUNK)):
            keys[i] = _ray_key(origins, directions, i, grid)


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _radix_pass(keys, index, shift, mask, parts, out_keys, out_index):
    # one stable pass of an LSD radix sort on the digit (key >> shift) & mask,
    # moving (key, index) pairs (index None: the identity; out_keys None: the
    # last pass, whose keys nobody reads); a part of the items per task, each
    # part's items of one digit after the earlier parts'
    n = keys.shape[0]
    buckets = mask + 1
    size = (n + parts - 1) // parts
    start = np.zeros((parts, buckets), np.int64)
    for p in numba.prange(parts):
        for r in range(p * size, min(n, (p + 1) * size)):
            start[p, (keys[r] >> shift) & mask] += 1
    total = 0
    for b in range(buckets):
        for p in range(parts):
            count = start[p, b]
            start[p, b] = total
            total += count
    for p in numba.prange(parts):
        place = start[p]
        for r in range(p * size, min(n, (p + 1) * size)):
            k = keys[r]
            b = (k >> shift) & mask
            q = place[b]
            if out_keys is not None:
                out_keys[q] = k
            out_index[q] = r if index is None else index[r]
            place[b] = q + 1


def _radix_order(keys, bits):
    """The stable order of keys below ``2**bits``: an LSD radix sort in two
    passes of half the bits each, on every core (conference's 1M diffuse rays'
    keys: 11 ms on 2 cores, 15 ms on one)."""
    n = keys.shape[0]
    lo_bits = (bits + 1) // 2
    parts = max(1, min(numba.get_num_threads(), n // KEY_CHUNK))
    k1, i1 = np.empty(n, np.uint32), np.empty(n, np.int32)
    _radix_pass(keys, None, np.uint32(0), np.uint32((1 << lo_bits) - 1), parts, k1, i1)
    order = np.empty(n, np.int32)
    _radix_pass(k1, i1, np.uint32(lo_bits), np.uint32((1 << (bits - lo_bits)) - 1), parts, None,
                order)
    return order


def ray_order(box, origins, directions, force: bool = False):
    """The order to trace rays in: neighbours start close together and point alike.

    Parameters
    ----------
    box : (2, 3) float32
        The root box (unscaled).
    origins, directions : (num_rays, 3) float32

    force : bool
        Sort any batch of two rays or more (the warm-up compiles the sort so).

    Returns
    -------
    (num_rays,) int32 or None
        ``order[r]`` is the ray traced ``r``-th. None when the rays keep their
        order: fewer than :data:`SORT_MIN_RAYS`, or coherent already (most
        neighbours share their cells and octant, as a camera's rays row by row
        do).
    """
    n = origins.shape[0]
    if n < (2 if force else SORT_MIN_RAYS):
        return None
    # the coherence test reads 256 neighbour pairs: a direction box of those
    # will do for it (a pass over all directions costs a camera's rays 4%).
    # It runs when forced too: the warm-up's forced call is the only one of its
    # few rays that reaches it, and so compiles it for the first large batch.
    if _coherent(origins, directions, _grid(box, _direction_box(directions, COHERENCE_SAMPLES)),
                 COHERENCE_SAMPLES) and not force:
        return None
    grid = _grid(box, _direction_box(directions, 0))
    keys = np.empty(n, np.uint32)
    _ray_keys(origins, directions, grid, keys)
    return _radix_order(keys, _KEY_BITS)


def _grid(box, direction_box):
    # lo and cells per unit of the origins (rows 0, 1) and directions (rows 2, 3)
    grid = np.empty((4, 3), np.float32)
    for row, (lo, hi), bits in ((0, box, ORIGIN_BITS), (2, direction_box, DIRECTION_BITS)):
        grid[row] = lo
        extent = np.maximum(hi.astype(np.float64) - lo, 1e-30)
        grid[row + 1] = ((1 << bits) / extent).astype(np.float32)
    return grid
