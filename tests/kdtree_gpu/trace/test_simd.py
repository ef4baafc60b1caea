"""The packet traversal's eight-lane intrinsics against NumPy."""

import numba
import numpy as np

from kdtree_gpu.trace.simd import LANES, _vgt, _vload, _vmax, _vmin, _vsel, _vstore


@numba.njit(cache=False)
def _select_every_mask(a, b, out):
    # row m of out: lane l from a where bit l of m is set, else from b
    va, vb = _vload(a, 0), _vload(b, 0)
    for m in range(1 << LANES):
        _vstore(out, LANES * m, _vsel(m, va, vb))


def test_vsel_takes_each_lane_from_its_bit():
    a = np.arange(1, LANES + 1, dtype=np.float32)
    b = -a
    out = np.empty((1 << LANES) * LANES, np.float32)
    _select_every_mask(a, b, out)
    bits = (np.arange(1 << LANES)[:, None] >> np.arange(LANES)) & 1
    assert np.array_equal(out.reshape(-1, LANES), np.where(bits == 1, a, b))


@numba.njit(cache=False)
def _min_max_gt(a, b, out):
    va, vb = _vload(a, 0), _vload(b, 0)
    _vstore(out, 0, _vmin(va, vb))
    _vstore(out, LANES, _vmax(va, vb))
    return _vgt(va, vb)


def test_vmin_vmax_keep_b_where_a_is_nan_and_vgt_gives_bits():
    # the GPU's fminf(ts, tf) / fmaxf(ts, tn) where only ts (a) may be NaN
    a = np.array([1, 5, np.nan, -2, 0, 3, np.inf, -np.inf], np.float32)
    b = np.array([2, 4, 7, -2, -0.0, 3, 1, 1], np.float32)
    out = np.empty(2 * LANES, np.float32)
    gt = _min_max_gt(a, b, out)
    assert np.array_equal(out[:LANES], np.where(a < b, a, b))
    assert np.array_equal(out[LANES:], np.where(a > b, a, b))
    assert gt == sum(1 << k for k in range(LANES) if a[k] > b[k])
