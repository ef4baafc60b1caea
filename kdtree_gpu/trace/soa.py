"""The traversal kernel's rays, hits and parameters, declared once (C twins generated).

See :mod:`kdtree_gpu.soa`: each declaration here is also the C struct the
kernels of ``cuda/traverse.cu`` take, checked field by field at compile time.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..soa import ScalarStruct, SoA, scalar_field, soa_field


@dataclasses.dataclass
class RaySoA(SoA):
    """Rays as the traversal kernel reads them.

    Attributes
    ----------
    ray_origin, ray_direction : (num_rays, 3) float32
    ray_tmin, ray_tmax : (num_rays,) float32 or None
        ``None`` (a null pointer): every ray takes the scalar of
        :class:`TraceParams`.
    """

    c_name = "KdRays"

    ray_origin: object = soa_field(np.float32, width=3)
    ray_direction: object = soa_field(np.float32, width=3)
    ray_tmin: object = soa_field(np.float32)
    ray_tmax: object = soa_field(np.float32)


@dataclasses.dataclass
class HitSoA(SoA):
    """What the traversal kernel writes; fields a query does not need are ``None``.

    Attributes
    ----------
    hit_t : (num_rays,) float32
        Closest hit distance, ``inf`` on a miss.
    hit_tri : (num_rays,) int32
        Triangle id, ``NO_HIT`` on a miss.
    hit_u, hit_v : (num_rays,) float32
        Barycentrics of ``v1`` and ``v2``.
    hit_any : (num_rays,) bool
        Any hit (occlusion queries).
    ray_nodes, ray_tests : (num_rays,) int32
        Nodes visited and triangles tested (counting queries).
    """

    c_name = "KdHits"

    hit_t: object = soa_field(np.float32)
    hit_tri: object = soa_field(np.int32)
    hit_u: object = soa_field(np.float32)
    hit_v: object = soa_field(np.float32)
    hit_any: object = soa_field(np.uint8)
    ray_nodes: object = soa_field(np.int32)
    ray_tests: object = soa_field(np.int32)


@dataclasses.dataclass
class TraceParams(ScalarStruct):
    """The scalars of one traversal launch."""

    c_name = "KdTraceParams"

    lo_x: float = scalar_field(np.float32)  # root box, in scaled units
    lo_y: float = scalar_field(np.float32)
    lo_z: float = scalar_field(np.float32)
    hi_x: float = scalar_field(np.float32)
    hi_y: float = scalar_field(np.float32)
    hi_z: float = scalar_field(np.float32)
    scale: float = scalar_field(np.float32)  # the trace scale (a power of two)
    tmin: float = scalar_field(np.float32)  # for every ray when RaySoA.ray_tmin is None
    tmax: float = scalar_field(np.float32)
    num_rays: int = scalar_field(np.int64)


CUDA_STRUCTS = (RaySoA, HitSoA, TraceParams)
