"""CPU ray queries (numba): kd-tree traversal and the brute-force oracle.

These are the compiled backends behind :mod:`kdtree_gpu.trace`, which
checks the user's input and calls the functions below with contiguous
float32 arrays. The GPU versions are in :mod:`kdtree_gpu.trace.gpu`
(``kdtree_gpu/cuda/traverse.cu``, ``watertight.cuh``); both follow the same
conventions, so that they decide alike.

Ray conventions
---------------
A ray is ``origin + t * direction`` (``direction`` need not be unit length;
``t`` is in units of its length). A hit counts when ``tmin <= t <= tmax``.
Triangles are two-sided. Closest hit returns the smallest ``t`` and, on equal
``t``, the lowest triangle id (the brute force always; the traversal unless
the tied triangles sit in leaves it does not reach). A miss is ``t = inf``,
``tri = -1``, ``u = v = 0``. Barycentrics: ``u`` is the weight of ``v1`` and
``v`` the weight of ``v2``, so the hit point is ``(1-u-v) v0 + u v1 + v v2``.

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
  ``T = (U*Az + V*Bz) + W*Cz`` with ``Az = Sz * A[kz]``, ``t = T / det``;
  ``u = V / det``, ``v = W / det``.

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
rays through an edge or vertex on a split plane reach both sides. After a
leaf the traversal stops when the closest hit ``t <= `` the leaf's ``t_max``:
every node still on the stack lies beyond it.

The brute-force oracle tests every non-degenerate triangle. To keep it
usable on 100k rays x 100k triangles, triangles are grouped into clusters of
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

from .. import encoding as enc
from ..mesh import degenerate_mask

# 2^-18, as KD_TRAVERSE_EPS in kdtree_gpu/cuda/traverse.cu
TRAVERSE_EPS = np.float32(2.0 ** -18)
CLUSTER_SIZE = 16
GROUP_SIZE = 16  # clusters per group: a second level of boxes for the brute force
BRUTE_PAD = 1e-4
# rays per parallel task: large enough to amortize the stack allocation
RAY_CHUNK = 256

_F32_INF = np.float32(np.inf)
_F32_ZERO = np.float32(0.0)
_F32_ONE = np.float32(1.0)


# --- the watertight test ------------------------------------------------------
@numba.njit(cache=True, error_model="numpy")
def setup_watertight(o, d):
    """Per-ray constants of the watertight test.

    Parameters
    ----------
    o, d : (3,) float32
        Origin and direction.

    Returns
    -------
    kx, ky, kz : int
    sx, sy, sz : float32
        Shear constants (``sz`` is infinite for a zero direction).
    """
    ax, ay, az = abs(d[0]), abs(d[1]), abs(d[2])
    kz = 0
    if ay > ax:
        kz = 1
    if az > (ax if kz == 0 else ay):
        kz = 2
    kx = 0 if kz == 2 else kz + 1
    ky = 0 if kx == 2 else kx + 1
    dkz = d[kz]
    if dkz < _F32_ZERO:
        kx, ky = ky, kx
    sx = d[kx] / dkz
    sy = d[ky] / dkz
    sz = _F32_ONE / dkz
    return kx, ky, kz, sx, sy, sz


@numba.njit(cache=True, error_model="numpy")
def hit_triangle(o, kx, ky, kz, sx, sy, sz, vertices, face, tmin, tmax):
    """Watertight ray-triangle test of one triangle (two-sided, float32).

    Parameters
    ----------
    o : (3,) float32
        Ray origin.
    kx, ky, kz, sx, sy, sz
        From :func:`setup_watertight`.
    vertices : (num_vertices, 3) float32
    face : (3,) int32
        Vertex indices of the triangle.
    tmin, tmax : float32
        Accepted interval of ``t``.

    Returns
    -------
    hit : bool
    t, edge_v, edge_w, det : float32
        On a hit: ``t`` and the un-normalized edge functions of ``v1`` and
        ``v2`` with their sum ``det`` (``u = edge_v / det``, ``v = edge_w / det``).
    """
    i0, i1, i2 = face[0], face[1], face[2]
    akx = vertices[i0, kx] - o[kx]
    aky = vertices[i0, ky] - o[ky]
    akz = vertices[i0, kz] - o[kz]
    bkx = vertices[i1, kx] - o[kx]
    bky = vertices[i1, ky] - o[ky]
    bkz = vertices[i1, kz] - o[kz]
    ckx = vertices[i2, kx] - o[kx]
    cky = vertices[i2, ky] - o[ky]
    ckz = vertices[i2, kz] - o[kz]
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
    if not (t >= tmin and t <= tmax):
        return False, _F32_ZERO, _F32_ZERO, _F32_ZERO, _F32_ONE
    return True, t, v, w, det


@numba.njit(cache=True, error_model="numpy")
def _scene_extent(o, lo, hi):
    # largest coordinate difference between the origin and the root box: the
    # scale of every rounding error of this ray
    e = _F32_ZERO
    for k in range(3):
        e = max(e, abs(lo[k] - o[k]), abs(hi[k] - o[k]))
    return e


@numba.njit(cache=True, error_model="numpy")
def _clip_slab(lo, hi, o, inv, t0, t1):
    # a direction component of 0 (infinite reciprocal) keeps the ray only when
    # its origin lies inside the slab, instead of computing 0 * inf = NaN
    if abs(inv) == _F32_INF:
        return o >= lo and o <= hi, t0, t1
    ta = (lo - o) * inv
    tb = (hi - o) * inv
    return True, max(t0, min(ta, tb)), min(t1, max(ta, tb))


# --- kd-tree traversal ------------------------------------------------------------
@numba.njit(cache=True, error_model="numpy")
def _trace_ray(node_axis, node_split, node_child, node_count, leaf_tris, lo, hi, vertices, faces,
               o, d, tmin, tmax, any_hit, stack_node, stack_tn, stack_tf):
    # returns (tri or -1, t, u, v); for any hit tri is 1 / -1
    kx, ky, kz, sx, sy, sz = setup_watertight(o, d)
    if abs(sz) == _F32_INF or not (tmin <= tmax):
        return -1, _F32_INF, _F32_ZERO, _F32_ZERO
    inv = np.empty(3, np.float32)
    t0, t1 = tmin, tmax
    alive = True
    for k in range(3):
        inv[k] = _F32_ONE / d[k]
        inside, t0, t1 = _clip_slab(lo[k], hi[k], o[k], inv[k], t0, t1)
        alive = alive and inside
    t_eps = TRAVERSE_EPS * _scene_extent(o, lo, hi) * abs(sz)
    if not alive or not (t0 <= t1 + t_eps):
        return -1, _F32_INF, _F32_ZERO, _F32_ZERO

    sp = 0
    node = 0
    tn, tf = t0, t1
    best_t = tmax
    best_tri = -1
    best_v, best_w, best_det = _F32_ZERO, _F32_ZERO, _F32_ONE
    while True:
        # Descend to a leaf, pushing far children that the ray also crosses
        axis = node_axis[node]
        while axis != enc.AXIS_LEAF:
            left = node_child[node]
            # NaN when the ray lies in the plane: both tests below fail and
            # both children are visited over the whole interval
            ts = (node_split[node] - o[axis]) * inv[axis]
            # a negative direction (sign bit, also -0.0) meets the right child first
            neg = 1 if (d[axis] < _F32_ZERO or (d[axis] == _F32_ZERO and
                                                 np.signbit(d[axis]))) else 0
            first = left + neg
            second = left + (1 - neg)
            if ts > tf + t_eps:
                node = first
            elif ts < tn - t_eps:
                node = second
            else:
                stack_node[sp] = second
                stack_tn[sp] = max(ts, tn)
                stack_tf[sp] = tf
                sp += 1
                node = first
                tf = min(ts, tf)
            axis = node_axis[node]

        # Test the leaf's triangles against the whole ray interval
        start = node_child[node]
        for j in range(start, start + node_count[node]):
            tri = leaf_tris[j]
            hit, t, ev, ew, det = hit_triangle(o, kx, ky, kz, sx, sy, sz, vertices, faces[tri],
                                               tmin, tmax if any_hit else best_t)
            if hit:
                if any_hit:
                    return 1, t, _F32_ZERO, _F32_ZERO
                # equal t: the lowest triangle id wins, as in the brute force
                if t < best_t or best_tri < 0 or tri < best_tri:
                    best_t, best_tri, best_v, best_w, best_det = t, tri, ev, ew, det

        # Stop when the closest hit lies before everything still on the stack
        if best_tri >= 0 and best_t <= tf:
            break
        if sp == 0:
            break
        sp -= 1
        node = stack_node[sp]
        tn = stack_tn[sp]
        tf = stack_tf[sp]
    if best_tri < 0:
        return -1, _F32_INF, _F32_ZERO, _F32_ZERO
    return best_tri, best_t, best_v / best_det, best_w / best_det


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _trace_rays(node_axis, node_split, node_child, node_count, leaf_tris, bounds, vertices, faces,
                origins, directions, ray_tmin, ray_tmax, any_hit, stack_size,
                hit_t, hit_tri, hit_u, hit_v):
    num_rays = origins.shape[0]
    num_chunks = (num_rays + RAY_CHUNK - 1) // RAY_CHUNK
    lo, hi = bounds[0], bounds[1]
    for c in numba.prange(num_chunks):
        stack_node = np.empty(stack_size, np.int32)
        stack_tn = np.empty(stack_size, np.float32)
        stack_tf = np.empty(stack_size, np.float32)
        for i in range(c * RAY_CHUNK, min(num_rays, (c + 1) * RAY_CHUNK)):
            tri, t, u, v = _trace_ray(node_axis, node_split, node_child, node_count, leaf_tris,
                                      lo, hi, vertices, faces, origins[i], directions[i],
                                      ray_tmin[i], ray_tmax[i], any_hit,
                                      stack_node, stack_tn, stack_tf)
            hit_tri[i] = tri
            hit_t[i] = t
            hit_u[i] = u
            hit_v[i] = v


def _stack_size(tree) -> int:
    cached = tree._device_cache.get("cpu_stack_size")
    if cached is not None and cached[0] is tree.node_axis:
        return cached[1]
    from ..tree.check import walk_levels

    size = int(walk_levels(tree)[0].max()) + 1
    tree._device_cache["cpu_stack_size"] = (tree.node_axis, size)
    return size


def _run_tree(tree, origins, directions, tmin, tmax, any_hit):
    num_rays = origins.shape[0]
    hit_t = np.empty(num_rays, np.float32)
    hit_tri = np.empty(num_rays, np.int32)
    hit_u = np.empty(num_rays, np.float32)
    hit_v = np.empty(num_rays, np.float32)
    if num_rays:
        _trace_rays(tree.node_axis, tree.node_split, tree.node_child, tree.node_count,
                    tree.leaf_tris, tree.bounds, tree.vertices, tree.faces, origins, directions,
                    tmin, tmax, any_hit, _stack_size(tree), hit_t, hit_tri, hit_u, hit_v)
    return hit_t, hit_tri, hit_u, hit_v


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
def _ray_meets_box(o64, inv64, box_lo, box_hi, pad, t_lo, t_hi):
    # float64 slab test against the box grown by pad; True when the ray's
    # segment [t_lo, t_hi] may touch it
    t0, t1 = t_lo, t_hi
    for k in range(3):
        lo_k = np.float64(box_lo[k]) - pad
        hi_k = np.float64(box_hi[k]) + pad
        if inv64[k] == np.inf or inv64[k] == -np.inf:
            if o64[k] < lo_k or o64[k] > hi_k:
                return False
            continue
        ta = (lo_k - o64[k]) * inv64[k]
        tb = (hi_k - o64[k]) * inv64[k]
        if ta > tb:
            ta, tb = tb, ta
        t0 = max(t0, ta)
        t1 = min(t1, tb)
    return t0 <= t1


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _brute_rays(vertices, faces, tri_ids, cluster_start, cluster_lo, cluster_hi, group_lo,
                group_hi, bounds, origins, directions, ray_tmin, ray_tmax, any_hit, cull,
                hit_t, hit_tri, hit_u, hit_v):
    num_rays = origins.shape[0]
    num_clusters = cluster_lo.shape[0]
    num_groups = group_lo.shape[0]
    for i in numba.prange(num_rays):
        o, d = origins[i], directions[i]
        tmin, tmax = ray_tmin[i], ray_tmax[i]
        hit_tri[i] = -1
        hit_t[i] = _F32_INF
        hit_u[i] = _F32_ZERO
        hit_v[i] = _F32_ZERO
        kx, ky, kz, sx, sy, sz = setup_watertight(o, d)
        if abs(sz) == _F32_INF or not (tmin <= tmax):
            continue
        o64 = np.empty(3, np.float64)
        inv64 = np.empty(3, np.float64)
        for k in range(3):
            o64[k] = o[k]
            inv64[k] = 1.0 / np.float64(d[k])
        dmax = np.float64(max(abs(d[0]), abs(d[1]), abs(d[2])))
        pad = BRUTE_PAD * np.float64(_scene_extent(o, bounds[0], bounds[1]))
        best_t = tmax
        best_tri = -1
        best_v, best_w, best_det = _F32_ZERO, _F32_ZERO, _F32_ONE
        for g in range(num_groups):
            limit = np.float64(tmax if any_hit else best_t)
            t_pad = pad / dmax + 1e-5 * (abs(np.float64(tmin)) + abs(limit))
            if cull and not _ray_meets_box(o64, inv64, group_lo[g], group_hi[g], pad,
                                           np.float64(tmin) - t_pad, limit + t_pad):
                continue
            for c in range(g * GROUP_SIZE, min(num_clusters, (g + 1) * GROUP_SIZE)):
                limit = np.float64(tmax if any_hit else best_t)
                t_pad = pad / dmax + 1e-5 * (abs(np.float64(tmin)) + abs(limit))
                if cull and not _ray_meets_box(o64, inv64, cluster_lo[c], cluster_hi[c], pad,
                                               np.float64(tmin) - t_pad, limit + t_pad):
                    continue
                for j in range(cluster_start[c], cluster_start[c + 1]):
                    tri = tri_ids[j]
                    hit, t, ev, ew, det = hit_triangle(o, kx, ky, kz, sx, sy, sz, vertices,
                                                       faces[tri], tmin,
                                                       tmax if any_hit else best_t)
                    if hit and (t < best_t or best_tri < 0 or tri < best_tri):
                        best_t, best_tri, best_v, best_w, best_det = t, tri, ev, ew, det
                        if any_hit:
                            break
                if any_hit and best_tri >= 0:
                    break
            if any_hit and best_tri >= 0:
                break
        if best_tri >= 0:
            hit_tri[i] = best_tri
            hit_t[i] = best_t
            hit_u[i] = best_v / best_det
            hit_v[i] = best_w / best_det


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
    clusters = cluster_triangles(vertices, faces)
    num_rays = origins.shape[0]
    hit_t = np.empty(num_rays, np.float32)
    hit_tri = np.empty(num_rays, np.int32)
    hit_u = np.empty(num_rays, np.float32)
    hit_v = np.empty(num_rays, np.float32)
    if num_rays:
        _brute_rays(vertices, faces, *clusters, origins, directions, tmin, tmax, any_hit, cull,
                    hit_t, hit_tri, hit_u, hit_v)
    return hit_t, hit_tri, hit_u, hit_v
