"""Ray casting back ends of the path tracer: the kd-tree, and brute force as its oracle.

Both answer the same two queries over a queue of rays, with the same
conventions: ``intersect`` gives the closest hit as a :class:`HitQueue`,
``occluded`` whether anything lies in ``[tmin, tmax]`` as an (n,) bool
array. A ray with an empty interval (``tmin > tmax``: a dead path) is a
miss.
"""

from __future__ import annotations

import numpy as np

from ..device import resolve_device
from ..encoding import NO_HIT
from ..primitives import compact_indices
from .queues import HitQueue


class KdTreeTracer:
    """Closest-hit and any-hit queries through a :class:`kdtree_gpu.KdTree`.

    Parameters
    ----------
    tree : KdTree
    device : str or Device
        Where the rays are: ``"cuda"`` (the GPU traversal, which times its
        own launches) or ``"cpu"`` (the numba traversal).
    """

    def __init__(self, tree, device):
        self.tree = tree
        self.device = resolve_device(device)
        self.records_own_launches = self.device.is_cuda

    def intersect(self, origin, direction, tmin, tmax) -> HitQueue:
        if self.device.is_cuda:
            from ..trace.gpu import intersect_gpu

            t, tri, u, v = intersect_gpu(self.tree, origin, direction, tmin, tmax)
            return HitQueue(hit_t=t, hit_tri=tri, hit_u=u, hit_v=v)
        from ..trace import intersect

        hit = HitQueue.allocate(np, origin.shape[0], zero=True)
        hit.hit_t[:] = np.inf
        hit.hit_tri[:] = NO_HIT
        self._query_live_rays(intersect, hit.args(), origin, direction, tmin, tmax)
        return hit

    def occluded(self, origin, direction, tmin, tmax):
        if self.device.is_cuda:
            from ..trace.gpu import occluded_gpu

            return occluded_gpu(self.tree, origin, direction, tmin, tmax)
        from ..trace import occluded

        blocked = np.zeros(origin.shape[0], dtype=bool)
        self._query_live_rays(occluded, (blocked,), origin, direction, tmin, tmax)
        return blocked

    def _query_live_rays(self, query, outputs, origin, direction, tmin, tmax) -> None:
        # the CPU entry point validates every ray; masked entries (empty
        # interval, possibly unset direction) are left out and keep the
        # values of a miss that `outputs` start with
        live = compact_indices(tmin <= tmax)
        if live.size == 0:
            return
        results = query(self.tree, origin[live], direction[live], tmin[live], tmax[live],
                        device="cpu")
        for out, result in zip(outputs, results if isinstance(results, tuple) else (results,)):
            out[live] = result


class BruteForceTracer:
    """Every ray against every triangle (float64 Moller-Trumbore); a test oracle.

    Works with NumPy and CuPy arrays alike; memory is bounded by testing rays
    in chunks. Only for small scenes.

    Parameters
    ----------
    xp : module
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
    """

    def __init__(self, xp, vertices, faces):
        P = np.asarray(vertices, np.float64)[np.asarray(faces)]
        self.xp = xp
        self.v0 = xp.asarray(P[:, 0])
        self.e1 = xp.asarray(P[:, 1] - P[:, 0])
        self.e2 = xp.asarray(P[:, 2] - P[:, 0])
        self.chunk = max(1, (1 << 20) // max(1, P.shape[0]))

    def _cast(self, origin, direction, tmin, tmax):
        xp = self.xp
        n = origin.shape[0]
        hit_t = xp.full(n, np.inf, np.float64)
        hit_tri = xp.full(n, NO_HIT, np.int32)
        hit_u = xp.zeros(n, np.float64)
        hit_v = xp.zeros(n, np.float64)
        tmin = xp.broadcast_to(xp.asarray(tmin, np.float64), (n,))
        tmax = xp.broadcast_to(xp.asarray(tmax, np.float64), (n,))
        for s in range(0, n, self.chunk):
            e = min(n, s + self.chunk)
            O = origin[s:e, None, :].astype(np.float64)
            D = direction[s:e, None, :].astype(np.float64)
            pvec = xp.cross(D, self.e2[None])
            det = xp.sum(self.e1[None] * pvec, axis=2)
            ok = det != 0
            inv = xp.where(ok, 1.0 / xp.where(ok, det, 1.0), 0.0)
            tvec = O - self.v0[None]
            u = xp.sum(tvec * pvec, axis=2) * inv
            qvec = xp.cross(tvec, self.e1[None])
            v = xp.sum(D * qvec, axis=2) * inv
            t = xp.sum(self.e2[None] * qvec, axis=2) * inv
            ok &= (u >= 0) & (v >= 0) & (u + v <= 1)
            ok &= (t >= tmin[s:e, None]) & (t <= tmax[s:e, None])
            t = xp.where(ok, t, np.inf)
            best = xp.argmin(t, axis=1)
            rows = xp.arange(e - s)
            best_t = t[rows, best]
            found = xp.isfinite(best_t)
            hit_t[s:e] = best_t
            hit_tri[s:e] = xp.where(found, best.astype(np.int32), NO_HIT)
            hit_u[s:e] = xp.where(found, u[rows, best], 0.0)
            hit_v[s:e] = xp.where(found, v[rows, best], 0.0)
        return hit_t, hit_tri, hit_u, hit_v

    def intersect(self, origin, direction, tmin, tmax) -> HitQueue:
        t, tri, u, v = self._cast(origin, direction, tmin, tmax)
        return HitQueue(hit_t=t.astype(np.float32), hit_tri=tri, hit_u=u.astype(np.float32),
                        hit_v=v.astype(np.float32))

    def occluded(self, origin, direction, tmin, tmax):
        return self._cast(origin, direction, tmin, tmax)[1] >= 0
