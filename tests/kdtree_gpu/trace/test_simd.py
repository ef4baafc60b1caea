"""The packet traversal's eight-lane intrinsics against NumPy."""

import numba
import numpy as np

from kdtree_gpu.trace.simd import LANES, _vfar_tn, _vgt, _vload, _vnear_tf, _vsel, _vstore


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
def _intervals_gt(ts, tn, tf, eps, out):
    vts, vtn, vtf, veps = _vload(ts, 0), _vload(tn, 0), _vload(tf, 0), _vload(eps, 0)
    _vstore(out, 0, _vnear_tf(vts, vtn, vtf, veps))
    _vstore(out, LANES, _vfar_tn(vts, vtn, vtf, veps))
    return _vgt(vts, vtn)


def test_child_intervals_follow_the_gpu_rule_and_vgt_gives_bits():
    # lanes visiting both children (ts within [tn - eps, tf + eps]): the near
    # child ends at fminf(ts, tf), the far one starts at fmaxf(ts, tn); a NaN ts
    # keeps tn and tf (the GPU's fminf / fmaxf); other lanes keep theirs
    ts = np.array([0.5, 3.0, np.nan, -1.0, 2.05, -0.05, 1.0, 0.0], np.float32)
    tn = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, -0.0], np.float32)
    tf = np.full(LANES, 2.0, np.float32)
    eps = np.full(LANES, 0.1, np.float32)
    out = np.empty(2 * LANES, np.float32)
    gt = _intervals_gt(ts, tn, tf, eps, out)
    with np.errstate(invalid="ignore"):
        both = ~(ts > tf + eps) & ~(ts < tn - eps)
        assert both.tolist() == [True, False, True, False, True, True, True, True]
        assert np.array_equal(out[:LANES], np.where(both & (ts < tf), ts, tf))
        assert np.array_equal(out[LANES:], np.where(both & (ts > tn), ts, tn))
        assert gt == sum(1 << k for k in range(LANES) if ts[k] > tn[k])
    # the lanes by hand: 0.5 splits [0, 2]; 2.05 is within eps of tf, -0.05 of tn
    assert np.array_equal(out[:6], np.float32([0.5, 2.0, 2.0, 2.0, 2.0, -0.05]))
    assert np.array_equal(out[LANES:LANES + 6], np.float32([0.5, 0.0, 0.0, 0.0, 2.05, 0.0]))
