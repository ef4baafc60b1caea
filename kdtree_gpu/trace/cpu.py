"""CPU ray queries (numba): kd-tree traversal and the brute-force oracle.

These are the compiled backends behind :mod:`kdtree_gpu.trace`, which
checks the user's input and calls the functions below with contiguous
float32 arrays. The GPU versions are in :mod:`kdtree_gpu.trace.gpu`
(``kdtree_gpu/cuda/traverse.cu``, ``watertight.cuh``); both follow the same
conventions, so that they decide alike.

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

Traversal (pbrt's ``KdTreeAggregate``, front to back with a stack): the ray
is clipped to the root box; at an interior node the split plane's ``t``
decides whether the near child, the far child or both (near first, far
pushed) are visited. A leaf's triangles are tested against the whole ray
interval ``[tmin, closest hit so far]``, never the leaf's own interval (a
triangle referenced by several leaves is accepted wherever it is met), so
node intervals only decide which children are visited. Those decisions keep
a child whenever the plane is within ``t_eps`` of the node's interval
(``t_eps = TRAVERSE_EPS`` times the largest coordinate difference between
the origin and the root box, divided by ``|d[kz]|``), which covers rounding:
rays through an edge or vertex on a split plane reach both sides. A pushed
far child keeps ``fmaxf(t_split, t_near)``, the near child continues with
``fminf(t_split, t_far)`` (a NaN ``t_split``, a ray in the plane, keeps the
interval, as CUDA's ``fmaxf``/``fminf`` do). After a leaf the traversal
stops when the closest hit ``t <= `` the leaf's ``t_max``: every node still
on the stack lies beyond it.

How the CPU runs it
-------------------
* The tree is read from a layout made once per tree and kept in its cache
  (:func:`cpu_layout`): 8-byte nodes (:func:`kdtree_gpu.encoding.pack_nodes`,
  split positions times ``s``) and the scaled vertices of every triangle in
  one row of 9 floats.
* Rays go in packets of :data:`LANES` (8, one AVX register of float32):
  consecutive rays with the same direction octant and the same ``kz``, so
  that all lanes order children alike and read the same coordinates of a
  triangle. A packet walks the tree once, going where any active lane goes;
  each lane keeps its own interval, stack entries and closest hit and
  decides exactly as the ray would alone, so the answers are those of
  single-ray traversal, bit for bit (a lane is active in a node only if
  the lone ray would visit it, and visits its nodes in the same order).
* Incoherent rays (a path tracer's bounces) are first put in an order
  where neighbours start close together and point alike (:func:`ray_order`:
  a radix sort on the octant, ``kz``, and Morton codes of the origin's cell
  in the root box and of the direction), so that packets fill up and
  neighbouring rays find the same nodes in the cache; rays that come
  coherent (a camera's, row by row) keep their order. Each answer is
  written at its ray's own index.
* Chunks of :data:`RAY_CHUNK` rays go to whichever core is free (numba
  ``prange``, chunk size 1).

The brute-force oracle tests every non-degenerate triangle, one ray at a
time with the scalar test :func:`hit_triangle`. To keep it usable on 100k
rays x 100k triangles, triangles are grouped into clusters of
:data:`CLUSTER_SIZE` (Morton order of their box centres), clusters into
groups of :data:`GROUP_SIZE`, and a group or cluster is skipped when the ray
misses its box padded by ``BRUTE_PAD`` times the scene
extent seen from the origin; that padding is orders of magnitude above the
rounding of the triangle test, so skipping never changes the result
(``cull=False`` tests every triangle, and a test checks both agree).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, models, register_model

from .. import encoding as enc
from ..mesh import degenerate_mask
from .scale import trace_scale

# 2^-18, as KD_TRAVERSE_EPS in kdtree_gpu/cuda/traverse.cu
TRAVERSE_EPS = np.float32(enc.TRAVERSE_EPS)
CLUSTER_SIZE = 16
GROUP_SIZE = 16  # clusters per group: a second level of boxes for the brute force
BRUTE_PAD = 1e-4
# rays per parallel task: large enough to amortize the task and its stack,
# small enough that the cores share the work of a frame evenly
RAY_CHUNK = 1024
BRUTE_CHUNK = 16  # rays per parallel task of the brute force
# the ray order: bits per axis of the origin's cell in the root box and of the
# direction's cell in the rays' direction box; rays below SORT_MIN_RAYS keep
# their order
ORIGIN_BITS = 5
DIRECTION_BITS = 2
SORT_MIN_RAYS = 8192

_F32_INF = np.float32(np.inf)
_F32_ZERO = np.float32(0.0)
_F32_ONE = np.float32(1.0)
_AXIS_MASK = np.int32(enc.PACK_AXIS_MASK)
_PACK_SHIFT = np.int32(enc.PACK_SHIFT)
_AXIS_LEAF = np.int32(enc.AXIS_LEAF)


# --- the watertight test ------------------------------------------------------
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


# --- eight rays at once: float32 vectors for the packet traversal -----------------
# numba has no SIMD type; _Vec8 is one, an LLVM <8 x float> held in a
# register, and the intrinsics below compile each operation to one AVX
# instruction (vsubps, vmulps, vcmpps, ...), rounded as the scalar operation
# is (no fast-math flags: nothing is contracted into an FMA). Comparisons
# give the lanes' results as the bits of an int (bit l: lane l).
LANES = 8
_I32 = ir.IntType(32)
_VEC = ir.VectorType(ir.FloatType(), LANES)


class _Vec8(types.Type):
    def __init__(self):
        super().__init__(name="float32x8")


_vec8 = _Vec8()


@register_model(_Vec8)
class _Vec8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VEC)


def _mask(builder, bits):
    # the low 8 bits of an int64 as <8 x i1>
    return builder.bitcast(builder.trunc(bits, ir.IntType(LANES)),
                           ir.VectorType(ir.IntType(1), LANES))


def _arith(op):
    @intrinsic
    def arith(typingctx, a, b):
        if a != _vec8 or b != _vec8:
            return None

        def codegen(context, builder, signature, args):
            return getattr(builder, op)(args[0], args[1])
        return _vec8(_vec8, _vec8), codegen
    return arith


def _compare(op, ordered=True):
    @intrinsic
    def compare(typingctx, a, b):
        if a != _vec8 or b != _vec8:
            return None

        def codegen(context, builder, signature, args):
            cmp = builder.fcmp_ordered if ordered else builder.fcmp_unordered
            bits = builder.bitcast(cmp(op, args[0], args[1]), ir.IntType(LANES))
            return builder.zext(bits, ir.IntType(64))
        return types.int64(_vec8, _vec8), codegen
    return compare


_vadd, _vsub, _vmul, _vdiv = (_arith(op) for op in ("fadd", "fsub", "fmul", "fdiv"))
_vlt, _vgt, _vle, _vge, _veq = (_compare(op) for op in ("<", ">", "<=", ">=", "=="))
_vne = _compare("!=", ordered=False)  # true for NaN, as Python's !=


@intrinsic
def _vsel(typingctx, bits, a, b):
    """Lane l: a[l] where bit l of bits is set, else b[l]."""
    if not isinstance(bits, types.Integer) or a != _vec8 or b != _vec8:
        return None

    def codegen(context, builder, signature, args):
        bits64 = context.cast(builder, args[0], signature.args[0], types.int64)
        return builder.select(_mask(builder, bits64), args[1], args[2])
    return _vec8(bits, _vec8, _vec8), codegen


@intrinsic
def _vedge64(typingctx, a1, b1, a2, b2):
    """float32(float64(a1) * b1 - float64(a2) * b2) per lane: exact products."""
    if any(x != _vec8 for x in (a1, b1, a2, b2)):
        return None

    def codegen(context, builder, signature, args):
        vd = ir.VectorType(ir.DoubleType(), LANES)
        x1, y1, x2, y2 = (builder.fpext(x, vd) for x in args)
        return builder.fptrunc(builder.fsub(builder.fmul(x1, y1), builder.fmul(x2, y2)), _VEC)
    return _vec8(_vec8, _vec8, _vec8, _vec8), codegen


@intrinsic
def _splat(typingctx, x):
    """Every lane x (a float32)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        one = builder.insert_element(ir.Constant(_VEC, ir.Undefined), args[0],
                                     ir.Constant(_I32, 0))
        return builder.shuffle_vector(one, ir.Constant(_VEC, ir.Undefined),
                                      ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))
    return _vec8(x), codegen


@intrinsic
def _lane(typingctx, a, k):
    """Lane k of a."""
    if a != _vec8 or not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        index = context.cast(builder, args[1], signature.args[1], types.int32)
        return builder.extract_element(args[0], index)
    return types.float32(_vec8, k), codegen


@intrinsic
def _vload(typingctx, arr, start):
    """Lanes arr[start:start + 8] of a contiguous float32 array."""
    if not isinstance(arr, types.Array) or arr.dtype != types.float32:
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        index = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(data, [index]), _VEC.as_pointer())
        return builder.load(ptr, align=4)
    return _vec8(arr, start), codegen


@intrinsic
def _vstore(typingctx, arr, start, a):
    """arr[start:start + 8] = the lanes of a."""
    if not isinstance(arr, types.Array) or arr.dtype != types.float32 or a != _vec8:
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        index = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(data, [index]), _VEC.as_pointer())
        builder.store(args[2], ptr, align=4)
        return context.get_dummy_value()
    return types.none(arr, start, _vec8), codegen


@numba.njit(cache=True, error_model="numpy", inline="always")
def _vmin(a, b):
    # fminf(a, b) where only a may be NaN: b then (the GPU's fminf(ts, tf))
    return _vsel(_vlt(a, b), a, b)


@numba.njit(cache=True, error_model="numpy", inline="always")
def _vmax(a, b):
    return _vsel(_vgt(a, b), a, b)


# --- kd-tree traversal, a packet of rays at a time ------------------------------
@numba.njit(cache=True, error_model="numpy")
def _trace_packets(nodes, splits, tris, tri_ids, box, scale, origins, directions, ray_tmin,
                   ray_tmax, any_hit, begin, end, stack_size, hit_t, hit_tri, hit_u, hit_v,
                   order):
    # Rays order[begin:end] in packets of up to LANES (module docstring). For
    # any hit, hit_tri is 1 or -1.
    f32 = np.float32
    P = LANES
    # the packet's lanes, written ray by ray, then read as vectors
    lane = np.zeros((14, P), f32)
    lane_ray = np.empty(P, np.int64)
    best_tri = np.empty(P, np.int64)
    st_node = np.empty(stack_size, np.int64)
    st_bits = np.empty(stack_size, np.int64)
    st_tn = np.empty(stack_size * P, f32)
    st_tf = np.empty(stack_size * P, f32)
    lo_x, lo_y, lo_z = box[0], box[1], box[2]
    hi_x, hi_y, hi_z = box[3], box[4], box[5]
    zero8 = _splat(_F32_ZERO)
    inf8 = _splat(_F32_INF)
    minus_inf8 = _splat(-_F32_INF)
    r = begin
    while r < end:
        # Gather up to LANES rays (in order) that reach the root box and share
        # the octant and kz: every lane then orders children alike and reads
        # the same vertex coordinates
        nl = 0
        pk_neg = -1
        pk_kx = pk_ky = pk_kz = 0
        lane[:, :] = _F32_ZERO
        while r < end and nl < P:
            i = order[r]
            ox = origins[i, 0] * scale
            oy = origins[i, 1] * scale
            oz = origins[i, 2] * scale
            dx = directions[i, 0] * scale
            dy = directions[i, 1] * scale
            dz = directions[i, 2] * scale
            tmin = ray_tmin[i]
            tmax = ray_tmax[i]
            kx, ky, kz, sx, sy, sz = setup_watertight(dx, dy, dz)
            neg_mask = (1 if np.signbit(dx) else 0) | (2 if np.signbit(dy) else 0) | \
                (4 if np.signbit(dz) else 0)
            if nl > 0 and (neg_mask != pk_neg or kz != pk_kz):
                break
            hit_tri[i] = -1
            hit_t[i] = _F32_INF
            hit_u[i] = _F32_ZERO
            hit_v[i] = _F32_ZERO
            r += 1
            if abs(sz) == _F32_INF or not (tmin <= tmax):
                continue
            ix = _F32_ONE / dx
            iy = _F32_ONE / dy
            iz = _F32_ONE / dz
            t0, t1 = tmin, tmax
            in_x, t0, t1 = _clip_slab(lo_x, hi_x, ox, ix, t0, t1)
            in_y, t0, t1 = _clip_slab(lo_y, hi_y, oy, iy, t0, t1)
            in_z, t0, t1 = _clip_slab(lo_z, hi_z, oz, iz, t0, t1)
            extent = max(max(max(_F32_ZERO, abs(lo_x - ox)), abs(hi_x - ox)),
                         max(abs(lo_y - oy), abs(hi_y - oy)),
                         max(abs(lo_z - oz), abs(hi_z - oz)))
            t_eps = TRAVERSE_EPS * extent * abs(sz)
            if not (in_x and in_y and in_z) or not (t0 <= t1 + t_eps):
                continue
            if nl == 0:
                pk_neg, pk_kx, pk_ky, pk_kz = neg_mask, kx, ky, kz
            lane_ray[nl] = i
            lane[0, nl], lane[1, nl], lane[2, nl] = ox, oy, oz
            lane[3, nl], lane[4, nl], lane[5, nl] = ix, iy, iz
            lane[6, nl], lane[7, nl], lane[8, nl] = sx, sy, sz
            lane[9, nl] = t_eps
            lane[10, nl], lane[11, nl] = tmin, tmax
            lane[12, nl], lane[13, nl] = t0, t1
            nl += 1
        if nl == 0:
            continue
        o_x, o_y, o_z = _vload(lane[0], 0), _vload(lane[1], 0), _vload(lane[2], 0)
        i_x, i_y, i_z = _vload(lane[3], 0), _vload(lane[4], 0), _vload(lane[5], 0)
        v_sx, v_sy, v_sz = _vload(lane[6], 0), _vload(lane[7], 0), _vload(lane[8], 0)
        v_eps = _vload(lane[9], 0)
        v_tmin, v_tmax = _vload(lane[10], 0), _vload(lane[11], 0)
        tn, tf = _vload(lane[12], 0), _vload(lane[13], 0)
        o_kx = o_x if pk_kx == 0 else (o_y if pk_kx == 1 else o_z)
        o_ky = o_x if pk_ky == 0 else (o_y if pk_ky == 1 else o_z)
        o_kz = o_x if pk_kz == 0 else (o_y if pk_kz == 1 else o_z)
        best_t = v_tmax
        best_v, best_w, best_det = zero8, zero8, _splat(_F32_ONE)
        for l in range(P):
            best_tri[l] = -1
        has_hit = 0       # bit l: lane l has a hit
        done = 0          # bit l: lane l has finished
        act = (1 << nl) - 1

        sp = 0
        node = 0
        while True:
            # Descend to a leaf: each lane decides as a lone ray would; the
            # packet goes where any active lane goes, the near child first
            word = nodes[np.uint32(2 * node + 1)]
            axis = word & _AXIS_MASK
            while axis != _AXIS_LEAF:
                left = word >> _PACK_SHIFT
                neg = (pk_neg >> axis) & 1
                first = left + neg
                second = left + (1 - neg)
                o_a = o_x if axis == 0 else (o_y if axis == 1 else o_z)
                i_a = i_x if axis == 0 else (i_y if axis == 1 else i_z)
                ts = _vmul(_vsub(_splat(splits[np.uint32(2 * node)]), o_a), i_a)
                near_only = _vgt(ts, _vadd(tf, v_eps))
                far_only = _vlt(ts, _vsub(tn, v_eps)) & ~near_only
                go_first = act & ~far_only
                go_second = act & ~near_only
                if go_first != 0 and go_second != 0:
                    both = ~(near_only | far_only)
                    # fmaxf / fminf, as on the GPU: a NaN ts keeps tn and tf
                    _vstore(st_tn, P * sp, _vsel(both, _vmax(ts, tn), tn))
                    _vstore(st_tf, P * sp, tf)
                    st_node[np.uint32(sp)] = second
                    st_bits[np.uint32(sp)] = go_second
                    sp += 1
                    tf = _vsel(both, _vmin(ts, tf), tf)
                    node = first
                    act = go_first
                elif go_first != 0:
                    node = first
                    act = go_first
                else:
                    node = second
                    act = go_second
                word = nodes[np.uint32(2 * node + 1)]
                axis = word & _AXIS_MASK

            # Test the leaf's triangles against each active lane's whole interval
            start = word >> _PACK_SHIFT
            for j in range(start, start + nodes[np.uint32(2 * node)]):
                tri = tri_ids[np.uint32(j)]
                q = np.uint32(9 * tri)
                akz = _vsub(_splat(tris[q + pk_kz]), o_kz)
                bkz = _vsub(_splat(tris[q + 3 + pk_kz]), o_kz)
                ckz = _vsub(_splat(tris[q + 6 + pk_kz]), o_kz)
                ax = _vsub(_vsub(_splat(tris[q + pk_kx]), o_kx), _vmul(v_sx, akz))
                ay = _vsub(_vsub(_splat(tris[q + pk_ky]), o_ky), _vmul(v_sy, akz))
                bx = _vsub(_vsub(_splat(tris[q + 3 + pk_kx]), o_kx), _vmul(v_sx, bkz))
                by = _vsub(_vsub(_splat(tris[q + 3 + pk_ky]), o_ky), _vmul(v_sy, bkz))
                cx = _vsub(_vsub(_splat(tris[q + 6 + pk_kx]), o_kx), _vmul(v_sx, ckz))
                cy = _vsub(_vsub(_splat(tris[q + 6 + pk_ky]), o_ky), _vmul(v_sy, ckz))
                u = _vsub(_vmul(cx, by), _vmul(cy, bx))
                v = _vsub(_vmul(ax, cy), _vmul(ay, cx))
                w = _vsub(_vmul(bx, ay), _vmul(by, ax))
                # an edge through a lane's ray: that lane decides in float64
                exact = (_veq(u, zero8) | _veq(v, zero8) | _veq(w, zero8)) & act
                if exact != 0:
                    u = _vsel(exact, _vedge64(cx, by, cy, bx), u)
                    v = _vsel(exact, _vedge64(ax, cy, ay, cx), v)
                    w = _vsel(exact, _vedge64(bx, ay, by, ax), w)
                mixed = (_vlt(u, zero8) | _vlt(v, zero8) | _vlt(w, zero8)) & \
                    (_vgt(u, zero8) | _vgt(v, zero8) | _vgt(w, zero8))
                det = _vadd(_vadd(u, v), w)
                big_t = _vadd(_vadd(_vmul(u, _vmul(v_sz, akz)), _vmul(v, _vmul(v_sz, bkz))),
                              _vmul(w, _vmul(v_sz, ckz)))
                t = _vdiv(big_t, det)
                limit = v_tmax if any_hit else best_t
                hits = act & ~mixed & _vne(det, zero8) & _vge(t, v_tmin) & _vle(t, limit) & \
                    _vne(t, inf8) & _vne(t, minus_inf8)
                if hits == 0:
                    continue
                if any_hit:
                    has_hit |= hits
                    done |= hits
                    act &= ~hits
                    continue
                # equal t: the lowest triangle id wins, as in the brute force
                better = 0
                for l in range(P):
                    if (hits >> l) & 1 and (best_tri[l] < 0 or _lane(t, l) < _lane(best_t, l) or
                                            tri < best_tri[l]):
                        better |= 1 << l
                        best_tri[l] = tri
                best_t = _vsel(better, t, best_t)
                best_v = _vsel(better, v, best_v)
                best_w = _vsel(better, w, best_w)
                best_det = _vsel(better, det, best_det)
                has_hit |= better

            # Lanes whose closest hit lies before everything on the stack are done
            done |= act & has_hit & _vle(best_t, tf)
            act = 0
            while sp > 0 and act == 0:
                sp -= 1
                node = st_node[np.uint32(sp)]
                act = st_bits[np.uint32(sp)] & ~done
                tn = _vload(st_tn, P * sp)
                tf = _vload(st_tf, P * sp)
            if act == 0:
                break

        for l in range(nl):
            i = lane_ray[l]
            if (has_hit >> l) & 1:
                if any_hit:
                    hit_tri[i] = 1
                else:
                    hit_tri[i] = best_tri[l]
                    hit_t[i] = _lane(best_t, l)
                    hit_u[i] = _lane(best_v, l) / _lane(best_det, l)
                    hit_v[i] = _lane(best_w, l) / _lane(best_det, l)


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _trace_rays(nodes, splits, tris, tri_ids, box, scale, origins, directions, ray_tmin,
                ray_tmax, any_hit, stack_size, hit_t, hit_tri, hit_u, hit_v, order):
    num_rays = origins.shape[0]
    num_chunks = (num_rays + RAY_CHUNK - 1) // RAY_CHUNK
    for c in numba.prange(num_chunks):
        _trace_packets(nodes, splits, tris, tri_ids, box, scale, origins, directions, ray_tmin,
                       ray_tmax, any_hit, c * RAY_CHUNK, min(num_rays, (c + 1) * RAY_CHUNK),
                       stack_size, hit_t, hit_tri, hit_u, hit_v, order)


# --- the order rays are traced in ----------------------------------------------
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


@numba.njit(cache=True, error_model="numpy")
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
def _direction_box(directions):
    # per-axis minimum and maximum of the directions: (2, 3)
    lx = ly = lz = _F32_INF
    hx = hy = hz = -_F32_INF
    for i in range(directions.shape[0]):
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


@numba.njit(cache=True, error_model="numpy")
def _ray_keys(origins, directions, grid, keys):
    # one core: waking the others costs more than this pass
    for i in range(origins.shape[0]):
        keys[i] = _ray_key(origins, directions, i, grid)


@numba.njit(cache=True, error_model="numpy")
def _radix_order(keys, bits):
    # stable LSD radix sort of keys below 2**bits in two passes, moving
    # (key, index) pairs; returns the order
    n = keys.shape[0]
    lo_bits = (bits + 1) // 2
    lo_mask = np.uint32((1 << lo_bits) - 1)
    buckets = 1 << lo_bits
    count_lo = np.zeros(buckets + 1, np.int64)
    count_hi = np.zeros(buckets + 1, np.int64)
    for r in range(n):
        k = keys[r]
        count_lo[(k & lo_mask) + 1] += 1
        count_hi[(k >> np.uint32(lo_bits)) + 1] += 1
    for b in range(buckets):
        count_lo[b + 1] += count_lo[b]
        count_hi[b + 1] += count_hi[b]
    k1 = np.empty(n, np.uint32)
    i1 = np.empty(n, np.int32)
    for r in range(n):
        k = keys[r]
        b = k & lo_mask
        p = count_lo[b]
        k1[p] = k
        i1[p] = r
        count_lo[b] = p + 1
    order = np.empty(n, np.int32)
    for r in range(n):
        b = k1[r] >> np.uint32(lo_bits)
        p = count_hi[b]
        order[p] = i1[r]
        count_hi[b] = p + 1
    return order


def ray_order(box, origins, directions):
    """The order to trace rays in: neighbours start close together and point alike.

    Parameters
    ----------
    box : (2, 3) float32
        The root box (unscaled).
    origins, directions : (num_rays, 3) float32

    Returns
    -------
    (num_rays,) int32 or None
        ``order[r]`` is the ray traced ``r``-th. None when the rays keep their
        order: fewer than :data:`SORT_MIN_RAYS`, or coherent already (most
        neighbours share their cells and octant, as a camera's rays row by row
        do).
    """
    n = origins.shape[0]
    if n < SORT_MIN_RAYS:
        return None
    dbox = _direction_box(directions)
    grid = np.empty((4, 3), np.float32)
    for row, (lo, hi), bits in ((0, box, ORIGIN_BITS), (2, dbox, DIRECTION_BITS)):
        grid[row] = lo
        extent = np.maximum(hi.astype(np.float64) - lo, 1e-30)
        grid[row + 1] = ((1 << bits) / extent).astype(np.float32)
    if _coherent(origins, directions, grid, 256):
        return None
    keys = np.empty(n, np.uint32)
    _ray_keys(origins, directions, grid, keys)
    return _radix_order(keys, _KEY_BITS)


# --- the tree as the CPU reads it -------------------------------------------------
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


class CpuLayout:
    """A tree's traversal data on the CPU (made once, kept in the tree's cache).

    Attributes
    ----------
    scale : float32
        The trace scale of the root box.
    bounds : (2, 3) float32
        The root box (unscaled).
    box : (6,) float32
        The root box times ``scale``: ``lo_x, lo_y, lo_z, hi_x, hi_y, hi_z``.
    nodes : (2 * num_nodes,) int32
        Packed nodes (:func:`kdtree_gpu.encoding.pack_nodes`), node ``i`` in
        ``nodes[2 i : 2 i + 2]``, split positions times ``scale``.
    splits : (2 * num_nodes,) float32
        The same memory as ``nodes``, read as float32 (``splits[2 i]``).
    tris : (9 * num_triangles,) float32
        Scaled vertices of every triangle, ``v0 v1 v2`` (x, y, z each).
    tri_ids : (num_refs,) int32
        ``leaf_tris``.
    stack_size : int
        Entries of the traversal stack (the tree's depth + 1).
    """

    def __init__(self, tree):
        from ..tree.check import walk_levels

        self.bounds = np.ascontiguousarray(tree.bounds, dtype=np.float32)
        self.scale = trace_scale(self.bounds)
        self.box = (self.bounds * self.scale).reshape(-1)
        split = (np.asarray(tree.node_split, dtype=np.float32) * self.scale).astype(np.float32)
        self.nodes = enc.pack_nodes(tree.node_axis, split, tree.node_child,
                                    tree.node_count).reshape(-1)
        self.splits = self.nodes.view(np.float32)
        self.tri_ids = np.ascontiguousarray(tree.leaf_tris, dtype=np.int32)
        self.tris = pack_triangles(tree.vertices, tree.faces, np.arange(tree.num_triangles),
                                   self.scale).reshape(-1)
        self.stack_size = int(walk_levels(tree)[0].max()) + 1


_LAYOUT_ARRAYS = ("node_axis", "node_split", "node_child", "node_count", "leaf_tris", "bounds",
                  "vertices", "faces")


def cpu_layout(tree) -> CpuLayout:
    """The tree's CPU traversal layout, made on first use and cached on the tree."""
    key = tuple(id(getattr(tree, name)) for name in _LAYOUT_ARRAYS)
    cached = tree._device_cache.get("cpu_layout")
    if cached is not None and cached[0] == key:
        return cached[1]
    layout = CpuLayout(tree)
    tree._device_cache["cpu_layout"] = (key, layout)
    return layout


def _run_tree(tree, origins, directions, tmin, tmax, any_hit):
    num_rays = origins.shape[0]
    hit_t = np.empty(num_rays, np.float32)
    hit_tri = np.empty(num_rays, np.int32)
    hit_u = np.empty(num_rays, np.float32)
    hit_v = np.empty(num_rays, np.float32)
    if not num_rays:
        return hit_t, hit_tri, hit_u, hit_v
    lay = cpu_layout(tree)
    order = ray_order(lay.bounds, origins, directions)
    if order is None:
        order = np.arange(num_rays, dtype=np.int32)
    # chunks go to whichever core is free (the rays of a frame differ in cost)
    with numba.parallel_chunksize(1):
        _trace_rays(lay.nodes, lay.splits, lay.tris, lay.tri_ids, lay.box, lay.scale, origins,
                    directions, tmin, tmax, any_hit, lay.stack_size, hit_t, hit_tri, hit_u,
                    hit_v, order)
    return hit_t, hit_tri, hit_u, hit_v


@numba.njit(cache=True, error_model="numpy")
def _ray_problems(origins, directions, tmin, tmax, problem):
    scalar_t0, scalar_t1 = tmin.shape[0] == 1, tmax.shape[0] == 1
    for i in range(origins.shape[0]):
        o0, o1, o2 = origins[i, 0], origins[i, 1], origins[i, 2]
        d0, d1, d2 = directions[i, 0], directions[i, 1], directions[i, 2]
        t0 = tmin[0] if scalar_t0 else tmin[i]
        t1 = tmax[0] if scalar_t1 else tmax[i]
        # the earliest failing check wins, in the order of kd_ray_problem
        if not (np.isfinite(o0) and np.isfinite(o1) and np.isfinite(o2)):
            problem[i] = enc.RAY_BAD_ORIGIN
        elif not (np.isfinite(d0) and np.isfinite(d1) and np.isfinite(d2)):
            problem[i] = enc.RAY_BAD_DIRECTION
        elif d0 == _F32_ZERO and d1 == _F32_ZERO and d2 == _F32_ZERO:
            problem[i] = enc.RAY_ZERO_DIRECTION
        elif np.isnan(t0):
            problem[i] = enc.RAY_NAN_TMIN
        elif np.isnan(t1):
            problem[i] = enc.RAY_NAN_TMAX
        elif t0 > t1:
            problem[i] = enc.RAY_EMPTY_INTERVAL
        else:
            problem[i] = 0


def ray_problems_cpu(origins, directions, tmin, tmax):
    """The problem of every ray (``encoding.RAY_BAD_*``, 0 for a good ray), compiled.

    The same answer as :func:`kdtree_gpu.trace.api.ray_problems` in one pass
    over the rays (that NumPy version takes about as long as tracing 1M
    camera rays; the public call can use this one instead).

    Parameters
    ----------
    origins, directions : (num_rays, 3) float32, C-contiguous
    tmin, tmax : float or (num_rays,) float32

    Returns
    -------
    (num_rays,) int8
    """
    problem = np.empty(origins.shape[0], np.int8)
    t0 = np.ascontiguousarray(np.asarray(tmin, np.float32).reshape(-1))
    t1 = np.ascontiguousarray(np.asarray(tmax, np.float32).reshape(-1))
    if origins.shape[0]:
        _ray_problems(origins, directions, t0, t1, problem)
    return problem


def intersect_cpu(tree, origins, directions, tmin, tmax):
    """Closest hit of each ray by kd-tree traversal (numba, all CPU cores).

    Parameters
    ----------
    tree : KdTree
    origins, directions : (num_rays, 3) float32, C-contiguous
    tmin, tmax : (num_rays,) float32

    Returns
    -------
    t : (num_rays,) float32
        ``inf`` on a miss.
    tri : (num_rays,) int32
        Triangle id, ``-1`` on a miss.
    u, v : (num_rays,) float32
        Barycentrics of ``v1`` and ``v2`` (0 on a miss).
    """
    return _run_tree(tree, origins, directions, tmin, tmax, False)


def occluded_cpu(tree, origins, directions, tmin, tmax):
    """Whether each ray hits any triangle with ``tmin <= t <= tmax`` (kd-tree).

    Parameters
    ----------
    tree : KdTree
    origins, directions : (num_rays, 3) float32, C-contiguous
    tmin, tmax : (num_rays,) float32

    Returns
    -------
    (num_rays,) bool
    """
    return _run_tree(tree, origins, directions, tmin, tmax, True)[1] > 0


# --- brute force ------------------------------------------------------------------
@numba.njit(cache=True, error_model="numpy")
def _ray_meets_box(ox, oy, oz, ix, iy, iz, lx, ly, lz, hx, hy, hz, pad, t_lo, t_hi):
    # float64 slab test of the ray (origin o, reciprocal direction i) against
    # the box [l, h] grown by pad; True when its segment [t_lo, t_hi] may touch it
    t0, t1 = t_lo, t_hi
    for k in range(3):
        o = ox if k == 0 else (oy if k == 1 else oz)
        inv = ix if k == 0 else (iy if k == 1 else iz)
        lo = (lx if k == 0 else (ly if k == 1 else lz)) - pad
        hi = (hx if k == 0 else (hy if k == 1 else hz)) + pad
        if inv == np.inf or inv == -np.inf:
            if o < lo or o > hi:
                return False
            continue
        ta = (lo - o) * inv
        tb = (hi - o) * inv
        if ta > tb:
            ta, tb = tb, ta
        t0 = max(t0, ta)
        t1 = min(t1, tb)
    return t0 <= t1


@numba.njit(cache=True, error_model="numpy")
def _brute_chunk(tris, tri_ids, cluster_start, cluster_lo, cluster_hi, group_lo, group_hi, box,
                 scale, origins, directions, ray_tmin, ray_tmax, any_hit, cull, begin, end,
                 hit_t, hit_tri, hit_u, hit_v):
    # Rays begin..end-1 against every triangle, in scaled space as the traversal
    num_clusters = cluster_lo.shape[0]
    o = np.empty(3, np.float32)
    d = np.empty(3, np.float32)
    for i in range(begin, end):
        hit_tri[i] = -1
        hit_t[i] = _F32_INF
        hit_u[i] = _F32_ZERO
        hit_v[i] = _F32_ZERO
        for k in range(3):
            o[k] = origins[i, k] * scale
            d[k] = directions[i, k] * scale
        tmin, tmax = ray_tmin[i], ray_tmax[i]
        kx, ky, kz, sx, sy, sz = setup_watertight(d[0], d[1], d[2])
        if abs(sz) == _F32_INF or not (tmin <= tmax):
            continue
        okx, oky, okz = o[kx], o[ky], o[kz]
        ox, oy, oz = np.float64(o[0]), np.float64(o[1]), np.float64(o[2])
        ix, iy, iz = 1.0 / np.float64(d[0]), 1.0 / np.float64(d[1]), 1.0 / np.float64(d[2])
        dmax = np.float64(max(abs(d[0]), abs(d[1]), abs(d[2])))
        pad = BRUTE_PAD * np.float64(_ray_extent(o, box))
        best_t = tmax
        best_tri = -1
        best_v, best_w, best_det = _F32_ZERO, _F32_ZERO, _F32_ONE
        done = False
        for g in range(group_lo.shape[0]):
            limit = np.float64(tmax if any_hit else best_t)
            t_pad = pad / dmax + 1e-5 * (abs(np.float64(tmin)) + abs(limit))
            if cull and not _ray_meets_box(
                    ox, oy, oz, ix, iy, iz, np.float64(group_lo[g, 0]),
                    np.float64(group_lo[g, 1]), np.float64(group_lo[g, 2]),
                    np.float64(group_hi[g, 0]), np.float64(group_hi[g, 1]),
                    np.float64(group_hi[g, 2]), pad, np.float64(tmin) - t_pad, limit + t_pad):
                continue
            for c in range(g * GROUP_SIZE, min(num_clusters, (g + 1) * GROUP_SIZE)):
                limit = np.float64(tmax if any_hit else best_t)
                t_pad = pad / dmax + 1e-5 * (abs(np.float64(tmin)) + abs(limit))
                if cull and not _ray_meets_box(
                        ox, oy, oz, ix, iy, iz, np.float64(cluster_lo[c, 0]),
                        np.float64(cluster_lo[c, 1]), np.float64(cluster_lo[c, 2]),
                        np.float64(cluster_hi[c, 0]), np.float64(cluster_hi[c, 1]),
                        np.float64(cluster_hi[c, 2]), pad, np.float64(tmin) - t_pad,
                        limit + t_pad):
                    continue
                for j in range(cluster_start[c], cluster_start[c + 1]):
                    hit, t, ev, ew, det = hit_triangle(
                        tris[j, kx] - okx, tris[j, ky] - oky, tris[j, kz] - okz,
                        tris[j, 3 + kx] - okx, tris[j, 3 + ky] - oky, tris[j, 3 + kz] - okz,
                        tris[j, 6 + kx] - okx, tris[j, 6 + ky] - oky, tris[j, 6 + kz] - okz,
                        sx, sy, sz, tmin, tmax if any_hit else best_t)
                    tri = tri_ids[j]
                    if hit and (t < best_t or best_tri < 0 or tri < best_tri):
                        best_t, best_tri, best_v, best_w, best_det = t, tri, ev, ew, det
                        if any_hit:
                            done = True
                            break
                if done:
                    break
            if done:
                break
        if best_tri >= 0:
            hit_tri[i] = best_tri
            hit_t[i] = best_t
            hit_u[i] = best_v / best_det
            hit_v[i] = best_w / best_det


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _brute_rays(tris, tri_ids, cluster_start, cluster_lo, cluster_hi, group_lo, group_hi, box,
                scale, origins, directions, ray_tmin, ray_tmax, any_hit, cull,
                hit_t, hit_tri, hit_u, hit_v):
    num_rays = origins.shape[0]
    num_chunks = (num_rays + BRUTE_CHUNK - 1) // BRUTE_CHUNK
    for c in numba.prange(num_chunks):
        _brute_chunk(tris, tri_ids, cluster_start, cluster_lo, cluster_hi, group_lo, group_hi,
                     box, scale, origins, directions, ray_tmin, ray_tmax, any_hit, cull,
                     c * BRUTE_CHUNK, min(num_rays, (c + 1) * BRUTE_CHUNK),
                     hit_t, hit_tri, hit_u, hit_v)


def cluster_triangles(vertices, faces):
    """Group the non-degenerate triangles into small clusters for the brute force.

    Parameters
    ----------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32

    Returns
    -------
    tri_ids : (num_valid,) int32
        Non-degenerate triangles in Morton order of their box centres.
    cluster_start : (num_clusters + 1,) int64
        Cluster ``c`` holds ``tri_ids[cluster_start[c]:cluster_start[c + 1]]``.
    cluster_lo, cluster_hi : (num_clusters, 3) float32
        Union of the cluster's triangle boxes.
    group_lo, group_hi : (num_groups, 3) float32
        Union of the boxes of ``GROUP_SIZE`` consecutive clusters.
    bounds : (2, 3) float32
        Union of all non-degenerate triangle boxes.
    """
    valid = np.flatnonzero(~degenerate_mask(vertices, faces)).astype(np.int32)
    corners = vertices[faces[valid]]
    tri_lo, tri_hi = corners.min(axis=1), corners.max(axis=1)
    if valid.size == 0:
        empty = np.zeros((0, 3), np.float32)
        return (valid, np.zeros(1, np.int64), empty, empty, empty, empty,
                np.zeros((2, 3), np.float32))
    bounds = np.stack([tri_lo.min(axis=0), tri_hi.max(axis=0)])
    centre = 0.5 * (tri_lo.astype(np.float64) + tri_hi)
    extent = np.maximum(bounds[1].astype(np.float64) - bounds[0], 1e-30)
    cell = np.clip(((centre - bounds[0]) / extent * 1023).astype(np.int64), 0, 1023)
    code = np.zeros(valid.size, np.int64)
    for bit in range(10):
        for k in range(3):
            code |= ((cell[:, k] >> bit) & 1) << (3 * bit + k)
    order = np.argsort(code, kind="stable")
    tri_ids = valid[order]
    cluster_start = np.append(np.arange(0, valid.size, CLUSTER_SIZE), valid.size).astype(np.int64)
    cluster_lo = np.minimum.reduceat(tri_lo[order], cluster_start[:-1], axis=0)
    cluster_hi = np.maximum.reduceat(tri_hi[order], cluster_start[:-1], axis=0)
    group_start = np.arange(0, cluster_lo.shape[0], GROUP_SIZE)
    group_lo = np.minimum.reduceat(cluster_lo, group_start, axis=0)
    group_hi = np.maximum.reduceat(cluster_hi, group_start, axis=0)
    return (tri_ids, cluster_start, cluster_lo, cluster_hi, group_lo, group_hi,
            bounds.astype(np.float32))


def brute_cpu(vertices, faces, origins, directions, tmin, tmax, any_hit=False, cull=True):
    """Closest (or any) hit of each ray over every non-degenerate triangle.

    Runs in the scaled space of the traversal: the scale is
    :func:`kdtree_gpu.trace.scale.trace_scale` of the union of the
    non-degenerate triangles' boxes, which is the root box of any tree
    built from the mesh.

    Parameters
    ----------
    vertices : (num_vertices, 3) float32, C-contiguous
    faces : (num_triangles, 3) int32, C-contiguous
    origins, directions : (num_rays, 3) float32, C-contiguous
    tmin, tmax : (num_rays,) float32
    any_hit : bool
        Stop at the first hit found (``tri`` is then some hit triangle).
    cull : bool
        Skip clusters of triangles whose padded box the ray misses (see the
        module docstring); ``False`` tests every triangle.

    Returns
    -------
    t, tri, u, v : (num_rays,) arrays
        As :func:`intersect_cpu`; ties in ``t`` go to the lowest triangle id.
    """
    tri_ids, cluster_start, cluster_lo, cluster_hi, group_lo, group_hi, bounds = \
        cluster_triangles(vertices, faces)
    scale = trace_scale(bounds)
    tris = pack_triangles(vertices, faces, tri_ids, scale)
    num_rays = origins.shape[0]
    hit_t = np.empty(num_rays, np.float32)
    hit_tri = np.empty(num_rays, np.int32)
    hit_u = np.empty(num_rays, np.float32)
    hit_v = np.empty(num_rays, np.float32)
    if num_rays:
        _brute_rays(tris, tri_ids, cluster_start, cluster_lo * scale, cluster_hi * scale,
                    group_lo * scale, group_hi * scale, bounds * scale, scale, origins,
                    directions, tmin, tmax, any_hit, cull, hit_t, hit_tri, hit_u, hit_v)
    return hit_t, hit_tri, hit_u, hit_v
