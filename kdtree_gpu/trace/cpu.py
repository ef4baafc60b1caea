"""CPU ray queries (numba): kd-tree traversal in packets of eight rays.

These are the compiled backends behind :mod:`kdtree_gpu.trace`, which
checks the user's input and calls the functions below with contiguous
float32 arrays. The GPU versions are in :mod:`kdtree_gpu.trace.gpu`
(``kdtree_gpu/cuda/traverse.cu``); both follow the same conventions, so that
they decide alike. The ray conventions, the scaled space and the watertight
ray-triangle test are described in :mod:`kdtree_gpu.trace.watertight`; the
brute-force oracle is :mod:`kdtree_gpu.trace.brute`.

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
  (:mod:`kdtree_gpu.trace.layout`): 8-byte nodes in cache-line clusters and
  the scaled vertices of every triangle in one row of 9 floats.
* Rays go in packets of :data:`LANES` (8, one AVX register of float32):
  consecutive rays with the same direction octant and the same ``kz``, so
  that all lanes order children alike and read the same coordinates of a
  triangle. A packet walks the tree once, going where any active lane goes;
  each lane keeps its own interval, stack entries and closest hit and
  decides exactly as the ray would alone, so the answers are those of
  single-ray traversal, bit for bit (a lane is active in a node only if
  the lone ray would visit it, and visits its nodes in the same order).
* The descent is a chain: a node's choice gives the next node, whose plane
  gives the next choice. Each step therefore loads its children's words and
  computes the lanes' distances to both children's planes before making its
  own choice, so that the next step can choose at once (a pushed child keeps
  its word and distances on the stack).
* The choice itself (near child, far child or both) is a coin toss for the
  branch predictor on incoherent rays: for the rays the order sorted, each
  step writes the far child's stack entry and moves the stack pointer only
  when both children are visited, and picks the next node with selects.
  Camera rays keep the branches, which predict well there. 1M diffuse rays,
  2 cores: the traversal 1.20-1.28x faster on the bunny, 1.10-1.12x on
  conference; camera rays within the noise (``benchmarks/results/cpu_rays.md``).
* Incoherent rays are first put in an order where neighbours start close
  together and point alike (:mod:`kdtree_gpu.trace.ray_order`); rays that
  come coherent keep their order. The sorted rays are traced from copies
  made in that order (read through it, every ray's first loads missed the
  cache), and each answer goes back to its ray's own index.
* Chunks of :data:`RAY_CHUNK` rays go to whichever core is free (numba
  ``prange``, chunk size 1).
"""

from __future__ import annotations

import numba
import numpy as np

from .. import encoding as enc
from .layout import cpu_layout
from .ray_order import ray_order
from .simd import (LANES, _lane, _prefetch, _splat, _vadd, _vdiv, _vedge64, _veq, _vge, _vgt,
                   _vfar_tn, _vle, _vload, _vlt, _vmul, _vnear_tf, _vne, _vsel, _vstore,
                   _vsub)
from .watertight import _F32_INF, _F32_ONE, _F32_ZERO, _clip_slab, setup_watertight

# 2^-18, as KD_TRAVERSE_EPS in kdtree_gpu/cuda/traverse.cu
TRAVERSE_EPS = np.float32(enc.TRAVERSE_EPS)
# rays per parallel task: large enough to amortize the task and its stack,
# small enough that the cores share the work of a frame evenly
RAY_CHUNK = 1024
_AXIS_MASK = np.int32(enc.PACK_AXIS_MASK)
_PACK_SHIFT = np.int32(enc.PACK_SHIFT)
_AXIS_LEAF = np.int32(enc.AXIS_LEAF)


# --- the checks of a ray ---------------------------------------------------------
@numba.njit(cache=True, error_model="numpy")
def _ray_problem(o0, o1, o2, d0, d1, d2, t0, t1):
    # the earliest failing check wins, in the order of kd_ray_problem
    if not (np.isfinite(o0) and np.isfinite(o1) and np.isfinite(o2)):
        return enc.RAY_BAD_ORIGIN
    if not (np.isfinite(d0) and np.isfinite(d1) and np.isfinite(d2)):
        return enc.RAY_BAD_DIRECTION
    if d0 == _F32_ZERO and d1 == _F32_ZERO and d2 == _F32_ZERO:
        return enc.RAY_ZERO_DIRECTION
    if np.isnan(t0):
        return enc.RAY_NAN_TMIN
    if np.isnan(t1):
        return enc.RAY_NAN_TMAX
    if t0 > t1:
        return enc.RAY_EMPTY_INTERVAL
    return 0


@numba.njit(cache=True, error_model="numpy")
def _ray_problems(origins, directions, tmin, tmax, problem):
    scalar_t0, scalar_t1 = tmin.shape[0] == 1, tmax.shape[0] == 1
    for i in range(origins.shape[0]):
        problem[i] = _ray_problem(origins[i, 0], origins[i, 1], origins[i, 2], directions[i, 0],
                                  directions[i, 1], directions[i, 2],
                                  tmin[0] if scalar_t0 else tmin[i],
                                  tmax[0] if scalar_t1 else tmax[i])


# --- kd-tree traversal, a packet of rays at a time ------------------------------
@numba.njit(cache=True, error_model="numpy", inline="always")
def _plane_t(splits, lane_flat, node, axis):
    # the lanes' distances to node's plane on axis: rows axis and 3 + axis of
    # the lanes (origin and reciprocal direction) are loads, not branches on
    # axis; a leaf (axis 3) reads rows 3 and 6, and its result goes unused
    P = LANES
    return _vmul(_vsub(_splat(splits[np.uint32(2 * node)]), _vload(lane_flat, P * axis)),
                 _vload(lane_flat, P * (3 + axis)))


@numba.njit(cache=True, error_model="numpy")
def _trace_packets(nodes, splits, tris, tri_ids, box, scale, origins, directions, ray_tmin,
                   ray_tmax, any_hit, begin, end, stack_size, hit_t, hit_tri, hit_u, hit_v,
                   order, branch_free):
    # Rays begin..end-1 in packets of up to LANES (module docstring), each answer
    # written at the ray's place; order (empty: the identity) gives the place's
    # index among the caller's rays, which a bad ray's record names. For
    # any hit, hit_tri is 1 or -1. ray_tmin, ray_tmax: one value per ray, or
    # one for all. branch_free: the descent's choices as selects, not branches
    # (module docstring). Bad rays (_ray_problem) are misses; returns their
    # count and the least (index << RAY_KIND_BITS) | problem among them (-1: none).
    f32 = np.float32
    P = LANES
    # the packet's lanes, written ray by ray, then read as vectors
    lane = np.zeros((14, P), f32)
    lane_flat = lane.reshape(-1)
    lane_ray = np.empty(P, np.int64)
    best_tri = np.empty(P, np.int64)
    st_node = np.empty(stack_size, np.int64)
    st_bits = np.empty(stack_size, np.int64)
    st_tn = np.empty(stack_size * P, f32)
    st_tf = np.empty(stack_size * P, f32)
    st_word = np.empty(stack_size, np.int64)  # the pushed node's word
    st_ts = np.empty(stack_size * P, f32)  # and its plane's distances
    lo_x, lo_y, lo_z = box[0], box[1], box[2]
    hi_x, hi_y, hi_z = box[3], box[4], box[5]
    zero8 = _splat(_F32_ZERO)
    inf8 = _splat(_F32_INF)
    minus_inf8 = _splat(-_F32_INF)
    scalar_t0, scalar_t1 = ray_tmin.shape[0] == 1, ray_tmax.shape[0] == 1
    sorted_rays = order.shape[0] > 0
    bad_count = 0
    bad_first = -1
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
            i = r  # (sorted rays come as copies in the traced order: run_layout)
            o0, o1, o2 = origins[i, 0], origins[i, 1], origins[i, 2]
            d0, d1, d2 = directions[i, 0], directions[i, 1], directions[i, 2]
            ox, oy, oz = o0 * scale, o1 * scale, o2 * scale
            dx, dy, dz = d0 * scale, d1 * scale, d2 * scale
            tmin = ray_tmin[0] if scalar_t0 else ray_tmin[i]
            tmax = ray_tmax[0] if scalar_t1 else ray_tmax[i]
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
            if not (abs(o0) < _F32_INF and abs(o1) < _F32_INF and abs(o2) < _F32_INF and
                    abs(d0) < _F32_INF and abs(d1) < _F32_INF and abs(d2) < _F32_INF and
                    tmin <= tmax) or (d0 == _F32_ZERO and d1 == _F32_ZERO and d2 == _F32_ZERO):
                record = (np.int64(order[i] if sorted_rays else i) << enc.RAY_KIND_BITS) | \
                    _ray_problem(o0, o1, o2, d0, d1, d2, tmin, tmax)
                bad_first = record if bad_count == 0 else min(bad_first, record)
                bad_count += 1
                continue
            if abs(sz) == _F32_INF:
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
        word = nodes[1]
        ts = _plane_t(splits, lane_flat, 0, word & _AXIS_MASK)
        while True:
            # Descend to a leaf: each lane decides as a lone ray would; the
            # packet goes where any active lane goes, the near child first.
            # ts: the lanes' distances to this node's plane, computed a step
            # ahead with its sibling's, so that a step waits for its decision
            # only, not for the loads and arithmetic after it
            axis = word & _AXIS_MASK
            while axis != _AXIS_LEAF:
                left = word >> _PACK_SHIFT
                # the two cache lines after the children: their descendants in
                # the clustered layout, read next whichever way the lanes go
                _prefetch(nodes, 2 * left + 16)
                _prefetch(nodes, 2 * left + 32)
                # the children's words and planes (a leaf's "plane" is unused)
                w0 = nodes[np.uint32(2 * left + 1)]
                w1 = nodes[np.uint32(2 * left + 3)]
                ts0 = _plane_t(splits, lane_flat, left, w0 & _AXIS_MASK)
                ts1 = _plane_t(splits, lane_flat, left + 1, w1 & _AXIS_MASK)
                neg = (pk_neg >> axis) & 1
                first = left + neg
                second = left + (1 - neg)
                w_first, w_second = (w1, w0) if neg else (w0, w1)
                ts_first, ts_second = _vsel(-neg, ts1, ts0), _vsel(-neg, ts0, ts1)
                near_only = _vgt(ts, _vadd(tf, v_eps))
                far_only = _vlt(ts, _vsub(tn, v_eps)) & ~near_only
                go_first = act & ~far_only
                go_second = act & ~near_only
                # where both children are visited, the pushed far child starts
                # at fmaxf(ts, tn) and the near one ends at fminf(ts, tf), as
                # on the GPU (a NaN ts keeps tn and tf). Without selects, the
                # far child's entry is written only when it is pushed; with
                # them, always, and kept (sp moves) only when it is pushed
                push = go_first != 0 and go_second != 0
                if branch_free or push:
                    _vstore(st_tn, P * sp, _vfar_tn(ts, tn, tf, v_eps))
                    _vstore(st_tf, P * sp, tf)
                    _vstore(st_ts, P * sp, ts_second)
                    st_node[np.uint32(sp)] = second
                    st_bits[np.uint32(sp)] = go_second
                    st_word[np.uint32(sp)] = w_second
                if branch_free:
                    sp += np.int64(push)
                    # (a lane going one way only is not in both: its tf stays)
                    tf = _vnear_tf(ts, tn, tf, v_eps)
                    take = go_first != 0
                    node = first if take else second
                    act = go_first if take else go_second
                    word = w_first if take else w_second
                    ts = _vsel(-np.int64(take), ts_first, ts_second)
                elif push:
                    sp += 1
                    tf = _vnear_tf(ts, tn, tf, v_eps)
                    node, act, word, ts = first, go_first, w_first, ts_first
                elif go_first != 0:
                    node, act, word, ts = first, go_first, w_first, ts_first
                else:
                    node, act, word, ts = second, go_second, w_second, ts_second
                axis = word & _AXIS_MASK

            # Test the leaf's triangles against each active lane's whole interval
            start = word >> _PACK_SHIFT
            end_j = start + nodes[np.uint32(2 * node)]
            # their vertices first asked of memory all at once, not one by one
            # as each test reads them (1M diffuse rays, 2 cores: bunny 1.09x)
            for j in range(start, end_j):
                _prefetch(tris, 9 * tri_ids[np.uint32(j)])
            for j in range(start, end_j):
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
                ts = _vload(st_ts, P * sp)
                word = st_word[np.uint32(sp)]
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
    return bad_count, bad_first


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _trace_rays(nodes, splits, tris, tri_ids, box, scale, origins, directions, ray_tmin,
                ray_tmax, any_hit, stack_size, hit_t, hit_tri, hit_u, hit_v, order, branch_free,
                bad):
    # bad[c]: the bad rays of chunk c (count, first record)
    num_rays = origins.shape[0]
    num_chunks = (num_rays + RAY_CHUNK - 1) // RAY_CHUNK
    for c in numba.prange(num_chunks):
        bad[c, 0], bad[c, 1] = _trace_packets(
            nodes, splits, tris, tri_ids, box, scale, origins, directions, ray_tmin, ray_tmax,
            any_hit, c * RAY_CHUNK, min(num_rays, (c + 1) * RAY_CHUNK), stack_size, hit_t,
            hit_tri, hit_u, hit_v, order, branch_free)


# rays per parallel task of the copies into and out of the traced order, and how
# many rays ahead each copy asks for a ray's rows (their loads miss the cache:
# 1M rays in random order, 2 cores, 35 -> 19 ms for the rays' rows)
COPY_CHUNK = 65536
COPY_AHEAD = 32


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _gather_rays(order, origins, directions, tmin, tmax, o_out, d_out, t0_out, t1_out):
    # row r of the outputs: ray order[r] (a per-ray bound too; one for all stays)
    n = order.shape[0]
    per_ray_t0, per_ray_t1 = tmin.shape[0] > 1, tmax.shape[0] > 1
    for c in numba.prange((n + COPY_CHUNK - 1) // COPY_CHUNK):
        end = min(n, (c + 1) * COPY_CHUNK)
        for r in range(c * COPY_CHUNK, end):
            if r + COPY_AHEAD < end:
                ahead = order[r + COPY_AHEAD]
                _prefetch(origins, 3 * ahead)
                _prefetch(directions, 3 * ahead)
            i = order[r]
            for k in range(3):
                o_out[r, k] = origins[i, k]
                d_out[r, k] = directions[i, k]
            if per_ray_t0:
                t0_out[r] = tmin[i]
            if per_ray_t1:
                t1_out[r] = tmax[i]


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _scatter_hits(order, t, tri, u, v, hit_t, hit_tri, hit_u, hit_v):
    # answer r goes to ray order[r] (stores: asking ahead gained nothing)
    n = order.shape[0]
    for c in numba.prange((n + COPY_CHUNK - 1) // COPY_CHUNK):
        for r in range(c * COPY_CHUNK, min(n, (c + 1) * COPY_CHUNK)):
            i = order[r]
            hit_t[i] = t[r]
            hit_tri[i] = tri[r]
            hit_u[i] = u[r]
            hit_v[i] = v[r]


def _bound(value):
    """A ray interval bound as the kernel reads it: one float32 for all rays, or one per ray."""
    if isinstance(value, np.ndarray) and value.dtype == np.float32 and value.ndim == 1 and \
            value.flags.c_contiguous:
        return value
    return np.ascontiguousarray(np.asarray(value, np.float32).reshape(-1))


def run_layout(lay, origins, directions, tmin, tmax, any_hit, status, force_order=False):
    """Rays through a :class:`~kdtree_gpu.trace.layout.CpuLayout`: ``t, tri, u, v``
    (any hit: ``tri`` 1 or -1); arguments as :func:`intersect_cpu`; with
    ``force_order``, traced in :func:`~kdtree_gpu.trace.ray_order.ray_order`'s
    order even when few (the warm-up compiles that path so)."""
    num_rays = origins.shape[0]
    hit_t = np.empty(num_rays, np.float32)
    hit_tri = np.empty(num_rays, np.int32)
    hit_u = np.empty(num_rays, np.float32)
    hit_v = np.empty(num_rays, np.float32)
    if status is not None:
        status[:] = (0, -1)
    if not num_rays:
        return hit_t, hit_tri, hit_u, hit_v
    t0, t1 = _bound(tmin), _bound(tmax)
    order = ray_order(lay.bounds, origins, directions, force=force_order)
    # sorted rays are incoherent ones: their lanes' choices are a coin toss
    # for the branch predictor, and selects cost less than its misses
    branch_free = order is not None
    if order is None:
        order = np.empty(0, np.int32)  # the rays as given
        out = hit_t, hit_tri, hit_u, hit_v
    else:
        # Traced in that order from copies made in it: read through the order,
        # each ray's loads missed the cache (on 1M diffuse rays, 2 cores: about
        # 650 cycles a ray before its first node; conference 1.27x, bunny 1.10x)
        rays = np.empty_like(origins), np.empty_like(directions)
        bounds = tuple(np.empty(num_rays, np.float32) if b.shape[0] > 1 else b
                       for b in (t0, t1))
        _gather_rays(order, origins, directions, t0, t1, *rays, *bounds)
        origins, directions = rays
        t0, t1 = bounds
        out = tuple(np.empty_like(a) for a in (hit_t, hit_tri, hit_u, hit_v))
    bad = np.empty(((num_rays + RAY_CHUNK - 1) // RAY_CHUNK, 2), np.int64)
    # chunks go to whichever core is free (the rays of a frame differ in cost)
    with numba.parallel_chunksize(1):
        _trace_rays(lay.nodes, lay.splits, lay.tris, lay.tri_ids, lay.box, lay.scale, origins,
                    directions, t0, t1, any_hit, lay.stack_size, *out, order, branch_free,
                    bad)
    if order.shape[0]:
        _scatter_hits(order, *out, hit_t, hit_tri, hit_u, hit_v)
    if status is not None:
        count = int(bad[:, 0].sum())
        status[:] = (count, bad[bad[:, 0] > 0, 1].min() if count else -1)
    return hit_t, hit_tri, hit_u, hit_v


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


def intersect_cpu(tree, origins, directions, tmin, tmax, status=None):
    """Closest hit of each ray by kd-tree traversal (numba, all CPU cores).

    Parameters
    ----------
    tree : KdTree
    origins, directions : (num_rays, 3) float32, C-contiguous
    tmin, tmax : float or (num_rays,) float32
    status : (2,) int64 array, optional
        Receives the bad rays' record (they are misses): their count and
        ``(index << encoding.RAY_KIND_BITS) | problem`` of the first one
        (``-1`` when there is none), the problem as :func:`ray_problems_cpu`.

    Returns
    -------
    t, tri, u, v : (num_rays,) arrays
        As :func:`kdtree_gpu.trace.api.intersect`.
    """
    return run_layout(cpu_layout(tree), origins, directions, tmin, tmax, False, status)


def occluded_cpu(tree, origins, directions, tmin, tmax, status=None):
    """Whether each ray hits a triangle with ``tmin <= t <= tmax``: (num_rays,) bool.

    Parameters as :func:`intersect_cpu`.
    """
    return run_layout(cpu_layout(tree), origins, directions, tmin, tmax, True, status)[1] > 0
