"""The watertight ray-triangle test of the CPU backends (numba), and the ray conventions.

Both CPU backends, the kd-tree traversal (:mod:`kdtree_gpu.trace.cpu`) and
the brute-force oracle (:mod:`kdtree_gpu.trace.brute`), decide with the
functions below; the GPU versions are in ``kdtree_gpu/cuda/watertight.cuh``
and follow the same conventions, so that all decide alike.

Ray conventions
---------------
A ray is ``origin + t * direction`` (``direction`` need not be unit length;
``t`` is in units of its length). A hit counts when ``tmin <= t <= tmax``
and ``t`` is finite. Triangles are two-sided. Closest hit returns the
smallest ``t`` and, on equal ``t``, the lowest triangle id (the brute force
always; the traversal unless the tied triangles sit in leaves it does not
reach). A miss is ``t = inf``, ``tri = -1``, ``u = v = 0``. Barycentrics:
``u`` is the weight of ``v1`` and ``v`` the weight of ``v2``, so the hit
point is ``(1-u-v) v0 + u v1 + v v2``.

Scaled space
------------
Traversal and brute force run on coordinates times the trace scale ``s``
(:func:`kdtree_gpu.trace.scale.trace_scale` of the root box, a power of
two): vertices, split positions, the root box, ray origins and directions
are multiplied by ``s`` (exact), ``tmin``, ``tmax``, ``t``, ``u`` and ``v``
are not. The module docstring of :mod:`kdtree_gpu.trace.scale` is the
contract both backends follow. Below, every coordinate is a scaled one.

Ray-triangle test (Woop, Benthin and Wald, "Watertight Ray/Triangle
Intersection", JCGT 2(1), 2013), float32 operation by operation:

* ``kz`` = axis of the largest ``|d|`` (lowest index on ties),
  ``kx = (kz + 1) % 3``, ``ky = (kx + 1) % 3``; swap ``kx`` and ``ky`` when
  ``d[kz] < 0`` (keeps the winding of the projected triangle).
* ``Sx = d[kx] / d[kz]``, ``Sy = d[ky] / d[kz]``, ``Sz = 1 / d[kz]``.
* ``A = v0 - o`` (likewise B, C), ``Ax = A[kx] - Sx * A[kz]``,
  ``Ay = A[ky] - Sy * A[kz]``; edge functions ``U = Cx*By - Cy*Bx``,
  ``V = Ax*Cy - Ay*Cx``, ``W = Bx*Ay - By*Ax``; when one of them is exactly 0
  all three are recomputed in float64 (the products of float32 values are
  exact there) and rounded back to float32.
* Hit: ``U, V, W`` all ``>= 0`` or all ``<= 0``, ``det = (U + V) + W != 0``,
  ``T = (U*Az + V*Bz) + W*Cz`` with ``Az = Sz * A[kz]``, ``t = T / det``,
  ``tmin <= t <= tmax`` and ``|t| != inf``; ``u = V / det``, ``v = W / det``.

No operation is fused or reordered: numba compiles without fast-math, and
LLVM contracts no ``a * b + c`` into an FMA without it, so each operation
rounds as the explicitly rounded CUDA intrinsics do. The eight-lane vector
operations below are the same IEEE operations, lane by lane.
"""

from __future__ import annotations

import numba
import numpy as np

_F32_INF = np.float32(np.inf)
_F32_ZERO = np.float32(0.0)
_F32_ONE = np.float32(1.0)


# Helpers called per ray or per triangle take scalars only: passing an array
# to a numba function updates its reference count, an atomic operation on
# memory that every core shares.
@numba.njit(cache=True, error_model="numpy")
def setup_watertight(dx, dy, dz):
    """Per-ray constants of the watertight test.

    Parameters
    ----------
    dx, dy, dz : float32
        The (scaled) direction.

    Returns
    -------
    kx, ky, kz : int
    sx, sy, sz : float32
        Shear constants (``sz`` is infinite for a zero direction).
    """
    ax, ay, az = abs(dx), abs(dy), abs(dz)
    kz = 0
    if ay > ax:
        kz = 1
    if az > (ax if kz == 0 else ay):
        kz = 2
    kx = 0 if kz == 2 else kz + 1
    ky = 0 if kx == 2 else kx + 1
    dkz = dx if kz == 0 else (dy if kz == 1 else dz)
    if dkz < _F32_ZERO:
        kx, ky = ky, kx
    dkx = dx if kx == 0 else (dy if kx == 1 else dz)
    dky = dx if ky == 0 else (dy if ky == 1 else dz)
    sx = dkx / dkz
    sy = dky / dkz
    sz = _F32_ONE / dkz
    return kx, ky, kz, sx, sy, sz


@numba.njit(cache=True, error_model="numpy", inline="always")
def hit_triangle(akx, aky, akz, bkx, bky, bkz, ckx, cky, ckz, sx, sy, sz, tmin, tmax):
    """Watertight ray-triangle test of one triangle (two-sided, float32).

    Parameters
    ----------
    akx, aky, akz, bkx, bky, bkz, ckx, cky, ckz : float32
        Coordinates ``kx``, ``ky``, ``kz`` of the (scaled) vertices minus those
        of the (scaled) ray origin: ``A = v0 - o``, ``B = v1 - o``, ``C = v2 - o``.
    sx, sy, sz : float32
        From :func:`setup_watertight`.
    tmin, tmax : float32
        Accepted interval of ``t``.

    Returns
    -------
    hit : bool
    t, edge_v, edge_w, det : float32
        On a hit: ``t`` and the un-normalized edge functions of ``v1`` and
        ``v2`` with their sum ``det`` (``u = edge_v / det``, ``v = edge_w / det``).
    """
    # shear and scale so that the ray runs along +z
    ax = akx - sx * akz
    ay = aky - sy * akz
    bx = bkx - sx * bkz
    by = bky - sy * bkz
    cx = ckx - sx * ckz
    cy = cky - sy * ckz
    u = cx * by - cy * bx
    v = ax * cy - ay * cx
    w = bx * ay - by * ax
    # an edge through the ray: decide it exactly in float64, so that the two
    # triangles sharing the edge agree on which side the ray passes
    if u == _F32_ZERO or v == _F32_ZERO or w == _F32_ZERO:
        u = np.float32(np.float64(cx) * np.float64(by) - np.float64(cy) * np.float64(bx))
        v = np.float32(np.float64(ax) * np.float64(cy) - np.float64(ay) * np.float64(cx))
        w = np.float32(np.float64(bx) * np.float64(ay) - np.float64(by) * np.float64(ax))
    if (u < _F32_ZERO or v < _F32_ZERO or w < _F32_ZERO) and \
            (u > _F32_ZERO or v > _F32_ZERO or w > _F32_ZERO):
        return False, _F32_ZERO, _F32_ZERO, _F32_ZERO, _F32_ONE
    det = (u + v) + w
    if det == _F32_ZERO:
        return False, _F32_ZERO, _F32_ZERO, _F32_ZERO, _F32_ONE
    az_ = sz * akz
    bz_ = sz * bkz
    cz_ = sz * ckz
    big_t = (u * az_ + v * bz_) + w * cz_
    t = big_t / det
    # a t beyond float32's range (T overflowed) is no hit: hits have a finite t
    if not (t >= tmin and t <= tmax) or abs(t) == _F32_INF:
        return False, _F32_ZERO, _F32_ZERO, _F32_ZERO, _F32_ONE
    return True, t, v, w, det


@numba.njit(cache=True, error_model="numpy")
def _clip_slab(lo, hi, o, inv, t0, t1):
    # a direction component of 0 (infinite reciprocal) keeps the ray only when
    # its origin lies inside the slab, instead of computing 0 * inf = NaN
    if abs(inv) == _F32_INF:
        return o >= lo and o <= hi, t0, t1
    ta = (lo - o) * inv
    tb = (hi - o) * inv
    return True, max(t0, min(ta, tb)), min(t1, max(ta, tb))


@numba.njit(cache=True, error_model="numpy")
def _ray_extent(o, box):
    # largest coordinate difference between the origin and the root box: the
    # scale of every rounding error of this ray
    e = _F32_ZERO
    for k in range(3):
        e = max(e, abs(box[0, k] - o[k]), abs(box[1, k] - o[k]))
    return e


def pack_triangles(vertices, faces, tri_ids, scale):
    """The scaled vertices of the listed triangles, one row each.

    Parameters
    ----------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
    tri_ids : (num,) int
    scale : float32
        The trace scale (a power of two).

    Returns
    -------
    (num, 9) float32
        ``v0 v1 v2`` (x, y, z each) of ``faces[tri_ids]``, times ``scale``.
    """
    scaled = vertices * np.float32(scale)
    return np.ascontiguousarray(scaled[faces[tri_ids]].reshape(-1, 9), dtype=np.float32)
