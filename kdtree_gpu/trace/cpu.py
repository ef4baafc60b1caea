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

No operation is fused or reordered (numba compiles without fast-math, and
LLVM does not contract ``a * b + c`` into an FMA without it), so each
rounds exactly as the explicitly rounded CUDA intrinsics do.

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

The traversal reads a layout made once per tree and kept in its cache
(:func:`cpu_layout`), the CPU twin of the GPU's packed layout: 8-byte nodes
(:func:`kdtree_gpu.encoding.pack_nodes`, split positions times ``s``), and
the scaled vertices of every triangle in one row of 9 floats (one cache
line or two, where the mesh's indexed vertices take three). Rays are cut
into chunks of
:data:`RAY_CHUNK` that the cores take one at a time (numba ``prange`` with a
chunk size of 1), and each chunk reuses one stack.

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

_F32_INF = np.float32(np.inf)
_F32_ZERO = np.float32(0.0)
_F32_ONE = np.float32(1.0)
_AXIS_MASK = np.int32(enc.PACK_AXIS_MASK)
_PACK_SHIFT = np.int32(enc.PACK_SHIFT)
_AXIS_LEAF = np.int32(enc.AXIS_LEAF)


# --- the watertight test ------------------------------------------------------
# Hot helpers take scalars only: passing an array to a numba function costs a
# reference count update (an atomic operation on memory that every core
# shares), so the loops below read the arrays themselves.
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


# --- kd-tree traversal ------------------------------------------------------------
@numba.njit(cache=True, error_model="numpy")
def _trace_chunk(nodes, splits, tris, tri_ids, box, scale, origins, directions, ray_tmin,
                 ray_tmax, any_hit, begin, end, stack_size, hit_t, hit_tri, hit_u, hit_v):
    # Rays begin..end-1, one after the other, with one stack. nodes:
    # (num_nodes, 2) int32 packed nodes; splits: the same memory as float32.
    # For any hit, hit_tri is 1 or -1.
    stack_node = np.empty(stack_size, np.int32)
    stack_tn = np.empty(stack_size, np.float32)
    stack_tf = np.empty(stack_size, np.float32)
    o = np.empty(3, np.float32)
    inv = np.empty(3, np.float32)
    for i in range(begin, end):
        hit_tri[i] = -1
        hit_t[i] = _F32_INF
        hit_u[i] = _F32_ZERO
        hit_v[i] = _F32_ZERO
        # the ray in scaled space: o * s and d * s are exact (s is a power of two)
        dx = directions[i, 0] * scale
        dy = directions[i, 1] * scale
        dz = directions[i, 2] * scale
        tmin = ray_tmin[i]
        tmax = ray_tmax[i]
        kx, ky, kz, sx, sy, sz = setup_watertight(dx, dy, dz)
        if abs(sz) == _F32_INF or not (tmin <= tmax):
            continue
        t0, t1 = tmin, tmax
        alive = True
        for k in range(3):
            o[k] = origins[i, k] * scale
            inv[k] = _F32_ONE / (directions[i, k] * scale)
            inside, t0, t1 = _clip_slab(box[0, k], box[1, k], o[k], inv[k], t0, t1)
            alive = alive and inside
        t_eps = TRAVERSE_EPS * _ray_extent(o, box) * abs(sz)
        if not alive or not (t0 <= t1 + t_eps):
            continue
        okx, oky, okz = o[kx], o[ky], o[kz]
        # bit k set: the direction's component k has its sign bit set (also
        # -0.0), so the ray meets the right child (upper half) first
        neg_mask = (1 if np.signbit(dx) else 0) | (2 if np.signbit(dy) else 0) | \
            (4 if np.signbit(dz) else 0)

        sp = 0
        node = 0
        tn, tf = t0, t1
        best_t = tmax
        best_tri = -1
        best_v, best_w, best_det = _F32_ZERO, _F32_ZERO, _F32_ONE
        found = False
        while True:
            # Descend to a leaf, pushing far children that the ray also crosses
            word = nodes[node, 1]
            axis = word & _AXIS_MASK
            while axis != _AXIS_LEAF:
                left = word >> _PACK_SHIFT
                # NaN when the ray lies in the plane: both tests below fail and
                # both children are visited over the whole interval
                ts = (splits[node, 0] - o[axis]) * inv[axis]
                neg = (neg_mask >> axis) & 1
                first = left + neg
                second = left + (1 - neg)
                if ts > tf + t_eps:
                    node = first
                elif ts < tn - t_eps:
                    node = second
                else:
                    # fmaxf / fminf, as on the GPU: a NaN ts keeps tn and tf
                    stack_node[sp] = second
                    stack_tn[sp] = ts if ts > tn else tn
                    stack_tf[sp] = tf
                    sp += 1
                    node = first
                    tf = ts if ts < tf else tf
                word = nodes[node, 1]
                axis = word & _AXIS_MASK

            # Test the leaf's triangles against the whole ray interval
            start = word >> _PACK_SHIFT
            for j in range(start, start + nodes[node, 0]):
                tri = tri_ids[j]
                hit, t, ev, ew, det = hit_triangle(
                    tris[tri, kx] - okx, tris[tri, ky] - oky, tris[tri, kz] - okz,
                    tris[tri, 3 + kx] - okx, tris[tri, 3 + ky] - oky, tris[tri, 3 + kz] - okz,
                    tris[tri, 6 + kx] - okx, tris[tri, 6 + ky] - oky, tris[tri, 6 + kz] - okz,
                    sx, sy, sz, tmin, tmax if any_hit else best_t)
                if hit:
                    if any_hit:
                        found = True
                        break
                    # equal t: the lowest triangle id wins, as in the brute force
                    if t < best_t or best_tri < 0 or tri < best_tri:
                        best_t, best_tri, best_v, best_w, best_det = t, tri, ev, ew, det
            if found:
                break

            # Stop when the closest hit lies before everything still on the stack
            if best_tri >= 0 and best_t <= tf:
                break
            if sp == 0:
                break
            sp -= 1
            node = stack_node[sp]
            tn = stack_tn[sp]
            tf = stack_tf[sp]
        if found:
            hit_tri[i] = 1
        elif best_tri >= 0:
            hit_tri[i] = best_tri
            hit_t[i] = best_t
            hit_u[i] = best_v / best_det
            hit_v[i] = best_w / best_det


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _trace_rays(nodes, splits, tris, tri_ids, box, scale, origins, directions, ray_tmin,
                ray_tmax, any_hit, stack_size, hit_t, hit_tri, hit_u, hit_v):
    num_rays = origins.shape[0]
    num_chunks = (num_rays + RAY_CHUNK - 1) // RAY_CHUNK
    for c in numba.prange(num_chunks):
        _trace_chunk(nodes, splits, tris, tri_ids, box, scale, origins, directions, ray_tmin,
                     ray_tmax, any_hit, c * RAY_CHUNK, min(num_rays, (c + 1) * RAY_CHUNK),
                     stack_size, hit_t, hit_tri, hit_u, hit_v)


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
    box : (2, 3) float32
        The root box times ``scale``.
    nodes : (num_nodes, 2) int32
        Packed nodes (:func:`kdtree_gpu.encoding.pack_nodes`) with split
        positions times ``scale``.
    splits : (num_nodes, 2) float32
        The same memory as ``nodes``, read as float32 (column 0: split).
    tris : (num_triangles, 9) float32
        Scaled vertices of every triangle (``v0 v1 v2``, one row each).
    tri_ids : (num_refs,) int32
        ``leaf_tris``.
    stack_size : int
        Entries of the traversal stack (the tree's depth + 1).
    """

    def __init__(self, tree):
        from ..tree.check import walk_levels

        self.scale = trace_scale(tree.bounds)
        self.box = np.ascontiguousarray(tree.bounds, dtype=np.float32) * self.scale
        split = (np.asarray(tree.node_split, dtype=np.float32) * self.scale).astype(np.float32)
        self.nodes = enc.pack_nodes(tree.node_axis, split, tree.node_child, tree.node_count)
        self.splits = self.nodes.view(np.float32)
        self.tri_ids = np.ascontiguousarray(tree.leaf_tris, dtype=np.int32)
        self.tris = pack_triangles(tree.vertices, tree.faces, np.arange(tree.num_triangles),
                                   self.scale)
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
    if num_rays:
        lay = cpu_layout(tree)
        # chunks go to whichever core is free (the rays of a frame differ in cost)
        with numba.parallel_chunksize(1):
            _trace_rays(lay.nodes, lay.splits, lay.tris, lay.tri_ids, lay.box, lay.scale, origins,
                        directions, tmin, tmax, any_hit, lay.stack_size, hit_t, hit_tri,
                        hit_u, hit_v)
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
