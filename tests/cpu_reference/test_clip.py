"""Triangle-box clipping (rule R9) against brute-force geometry."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cpu_reference.clip import clip_child_box, clip_triangle_box, round_down_f32, round_up_f32


def clip(v, lo, hi):
    out_lo = np.full(3, np.nan, dtype=np.float32)
    out_hi = np.full(3, np.nan, dtype=np.float32)
    ok = clip_triangle_box(v[0], v[1], v[2], np.asarray(lo, np.float32), np.asarray(hi, np.float32),
                           out_lo, out_hi)
    return ok, out_lo, out_hi


def polygon_candidates(v, lo, hi):
    """Points that include every vertex of (triangle ∩ box), computed independently.

    The vertices of the intersection of a triangle with a box are triangle
    vertices inside the box, crossings of triangle edges with box faces, and
    crossings of box edges with the triangle. Returns the ones inside both.
    """
    v = v.astype(np.float64)
    lo = np.asarray(lo, np.float64)
    hi = np.asarray(hi, np.float64)
    eps = 1e-9 * (1.0 + np.abs(np.concatenate([v.ravel(), lo, hi])).max())
    pts = list(v)
    for i in range(3):
        a, b = v[i], v[(i + 1) % 3]
        for k in range(3):
            if a[k] != b[k]:
                for c in (lo[k], hi[k]):
                    t = (c - a[k]) / (b[k] - a[k])
                    if 0.0 <= t <= 1.0:
                        pts.append(a + t * (b - a))
    normal = np.cross(v[1] - v[0], v[2] - v[0])
    corners = np.array(list(itertools.product(*zip(lo, hi))))
    for k in range(3):
        if normal[k] == 0.0:
            continue
        for c0 in corners:
            # box edge along axis k through corner c0: solve normal . (x - v0) = 0 for x[k]
            x = c0.copy()
            x[k] = v[0][k] - (np.dot(normal, c0 - v[0]) - normal[k] * (c0[k] - v[0][k])) / normal[k]
            pts.append(x)
    pts = np.array(pts)
    in_box = np.all((pts >= lo - eps) & (pts <= hi + eps), axis=1)
    # barycentric inside test
    e1, e2 = v[1] - v[0], v[2] - v[0]
    d = pts - v[0]
    g = np.array([[e1 @ e1, e1 @ e2], [e1 @ e2, e2 @ e2]])
    uv = np.linalg.solve(g, np.stack([d @ e1, d @ e2]))
    tol = 1e-9
    in_tri = (uv[0] >= -tol) & (uv[1] >= -tol) & (uv[0] + uv[1] <= 1 + tol)
    return pts[in_box & in_tri]


def ulp_gap(a, b):
    """Number of float32 steps between two float32 values."""
    ia = np.array(a, np.float32).view(np.int32).astype(np.int64)
    ib = np.array(b, np.float32).view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


def test_rounding_is_outward_and_never_negative_zero():
    for x in (0.1, -0.1, 1.0 / 3.0, -7.25, 1e-30, -1e-30, 3.0e38):
        lo, hi = round_down_f32(x), round_up_f32(x)
        assert np.float64(lo) <= x <= np.float64(hi)
        assert ulp_gap(lo, hi) <= 1
    assert round_down_f32(2.5) == round_up_f32(2.5) == np.float32(2.5)
    assert not np.signbit(round_up_f32(-1e-50))
    assert not np.signbit(round_down_f32(-0.0))


def test_triangle_inside_box_keeps_its_box():
    v = np.array([[0.1, 0.2, 0.3], [0.9, 0.25, 0.5], [0.4, 0.8, 0.7]], np.float32)
    ok, lo, hi = clip(v, [0, 0, 0], [1, 1, 1])
    assert ok
    np.testing.assert_array_equal(lo, v.min(axis=0))
    np.testing.assert_array_equal(hi, v.max(axis=0))


def test_triangle_outside_box_is_empty():
    v = np.array([[2, 0, 0], [3, 0, 0], [2, 1, 0]], np.float32)
    ok, lo, hi = clip(v, [0, 0, 0], [1, 1, 1])
    assert not ok
    assert np.isnan(lo).all() and np.isnan(hi).all()  # untouched


def test_box_corner_outside_triangle_plane_is_empty():
    # the triangle's box overlaps the box, the triangle does not
    v = np.array([[0.0, 2.0, 0.5], [2.0, 0.0, 0.5], [2.0, 2.0, 0.5]], np.float32)
    ok, _, _ = clip(v, [0, 0, 0], [0.9, 0.9, 1])
    assert not ok


@pytest.mark.parametrize("v, lo, hi", [
    # a vertex touching the box: a point box
    ([[1, 0.5, 0.5], [2, 0, 0], [2, 1, 1]], [1, 0.5, 0.5], [1, 0.5, 0.5]),
    # a triangle lying on a face of the box is kept
    ([[-1, -1, 1], [3, -1, 1], [-1, 3, 1]], [0, 0, 1], [1, 1, 1]),
    # an axis-aligned cut
    ([[0, 0, 0], [4, 0, 0], [0, 4, 0]], [0, 0, 0], [1, 4, 0]),
], ids=["touching vertex", "on a face", "axis-aligned cut"])
def test_exact_clips(v, lo, hi):
    box_hi = [1, 4, 4] if lo == [0, 0, 0] and hi == [1, 4, 0] else [1, 1, 1]
    ok, out_lo, out_hi = clip(np.array(v, np.float32), [0, 0, 0], box_hi)
    assert ok
    np.testing.assert_array_equal(out_lo, lo)
    np.testing.assert_array_equal(out_hi, hi)


@pytest.mark.parametrize("seed", range(4))
def test_random_clips_contain_samples_and_are_tight(seed):
    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(150):
        v = (rng.normal(size=(3, 3)) * rng.choice([0.01, 1.0, 100.0])).astype(np.float32)
        if rng.random() < 0.3:  # axis-aligned triangles: planar boxes
            v[:, rng.integers(3)] = v[0, rng.integers(3)]
        centre = v.mean(axis=0)
        size = np.abs(v - centre).max()
        lo = (centre + rng.uniform(-1.2, 0.3, 3) * size).astype(np.float32)
        hi = (lo + rng.uniform(0.0, 1.5, 3) * size).astype(np.float32)
        ok, out_lo, out_hi = clip(v, lo, hi)
        cand = polygon_candidates(v, lo, hi)
        # samples on the triangle that lie in the box lie in the returned box
        w = rng.dirichlet(np.ones(3), size=4000)
        samples = w @ v.astype(np.float64)
        inside = np.all((samples >= lo) & (samples <= hi), axis=1)
        if not ok:
            assert not inside.any()
            assert cand.shape[0] == 0 or np.ptp(cand, axis=0).max() <= 1e-6 * (1 + size)
            continue
        checked += 1
        slack = 1e-12 * (1.0 + np.abs(samples).max())
        assert np.all(samples[inside] >= out_lo.astype(np.float64) - slack)
        assert np.all(samples[inside] <= out_hi.astype(np.float64) + slack)
        # tight: within one float32 step of the exact polygon box
        assert cand.shape[0] > 0
        exact_lo = cand.min(axis=0)
        exact_hi = cand.max(axis=0)
        for j in range(3):
            assert ulp_gap(out_lo[j], round_down_f32(exact_lo[j])) <= 1, (j, out_lo, exact_lo)
            assert ulp_gap(out_hi[j], round_up_f32(exact_hi[j])) <= 1, (j, out_hi, exact_hi)
        assert np.all(out_lo >= lo) and np.all(out_hi <= hi)
    assert checked > 50


def test_child_box_intersects_with_previous_box():
    v = np.array([[0, 0, 0], [4, 0, 0], [0, 4, 0]], np.float32)
    prev_lo = np.array([0, 0, 0], np.float32)
    prev_hi = np.array([4, 3, 0], np.float32)  # narrower than the triangle on y
    out_lo = np.empty(3, np.float32)
    out_hi = np.empty(3, np.float32)
    used = clip_child_box(v[0], v[1], v[2], prev_lo, prev_hi,
                          np.array([0, 0, -1], np.float32), np.array([1, 10, 1], np.float32),
                          out_lo, out_hi)
    assert used
    np.testing.assert_array_equal(out_lo, [0, 0, 0])
    np.testing.assert_array_equal(out_hi, [1, 3, 0])


def test_child_box_falls_back_when_polygon_is_empty():
    # the triangle misses the child box (as can happen only through rounding
    # in a build): the previous box intersected with the child's box is used
    v = np.array([[2, 0, 0], [3, 0, 0], [2, 1, 0]], np.float32)
    prev_lo = np.array([0.5, 0, 0], np.float32)
    prev_hi = np.array([3, 1, 0], np.float32)
    out_lo = np.empty(3, np.float32)
    out_hi = np.empty(3, np.float32)
    used = clip_child_box(v[0], v[1], v[2], prev_lo, prev_hi,
                          np.array([0, 0, 0], np.float32), np.array([1, 1, 1], np.float32),
                          out_lo, out_hi)
    assert not used
    np.testing.assert_array_equal(out_lo, [0.5, 0, 0])
    np.testing.assert_array_equal(out_hi, [1, 1, 0])
