"""Clipping a triangle to an axis-aligned box (perfect splits, rule R9).

Wald & Havran (2006, section 4.3) recompute the box of a triangle that
straddles a split plane from the part of the triangle inside each child. The
arithmetic here is fixed so that every builder gets the same float32 box:

1. The three float32 vertices are converted to float64.
2. Sutherland-Hodgman clips the polygon against six half-spaces in the order
   ``x >= lo[0]``, ``x <= hi[0]``, ``y >= lo[1]``, ``y <= hi[1]``,
   ``z >= lo[2]``, ``z <= hi[2]``. Points on a plane are inside. For each
   edge ``(prev, cur)`` of the current polygon (``prev`` is the vertex before
   ``cur``, cyclically, starting with ``cur`` = vertex 0): if ``cur`` is
   inside, the crossing point is emitted first when ``prev`` is outside, then
   ``cur``; if ``cur`` is outside and ``prev`` inside, the crossing point is
   emitted. The crossing point on plane ``c`` of axis ``k`` is
   ``t = (c - prev[k]) / (cur[k] - prev[k])``,
   ``q[j] = prev[j] + t * (cur[j] - prev[j])`` for ``j != k`` and ``q[k] = c``
   exactly (float64, no fused multiply-add).
3. The polygon's float64 box is rounded outward to float32: lower bounds to
   the largest float32 not above, upper bounds to the smallest float32 not
   below (then ``+ 0.0`` so that a zero is never negative).

:func:`clip_child_box` then applies the rest of R9: the rounded box is
intersected with the triangle's previous box and with the child's box, and if
the polygon came out empty (or that intersection is empty on some axis, which
only rounding can cause), the previous box intersected with the child's box is
used instead.

Both functions are numba-compiled and callable from Python; the naive builder
calls the same compiled code as the fast one.
"""

from __future__ import annotations

import numba
import numpy as np

# A triangle clipped by six planes has at most 3 + 6 = 9 vertices.
_MAX_POLY = 16
POLY_BUFFER_SHAPE = (_MAX_POLY, 3)


@numba.njit(cache=True)
def round_down_f32(x):
    """Largest float32 not above the float64 ``x`` (as float32, never -0.0)."""
    f = np.float32(x)
    if np.float64(f) > x:
        f = np.nextafter(f, np.float32(-np.inf))
    return f + np.float32(0.0)


@numba.njit(cache=True)
def round_up_f32(x):
    """Smallest float32 not below the float64 ``x`` (as float32, never -0.0)."""
    f = np.float32(x)
    if np.float64(f) < x:
        f = np.nextafter(f, np.float32(np.inf))
    return f + np.float32(0.0)


@numba.njit(cache=True)
def clip_triangle_box(v0, v1, v2, box_lo, box_hi, out_lo, out_hi):
    """Box of a triangle clipped to an axis-aligned box, rounded outward.

    Parameters
    ----------
    v0, v1, v2 : (3,) float32
        Triangle vertices.
    box_lo, box_hi : (3,) float32
        The clipping box (inclusive).
    out_lo, out_hi : (3,) float32
        Written with the clipped polygon's box, rounded outward to float32,
        when the result is not empty; untouched otherwise.

    Returns
    -------
    bool
        False when nothing of the triangle lies in the box.
    """
    poly = np.empty((_MAX_POLY, 3), dtype=np.float64)
    work = np.empty((_MAX_POLY, 3), dtype=np.float64)
    return clip_triangle_box_into(v0, v1, v2, box_lo, box_hi, out_lo, out_hi, poly, work)


@numba.njit(cache=True)
def clip_triangle_box_into(v0, v1, v2, box_lo, box_hi, out_lo, out_hi, poly, work):
    """:func:`clip_triangle_box` with caller-owned polygon buffers.

    Parameters
    ----------
    poly, work : (16, 3) float64
        Scratch space for the polygon (overwritten).
    """
    for j in range(3):
        poly[0, j] = np.float64(v0[j])
        poly[1, j] = np.float64(v1[j])
        poly[2, j] = np.float64(v2[j])
    n = 3
    for k in range(3):
        for upper in range(2):
            c = np.float64(box_hi[k]) if upper else np.float64(box_lo[k])
            m = 0
            for i in range(n):
                ip = i - 1 if i > 0 else n - 1
                if upper:
                    cur_in = poly[i, k] <= c
                    prev_in = poly[ip, k] <= c
                else:
                    cur_in = poly[i, k] >= c
                    prev_in = poly[ip, k] >= c
                if cur_in != prev_in:
                    # crossing point of the edge prev -> cur with the plane
                    t = (c - poly[ip, k]) / (poly[i, k] - poly[ip, k])
                    for j in range(3):
                        work[m, j] = poly[ip, j] + t * (poly[i, j] - poly[ip, j])
                    work[m, k] = c
                    m += 1
                if cur_in:
                    for j in range(3):
                        work[m, j] = poly[i, j]
                    m += 1
            if m == 0:
                return False
            n = m
            poly, work = work, poly
    for j in range(3):
        lo = poly[0, j]
        hi = poly[0, j]
        for i in range(1, n):
            lo = min(lo, poly[i, j])
            hi = max(hi, poly[i, j])
        out_lo[j] = round_down_f32(lo)
        out_hi[j] = round_up_f32(hi)
    return True


@numba.njit(cache=True)
def clip_child_box(v0, v1, v2, prev_lo, prev_hi, child_lo, child_hi, out_lo, out_hi):
    """New box of a straddling triangle in one child (rule R9).

    Parameters
    ----------
    v0, v1, v2 : (3,) float32
        Triangle vertices.
    prev_lo, prev_hi : (3,) float32
        The triangle's box in the parent node.
    child_lo, child_hi : (3,) float32
        The child node's box.
    out_lo, out_hi : (3,) float32
        Written with the new box: the clipped polygon's outward-rounded box
        intersected with the previous box and the child's box; the previous
        box intersected with the child's box when the polygon is empty or
        that intersection is empty on some axis.

    Returns
    -------
    bool
        True when the clipped polygon was used, False for the fallback.
    """
    poly = np.empty((_MAX_POLY, 3), dtype=np.float64)
    work = np.empty((_MAX_POLY, 3), dtype=np.float64)
    clip_lo = np.empty(3, dtype=np.float32)
    clip_hi = np.empty(3, dtype=np.float32)
    return clip_child_box_into(v0, v1, v2, prev_lo, prev_hi, child_lo, child_hi, out_lo, out_hi,
                               poly, work, clip_lo, clip_hi)


@numba.njit(cache=True)
def clip_child_box_into(v0, v1, v2, prev_lo, prev_hi, child_lo, child_hi, out_lo, out_hi,
                        poly, work, clip_lo, clip_hi):
    """:func:`clip_child_box` with caller-owned scratch buffers.

    Parameters
    ----------
    poly, work : (16, 3) float64
    clip_lo, clip_hi : (3,) float32
        Scratch space (overwritten).
    """
    used = clip_triangle_box_into(v0, v1, v2, child_lo, child_hi, clip_lo, clip_hi, poly, work)
    if used:
        for j in range(3):
            lo = max(clip_lo[j], max(prev_lo[j], child_lo[j]))
            hi = min(clip_hi[j], min(prev_hi[j], child_hi[j]))
            if lo > hi:
                used = False
            out_lo[j] = lo
            out_hi[j] = hi
    if not used:
        for j in range(3):
            out_lo[j] = max(prev_lo[j], child_lo[j])
            out_hi[j] = min(prev_hi[j], child_hi[j])
    return used
