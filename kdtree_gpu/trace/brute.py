"""The brute-force oracle on the CPU (numba): every triangle against every ray.

The brute-force oracle tests every non-degenerate triangle, one ray at a
time with the scalar test :func:`hit_triangle`. To keep it usable on 100k
rays x 100k triangles, triangles are grouped into clusters of
:data:`CLUSTER_SIZE` (Morton order of their box centres), clusters into
groups of :data:`GROUP_SIZE`, and a group or cluster is skipped when the ray
misses its box padded by ``BRUTE_PAD`` times the scene
extent seen from the origin; that padding is orders of magnitude above the
rounding of the triangle test, so skipping never changes the result
(``cull=False`` tests every triangle, and a test checks both agree).

The ray conventions and the triangle test are those of the traversal
(:mod:`kdtree_gpu.trace.watertight`).
"""

from __future__ import annotations

import numba
import numpy as np

from ..mesh import degenerate_mask, triangle_bounds
from .scale import trace_scale
from .watertight import (_F32_INF, _F32_ONE, _F32_ZERO, _ray_extent, hit_triangle,
                         pack_triangles, setup_watertight)

CLUSTER_SIZE = 16
GROUP_SIZE = 16  # clusters per group: a second level of boxes for the brute force
BRUTE_PAD = 1e-4
BRUTE_CHUNK = 16  # rays per parallel task of the brute force


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


@numba.njit(cache=True, error_model="numpy", inline="always")
def _ray_meets_row(lo, hi, k, ox, oy, oz, ix, iy, iz, pad, dmax, tmin, limit):
    # _ray_meets_box on box k of lo, hi, its segment [tmin, limit] grown by
    # the padding seen along the ray and a relative margin
    t_pad = pad / dmax + 1e-5 * (abs(np.float64(tmin)) + abs(limit))
    return _ray_meets_box(ox, oy, oz, ix, iy, iz, np.float64(lo[k, 0]), np.float64(lo[k, 1]),
                          np.float64(lo[k, 2]), np.float64(hi[k, 0]), np.float64(hi[k, 1]),
                          np.float64(hi[k, 2]), pad, np.float64(tmin) - t_pad, limit + t_pad)


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
            if cull and not _ray_meets_row(group_lo, group_hi, g, ox, oy, oz, ix, iy, iz, pad,
                                           dmax, tmin, limit):
                continue
            for c in range(g * GROUP_SIZE, min(num_clusters, (g + 1) * GROUP_SIZE)):
                limit = np.float64(tmax if any_hit else best_t)
                if cull and not _ray_meets_row(cluster_lo, cluster_hi, c, ox, oy, oz, ix, iy, iz,
                                               pad, dmax, tmin, limit):
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
    """Group the non-degenerate triangles of a mesh (float32 vertices, int32 faces) in clusters.

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
    tri_lo, tri_hi = triangle_bounds(vertices, faces[valid])
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
