"""The path tracer's work queues: structures of arrays declared once.

Each queue is a :class:`kdtree_gpu.soa.SoA` (allocate, take, prefix, args
come from the one declaration), with dtypes fixed in the field declarations
(pbrt-v4's ``workitems.soa``). :class:`QueueBuffers` allocates every queue
of a render once, at the size of one pass; a bounce works on views of their
first rows (:meth:`~kdtree_gpu.soa.SoA.prefix`), so no bounce allocates.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from ..soa import SoA, soa_field
from .compaction import Compactor, field_table


@dataclasses.dataclass
class PathQueue(SoA):
    """Paths in flight and the rays they trace next.

    Attributes
    ----------
    ray_origin : (num_paths, 3) float32
    ray_direction : (num_paths, 3) float32
        Unit length.
    ray_tmax : (num_paths,) float32
        ``inf`` for a live path, ``-1`` for a dead one (empty interval: the
        traversal returns at once).
    path_throughput : (num_paths, 3) float32
        Product of BSDF * cos / pdf (and roulette weights) so far.
    path_bsdf_pdf : (num_paths,) float32
        Solid-angle pdf of the BSDF sample that made the current ray (for the
        MIS weight of an emitter it hits); unused at depth 0.
    path_pixel : (num_paths,) int32
        Index ``y * width + x`` of the pixel the path contributes to.
    path_key : (num_paths,) uint32
        Random-number key of the path.
    path_depth : (num_paths,) int32
        Bounces so far (0 for camera rays).
    path_alive : (num_paths,) uint8
    """

    live_field = "path_alive"

    ray_origin: object = soa_field(np.float32, 3)
    ray_direction: object = soa_field(np.float32, 3)
    ray_tmax: object = soa_field(np.float32)
    path_throughput: object = soa_field(np.float32, 3)
    path_bsdf_pdf: object = soa_field(np.float32)
    path_pixel: object = soa_field(np.int32)
    path_key: object = soa_field(np.uint32)
    path_depth: object = soa_field(np.int32)
    path_alive: object = soa_field(np.uint8)


@dataclasses.dataclass
class HitQueue(SoA):
    """Closest hits of a :class:`PathQueue`'s rays (same order).

    Attributes
    ----------
    hit_t : (num_paths,) float32
        Distance (``inf`` on a miss).
    hit_tri : (num_paths,) int32
        Triangle, ``NO_HIT`` (-1) on a miss.
    hit_u, hit_v : (num_paths,) float32
        Barycentrics: point = v0 + u (v1 - v0) + v (v2 - v0).
    """

    hit_t: object = soa_field(np.float32)
    hit_tri: object = soa_field(np.int32)
    hit_u: object = soa_field(np.float32)
    hit_v: object = soa_field(np.float32)


@dataclasses.dataclass
class LightSampleQueue(SoA):
    """One light sample per path, kept compact; expanded into a :class:`ShadowQueue`.

    Attributes
    ----------
    light_tri : (num_paths,) int32
        Light triangle, -1 when the path takes no light sample.
    light_u, light_v : (num_paths,) float32
        Barycentrics of the point on it (uniform over its area).
    """

    light_tri: object = soa_field(np.int32)
    light_u: object = soa_field(np.float32)
    light_v: object = soa_field(np.float32)


@dataclasses.dataclass
class ShadowQueue(SoA):
    """Shadow rays with the radiance they carry if unoccluded.

    Attributes
    ----------
    shadow_origin : (num_rays, 3) float32
    shadow_direction : (num_rays, 3) float32
        Unit length, toward the light point.
    shadow_tmax : (num_rays,) float32
        Just short of the light point; -1 when there is nothing to test.
    shadow_radiance : (num_rays, 3) float32
        Throughput * BSDF * Le * cos / pdf * MIS weight.
    shadow_pixel : (num_rays,) int32
    """

    live_field = "shadow_tmax"

    shadow_origin: object = soa_field(np.float32, 3)
    shadow_direction: object = soa_field(np.float32, 3)
    shadow_tmax: object = soa_field(np.float32)
    shadow_radiance: object = soa_field(np.float32, 3)
    shadow_pixel: object = soa_field(np.int32)


@dataclasses.dataclass
class QueueBuffers:
    """The queues of one render, allocated once at the size of a pass and reused by every bounce.

    Attributes
    ----------
    paths : tuple of two PathQueue
        Ping-pong buffers; ``paths[current]`` holds the live queue (the
        second is ``None`` without compaction).
    path_tables : tuple of two (3 * 9,) int64, or None
        :func:`~kdtree_gpu.render.compaction.field_table` from ``paths[k]``
        to ``paths[1 - k]`` (kernels with compaction only).
    light_samples : LightSampleQueue
    shadow : ShadowQueue
        Shadow rays as expanded, one per path.
    shadow_compact : ShadowQueue or None
        The shadow rays that carry light, at the front (with compaction).
    shadow_table : (3 * 5,) int64, or None
    ray_tmin : (capacity,) float32
        Zeros: the ``tmin`` of every ray.
    compactor : Compactor or None
        With the kernels and compaction only.
    current : int
    """

    paths: tuple
    path_tables: Optional[tuple]
    light_samples: LightSampleQueue
    shadow: ShadowQueue
    shadow_compact: Optional[ShadowQueue]
    shadow_table: object
    ray_tmin: object
    compactor: Optional[Compactor]
    current: int = 0

    @classmethod
    def allocate(cls, xp, capacity: int, use_kernels: bool, compaction: bool,
                 compactor: Optional[Compactor] = None) -> "QueueBuffers":
        """Buffers for passes of up to ``capacity`` paths.

        The array-expression stages leave rows they do not reach untouched,
        so their buffers start zeroed (finite values everywhere); the kernels
        write every row they later read.

        Parameters
        ----------
        compactor : Compactor, optional
            The compactor of the kernels (default ``Compactor(xp)``); used
            with ``use_kernels`` and ``compaction`` only.
        """
        zero = not use_kernels
        paths = (PathQueue.allocate(xp, capacity, zero=zero),
                 PathQueue.allocate(xp, capacity, zero=zero) if compaction else None)
        shadow = ShadowQueue.allocate(xp, capacity, zero=zero)
        shadow_compact = ShadowQueue.allocate(xp, capacity, zero=zero) if compaction else None
        path_tables = shadow_table = None
        if compaction and use_kernels:
            path_tables = (field_table(xp, paths[0], paths[1]), field_table(xp, paths[1], paths[0]))
            shadow_table = field_table(xp, shadow, shadow_compact)
            compactor = compactor if compactor is not None else Compactor(xp)
        else:
            compactor = None
        return cls(paths=paths, path_tables=path_tables,
                   light_samples=LightSampleQueue.allocate(xp, capacity, zero=zero),
                   shadow=shadow, shadow_compact=shadow_compact, shadow_table=shadow_table,
                   ray_tmin=xp.zeros(capacity, dtype=np.float32), compactor=compactor)
