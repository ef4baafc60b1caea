"""The trace scale: rays and triangles meet in a space where coordinates are about 1.

The watertight ray-triangle test (:mod:`kdtree_gpu.trace.cpu`) multiplies
coordinates relative to the ray origin: the edge functions ``U, V, W`` are
products of two of them and ``T = U*Az + V*Bz + W*Cz`` of three. In float32
those products overflow for a mesh at 1e13 and underflow for one at 1e-15,
and hits come out at ``t = inf`` or ``t = 0``. Both backends therefore trace
in *scaled space*, where the root box's largest absolute coordinate lies in
``[1/2, 1)``. The scale is a power of two, so scaling is exact and the
answers are those of the unscaled rays.

The contract (CPU: :mod:`kdtree_gpu.trace.cpu`; GPU: ``cuda/traverse.cu``,
``cuda/brute.cu`` through :mod:`kdtree_gpu.trace.gpu`)
----------------------------------------------------------------------------
1. ``s = trace_scale(bounds)`` with ``bounds`` the tree's root box (for the
   brute force: the union of the boxes of the non-degenerate triangles, which
   is the same box). ``s = 2**k`` as a float32, ``k = -e`` where
   ``M = f * 2**e``, ``1/2 <= f < 1``, ``M`` the largest ``|coordinate|`` of
   ``bounds`` (``math.frexp``), with ``k`` clamped to ``[-126, 127]`` so that
   ``s`` is a normal float32; ``s = 1`` when ``M`` is 0 or not finite.
2. Every coordinate the ray test or the traversal reads is multiplied by
   ``s`` in float32, one rounded multiplication each, before use: vertices,
   split positions, the root box, the ray origin and the ray direction
   (``o_s = o * s``, ``d_s = d * s``). Nothing else changes: the ray checks
   (NaN, zero direction, ...) look at the unscaled ray, ``tmin`` and ``tmax``
   are not scaled, and every later operation is the unscaled algorithm run on
   the scaled values, operation by operation.
3. ``t``, ``u`` and ``v`` come back as computed in scaled space, not scaled
   back: ``o_s + t * d_s = s * (o + t * d)``, so ``t`` is the same parameter,
   and ``u = V / det``, ``v = W / det`` are ratios (``V``, ``W`` and ``det``
   all carry ``s**2``).
4. A hit must have a finite ``t``: a candidate with ``t = T / det`` infinite
   or NaN is not a hit (it can only come from ``T`` overflowing, that is from
   a hit beyond float32's range). A miss is ``t = inf``, ``tri = -1``,
   ``u = v = 0``.

Multiplying by a power of two only moves the exponent, so while no value
leaves float32's normal range the scaled computation rounds exactly as the
unscaled one: sums, differences, products and quotients of scaled values
are the scaled (or, for ``t``, ``u``, ``v``, ``Sx``, ``Sy``, the same)
results. For every mesh that worked before, traversal and brute force give
bit for bit the same ``t``, ``tri``, ``u``, ``v`` as without the scale; for
meshes far from 1 they now give the right ones.

What scaling cannot fix, and the build refuses
----------------------------------------------
In scaled space the edge functions of a triangle of size ``h`` (the largest
side of its box) are about ``(h * s)**2`` and ``T`` about that times ``t``.
:func:`kdtree_gpu.mesh.check_trace_range` raises
:class:`kdtree_gpu.mesh.MeshError` at build time (the CPU builders call it
through :func:`kdtree_gpu.mesh.prepare_mesh`; the GPU builder must call it
with the root box it computed and its smallest triangle) when

* the root box's largest absolute coordinate ``M`` is outside
  ``[MIN_COORDINATE, MAX_COORDINATE) = [2**-100, 2**100)`` (about 7.9e-31
  to 1.3e30). Rays with unit-length directions, the common case, hit at
  ``t`` of about ``M``; in this range ``t``, ``T`` and a unit direction
  times ``s`` stay inside float32's normal range with a wide margin, and
  float32 box areas in the builders stay finite;
* a non-degenerate triangle is smaller than ``MIN_SCALED_TRIANGLE / s``,
  ``MIN_SCALED_TRIANGLE = 2**-40`` (about 1e-12 of ``M``; such a triangle
  can only sit near the coordinate origin, where float32 resolves it): its
  edge functions (below ``2**-80``) and ``T`` approach float32's underflow.

Real meshes are far inside both limits (the shared meshes' smallest
triangles are above ``2**-20 / s``).

Rays are the caller's. An origin or direction whose scaled value overflows
(an origin more than ``2**127 / s`` away, where the whole mesh is below
float32's resolution of the origin anyway) gives a miss, and so does a hit
whose ``t`` (or ``T = t * det``) leaves float32's range; a direction far
from unit length on a mesh far from 1 moves ``t`` toward those limits
(directions of about the mesh's size keep ``t`` near 1).
"""

from __future__ import annotations

import math

import numpy as np

# the usable range of the root box's largest absolute coordinate
MIN_COORDINATE = 2.0 ** -100
MAX_COORDINATE = 2.0 ** 100
# the smallest triangle size (largest side of its box) in scaled space
MIN_SCALED_TRIANGLE = 2.0 ** -40
# exponents of the normal float32 powers of two
_MIN_EXPONENT, _MAX_EXPONENT = -126, 127


def largest_abs(bounds) -> float:
    """The largest absolute value of a root box's coordinates (NaN when one is NaN).

    Six numbers, as Python floats: a NumPy reduction costs several
    microseconds here, and a GPU build asks this twice.
    """
    values = [abs(x) for x in np.asarray(bounds, dtype=np.float32).ravel().tolist()]
    if any(x != x for x in values):
        return math.nan
    return max(values, default=0.0)


def scale_exponent(bounds) -> int:
    """The exponent ``k`` of the trace scale ``2**k`` of a root box.

    Parameters
    ----------
    bounds : (2, 3) array_like of float
        The root box, unscaled.

    Returns
    -------
    int
        ``-e`` with ``M = f * 2**e``, ``1/2 <= f < 1``, ``M`` the largest
        absolute coordinate of ``bounds``, clamped to ``[-126, 127]``; 0 when
        ``M`` is 0 or not finite.
    """
    return exponent_of_largest(largest_abs(bounds))


def exponent_of_largest(m: float) -> int:
    """:func:`scale_exponent` of a box whose largest absolute coordinate
    (:func:`largest_abs`) is ``m``."""
    if m == 0.0 or not math.isfinite(m):
        return 0
    _, e = math.frexp(m)
    return min(max(-e, _MIN_EXPONENT), _MAX_EXPONENT)


def trace_scale(bounds) -> np.float32:
    """The power of two that brings a root box's largest coordinate into ``[1/2, 1)``.

    Parameters
    ----------
    bounds : (2, 3) array_like of float
        The root box (``tree.bounds``), unscaled.

    Returns
    -------
    numpy.float32
        ``2**scale_exponent(bounds)``, a normal float32. Vertices, split
        positions, the root box, ray origins and directions are multiplied by
        it; ``t``, ``u``, ``v`` are unchanged (see the module docstring).
    """
    return np.float32(2.0 ** scale_exponent(bounds))
