"""Wavefront path tracer over the kd-tree (pbrt-v4 style, GPU with CuPy or CPU with NumPy).

One sample pass traces one path per (pixel, sample) through a sequence of
stages, each a verb-named function over a queue of paths (pbrt-v4 section 15.3,
``WavefrontPathIntegrator::Render``)::

    generate_camera_rays
    for depth = 0, 1, ...:
        intersect_closest       closest hit of every live ray (kd-tree traversal)
        handle_escaped_rays     background radiance, path ends
        add_emission            emitted radiance at the hit (MIS-weighted); paths
                                that reached max_depth end here
        sample_lights           next-event estimation: a light triangle by power
                                (alias table) and a point on it, kept compact as
                                (triangle, barycentrics)
        trace_shadow_rays       expand the light samples into shadow rays, any-hit
                                test, add the unoccluded contributions
        sample_bsdf             Lambertian, cosine-weighted: the next ray
        russian_roulette        unbiased termination (survivors reweighted)
        compact_paths           stream compaction of the live paths
    accumulate_film             add the pass to the running sum

The estimator
-------------
Direct light is estimated twice at every vertex, by light sampling and by
BSDF sampling, and the two are combined with the power heuristic (Veach
1997, beta = 2): a light sample with pdf ``p_light`` (solid angle) and BSDF
pdf ``p_bsdf`` for the same direction is weighted ``p_light^2 / (p_light^2 +
p_bsdf^2)``; an emitter hit by the BSDF-sampled ray gets ``p_bsdf^2 /
(p_light^2 + p_bsdf^2)``, where ``p_light`` is what light sampling would have
given that point. Camera rays take emission with weight 1, and so do escaped
rays (the background is not light-sampled). Reflection is two-sided (the
normal is turned toward the incoming ray); emission comes from the front face
only (the side of ``(v1 - v0) x (v2 - v0)``) unless the scene sets
``two_sided_emission``. Russian roulette starts at ``rr_start_depth``: a path survives with
probability ``min(1, max(throughput))`` and its throughput is divided by it,
which keeps the estimator unbiased (the furnace test in
``tests/kdtree_gpu/test_render.py`` checks this).

Depth follows pbrt-v4: ``max_depth = 0`` gives emission seen directly,
``max_depth = 1`` direct lighting, and so on; ``max_depth=None`` leaves path
length to Russian roulette alone.

Queues and compaction
---------------------
Queues are structures of arrays declared once (:class:`PathQueue`,
:class:`HitQueue`, :class:`LightSampleQueue`, :class:`ShadowQueue`), with
dtypes fixed in their field declarations. They are allocated once per render
(:class:`QueueBuffers`) at the size of one pass; a bounce works on views of
their first rows, so no bounce allocates a queue. With ``compaction=True`` the
live paths are moved to the front of the other of two path buffers after every
bounce (ping-pong; GAPT part 11, section 11.1, thread compaction), and the
shadow rays that carry light are moved to the front of their own buffer before
they are traced. On the GPU one compaction is two launches
(:meth:`Compactor.compact`: live rows per tile, then one kernel that ranks the
live rows and moves every field of the queue), and the number of live paths is
the loop's one device-to-host read per bounce; shadow rays need no read (the
dead rows are marked at the back of the buffer and the traversal runs over the
whole of it). With ``compaction=False`` the queue keeps its length, dead paths
stay in it masked (``path_alive = 0``, ray interval empty) and every kernel
still runs one thread for each of them.

Random numbers
--------------
Counter-based: each path has a key hashed from (seed, sample index, pixel);
the number for dimension ``dim`` at depth ``depth`` is a PCG hash of the key
plus a per-(depth, dim) salt. NumPy and CUDA compute the same bits, so the
same path makes the same choices on both backends until floating-point
rounding sends it elsewhere, and an image does not depend on how samples are
batched into passes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Optional

import numpy as np

from .device import resolve_device
from .encoding import NO_HIT
from .render_image import save_png, tonemap  # noqa: F401  (public API of this module)
from .render_scene import (Camera, RenderScene, SceneError, as_render_scene, light_tables,  # noqa: F401
                           mesh_scene, triangle_records)

__all__ = [
    "render", "Renderer", "RenderResult", "RenderScene", "Camera", "SceneError", "mesh_scene",
    "save_png", "tonemap", "PathQueue", "HitQueue", "LightSampleQueue", "ShadowQueue",
    "generate_camera_rays", "intersect_closest", "handle_escaped_rays", "add_emission",
    "sample_lights", "expand_light_samples", "trace_shadow_rays", "sample_bsdf",
    "russian_roulette", "compact_paths", "compact_shadow_rays", "accumulate_film", "trace_paths",
    "QueueBuffers", "Compactor", "compaction_tiles", "field_table", "compact_rows_xp",
]

RENDER_SOURCE = "render.cu"
ACCEL_CHOICES = ("kdtree", "brute")
KERNEL_CHOICES = ("cuda", "xp")
# Paths traced at once: enough to fill a GPU, small enough for NumPy temporaries.
DEFAULT_PATHS_PER_PASS = {"cuda": 1 << 21, "cpu": 1 << 16}
DEFAULT_RR_START_DEPTH = 2
# Without Russian roulette or a depth limit a path could bounce forever in a
# closed white room; this bounds the loop whatever the settings.
DEPTH_HARD_LIMIT = 100_000
# Ray origins are pushed off the surface by this fraction of the hit point's
# largest coordinate (about 130 float32 ulps), see offset_origin.
DEFAULT_RAY_EPSILON = 2e-5
# Shadow rays stop this fraction short of the light point.
SHADOW_TMAX_SCALE = 1.0 - 1e-4
INV_PI = 1.0 / math.pi

# Random-number dimensions within one depth (16 slots per depth).
DIMS_PER_DEPTH = 16
DIM_PIXEL_X, DIM_PIXEL_Y = 0, 1
DIM_LIGHT_SELECT, DIM_LIGHT_U, DIM_LIGHT_V = 2, 3, 4
DIM_BSDF_PHI, DIM_BSDF_R = 5, 6
DIM_ROULETTE = 7

_U32 = 0xFFFFFFFF

# Stream compaction (render.cu, kd_render_count_live_tiles / kd_render_compact_rows):
# threads per block, and the most tiles (blocks) of one launch; each block of
# the move kernel adds up the counts of the tiles before it, so fewer, larger
# tiles keep that sum short.
COMPACT_BLOCK = 256
COMPACT_MAX_TILES = 1024
COMPACT_MAX_FIELDS = 16  # KD_COMPACT_MAX_FIELDS
COMPACT_FLAG_U8, COMPACT_FLAG_F32 = 0, 1  # KD_COMPACT_FLAG_*: live = flag != 0, flag > 0
# Slots of the device counters written by the compaction kernel.
COUNTER_LIVE_PATHS = 0  # live paths after the last path compaction
COUNTER_SHADOW_RAYS = 1  # shadow rays after the last shadow-ray compaction
COUNTER_SHADOW_RAYS_TOTAL = 2  # shadow rays traced in this render
NUM_COUNTERS = 4


# --- structures of arrays ------------------------------------------------------
def soa_field(dtype, width: Optional[int] = None):
    """Declare one SoA field: ``(n,)`` or ``(n, width)`` of ``dtype``."""
    return dataclasses.field(metadata={"dtype": np.dtype(dtype), "width": width})


class SoA:
    """Helpers shared by every queue: allocate, gather, view and size all fields together.

    ``live_field`` names the field that says whether a row is live (for
    compaction): a uint8 field is live where nonzero, a float32 one where > 0.
    """

    live_field: Optional[str] = None

    @classmethod
    def allocate(cls, xp, n: int, zero: bool = True):
        """A queue of ``n`` entries on the backend of ``xp`` (zeroed unless ``zero=False``)."""
        make = xp.zeros if zero else xp.empty
        arrays = {}
        for f in dataclasses.fields(cls):
            width = f.metadata["width"]
            shape = (n,) if width is None else (n, width)
            arrays[f.name] = make(shape, dtype=f.metadata["dtype"])
        return cls(**arrays)

    def take(self, index):
        """A new queue holding entries ``index`` (int array) of every field, in that order."""
        return type(self)(**{f.name: getattr(self, f.name)[index] for f in dataclasses.fields(self)})

    def prefix(self, n: int):
        """A queue viewing the first ``n`` rows of every field (no copy)."""
        return type(self)(**{f.name: getattr(self, f.name)[:n] for f in dataclasses.fields(self)})

    @property
    def size(self) -> int:
        return int(getattr(self, dataclasses.fields(self)[0].name).shape[0])

    def arrays(self) -> dict:
        """``{field name: array}``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


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
    """One light sample per path, kept compact; expanded by :func:`trace_shadow_rays`.

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
class DeviceScene:
    """Scene arrays on the render backend (16-byte records for the kernels).

    Attributes
    ----------
    tri_vertex : (num_triangles, 3, 4) float32
    tri_normal : (num_triangles, 4) float32
        Unit geometric normal and area.
    tri_material : (num_triangles,) int32
    material_albedo, material_emission : (num_materials, 4) float32
        RGB padded to 4.
    light_tri : (num_lights,) int32
    light_alias_prob : (num_lights,) float32
    light_alias_index : (num_lights,) int32
    tri_light_pmf : (num_triangles,) float32
    camera_frame : (4, 3) float32
        See :meth:`Camera.frame`.
    background : tuple of 3 float
    ray_epsilon : float
        Secondary ray origins move off the surface along the normal by
        ``ray_epsilon * max(max |coordinate of the point|, min_scale)``.
    min_scale : float
        One hundredth of the scene diagonal: the floor of that scale near the
        coordinate origin.
    two_sided : int
        1 when both faces of an emitter emit, 0 for the front face only.
    """

    tri_vertex: object
    tri_normal: object
    tri_material: object
    material_albedo: object
    material_emission: object
    light_tri: object
    light_alias_prob: object
    light_alias_index: object
    tri_light_pmf: object
    camera_frame: object
    background: tuple
    ray_epsilon: float
    min_scale: float
    two_sided: int

    @property
    def num_lights(self) -> int:
        return int(self.light_tri.shape[0])


def upload_scene(xp, scene: RenderScene, width: int, height: int,
                 ray_epsilon: float = DEFAULT_RAY_EPSILON) -> DeviceScene:
    """Per-triangle records, materials, light tables and camera on the backend of ``xp``."""
    tri_vertex, tri_normal = triangle_records(scene.vertices, scene.faces)
    light_tri, alias_prob, alias_index, tri_light_pmf = light_tables(scene)

    def pad4(table):
        out = np.zeros((table.shape[0], 4), dtype=np.float32)
        out[:, :3] = table
        return out

    bounds = scene.bounds.astype(np.float64)
    diagonal = float(np.linalg.norm(bounds[1] - bounds[0]))
    return DeviceScene(
        tri_vertex=xp.asarray(tri_vertex),
        tri_normal=xp.asarray(tri_normal),
        tri_material=xp.asarray(scene.tri_material),
        material_albedo=xp.asarray(pad4(scene.material_albedo)),
        material_emission=xp.asarray(pad4(scene.material_emission)),
        light_tri=xp.asarray(light_tri),
        light_alias_prob=xp.asarray(alias_prob),
        light_alias_index=xp.asarray(alias_index),
        tri_light_pmf=xp.asarray(tri_light_pmf),
        camera_frame=xp.asarray(scene.camera.frame(width, height)),
        background=tuple(float(x) for x in scene.background),
        ray_epsilon=float(ray_epsilon),
        min_scale=max(1e-2 * diagonal, 1e-30),
        two_sided=int(scene.two_sided_emission),
    )


# --- ray casting back ends -------------------------------------------------------
class KdTreeTracer:
    """Closest-hit and any-hit queries through a :class:`kdtree_gpu.KdTree`.

    Parameters
    ----------
    tree : KdTree
    device : {"cuda", "cpu"}
    """

    def __init__(self, tree, device: str):
        self.tree = tree
        self.device = device
        self.records_own_launches = device == "cuda"

    def intersect(self, origin, direction, tmin, tmax) -> HitQueue:
        if self.device == "cuda":
            from .trace.gpu import intersect_gpu

            t, tri, u, v = intersect_gpu(self.tree, origin, direction, tmin, tmax)
            return HitQueue(hit_t=t, hit_tri=tri, hit_u=u, hit_v=v)
        from .trace import intersect

        # the CPU entry point validates every ray; masked entries (empty
        # interval, possibly unset direction) are left out and reported as misses
        live = np.flatnonzero(tmin <= tmax)
        hit = HitQueue.allocate(np, origin.shape[0])
        hit.hit_t[:] = np.inf
        hit.hit_tri[:] = NO_HIT
        if live.size:
            t, tri, u, v = intersect(self.tree, origin[live], direction[live], tmin[live],
                                     tmax[live], device="cpu")
            hit.hit_t[live], hit.hit_tri[live], hit.hit_u[live], hit.hit_v[live] = t, tri, u, v
        return hit

    def occluded(self, origin, direction, tmin, tmax):
        if self.device == "cuda":
            from .trace.gpu import occluded_gpu

            return occluded_gpu(self.tree, origin, direction, tmin, tmax)
        from .trace import occluded

        live = np.flatnonzero(tmin <= tmax)
        blocked = np.zeros(origin.shape[0], dtype=bool)
        if live.size:
            blocked[live] = occluded(self.tree, origin[live], direction[live], tmin[live],
                                     tmax[live], device="cpu")
        return blocked


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


# --- random numbers --------------------------------------------------------------
def pcg_hash_scalar(x: int) -> int:
    """PCG-RXS-M-XS 32-bit hash of a host integer (Jarzynski & Olano 2020)."""
    state = (x * 747796405 + 2891336453) & _U32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & _U32
    return ((word >> 22) ^ word) & _U32


def pcg_hash(xp, x):
    """:func:`pcg_hash_scalar` element-wise on a uint32 array (wrapping arithmetic)."""
    x = x.astype(np.uint32, copy=False)
    state = x * np.uint32(747796405) + np.uint32(2891336453)
    word = ((state >> ((state >> np.uint32(28)) + np.uint32(4))) ^ state) * np.uint32(277803737)
    return (word >> np.uint32(22)) ^ word


def stream_salt(depth: int, dim: int) -> np.uint32:
    """Salt of random dimension ``dim`` at path depth ``depth``."""
    return np.uint32(pcg_hash_scalar((depth * DIMS_PER_DEPTH + dim) & _U32))


def uniform_from_key(xp, key, salt):
    """(n,) float32 in [0, 1): 24 high bits of ``pcg_hash(key + salt)``."""
    h = pcg_hash(xp, key + np.uint32(salt))
    return (h >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def path_keys(xp, seed: int, sample, pixel):
    """Key of each path: ``pcg(pcg(pcg(seed) + sample) + pixel)`` (uint32)."""
    seed_hash = np.uint32(pcg_hash_scalar(int(seed) & _U32))
    return pcg_hash(xp, pcg_hash(xp, sample.astype(np.uint32) + seed_hash) + pixel.astype(np.uint32))


# --- stream compaction -----------------------------------------------------------------
def compaction_tiles(n: int):
    """Tiling of ``n`` rows for the compaction kernels.

    Returns
    -------
    tile_size : int
        Rows per tile (block), a multiple of :data:`COMPACT_BLOCK`.
    num_tiles : int
        At most :data:`COMPACT_MAX_TILES`.
    """
    per_thread = max(1, -(-int(n) // (COMPACT_BLOCK * COMPACT_MAX_TILES)))
    tile_size = COMPACT_BLOCK * per_thread
    return tile_size, -(-int(n) // tile_size)


def _address(a) -> int:
    return int(a.ctypes.data) if isinstance(a, np.ndarray) else int(a.data.ptr)


def field_table(xp, source: SoA, destination: SoA):
    """The compaction kernel's table of (source address, destination address, bytes per row).

    Parameters
    ----------
    source, destination : SoA of one type
        Buffers that do not overlap; their first rows are moved.

    Returns
    -------
    (3 * num_fields,) int64
        On the backend of ``xp``; valid while both buffers live.
    """
    if type(source) is not type(destination):
        raise TypeError(f"source and destination must be of one queue type, got "
                        f"{type(source).__name__} and {type(destination).__name__}")
    fields = dataclasses.fields(source)
    if len(fields) > COMPACT_MAX_FIELDS:
        raise ValueError(f"{type(source).__name__} has {len(fields)} fields; the compaction kernel "
                         f"takes at most {COMPACT_MAX_FIELDS}")
    rows = []
    for f in fields:
        a, b = getattr(source, f.name), getattr(destination, f.name)
        for name, array in (("source", a), ("destination", b)):
            if not array.flags.c_contiguous:
                raise ValueError(f"{name} field {f.name} must be C-contiguous")
        row_bytes = a.dtype.itemsize * (f.metadata["width"] or 1)
        rows += [_address(a), _address(b), row_bytes]
    return xp.asarray(np.array(rows, dtype=np.int64))


def _live_mask(queue: SoA):
    flag = getattr(queue, queue.live_field)
    return flag != 0 if flag.dtype == np.uint8 else flag > 0


def compact_rows_xp(xp, source: SoA, destination: SoA, live=None, dead_to_back: bool = False) -> int:
    """Array-expression twin of :meth:`Compactor.compact`: move the live rows to the front.

    Parameters
    ----------
    source : SoA
        ``n`` rows (a view of a buffer).
    destination : SoA of the same type
        At least ``n`` rows, not overlapping ``source``; rows ``[0, num_live)``
        of every field receive the live rows in order.
    live : (n,) bool, optional
        Default: the source's ``live_field`` (nonzero, or > 0 for float).
    dead_to_back : bool
        Also mark rows ``[num_live, n)`` of the destination's ``live_field``
        dead (0, or -1 for float), as the kernel does.

    Returns
    -------
    int
        ``num_live``.
    """
    if live is None:
        live = _live_mask(source)
    index = xp.flatnonzero(live)
    num_live = int(index.shape[0])
    for name, array in source.arrays().items():
        getattr(destination, name)[:num_live] = array[index]
    if dead_to_back:
        flag = getattr(destination, source.live_field)
        flag[num_live:source.size] = 0 if flag.dtype == np.uint8 else -1
    return num_live


class Compactor:
    """Order-keeping stream compaction of SoA queues with the kernels of render.cu.

    One compaction is two launches over tiles of rows (see
    :func:`compaction_tiles`): ``kd_render_count_live_tiles`` counts the live
    rows of each tile, and ``kd_render_compact_rows`` ranks the live rows of
    its tile (the counts of the tiles before it plus a block scan) and moves
    every field, described by a :func:`field_table`. The number of live rows
    stays on the device in :attr:`counters` until :meth:`read_counters`.

    Parameters
    ----------
    xp : module
        CuPy (or NumPy, for the kernels compiled for the host in the tests).

    Attributes
    ----------
    tile_count : (COMPACT_MAX_TILES,) int32
    counters : (NUM_COUNTERS,) int64
        See the ``COUNTER_*`` slots.
    """

    def __init__(self, xp):
        self.xp = xp
        self.tile_count = xp.zeros(COMPACT_MAX_TILES, dtype=np.int32)
        self.counters = xp.zeros(NUM_COUNTERS, dtype=np.int64)
        self.counters_host = self.counters
        if xp is not np:
            # pinned host memory: the per-bounce count read is one small async copy
            memory = xp.cuda.alloc_pinned_memory(NUM_COUNTERS * 8)
            self.counters_host = np.frombuffer(memory, np.int64, NUM_COUNTERS)

    def compact(self, description: str, source: SoA, table, destination: SoA,
                dead_to_back: bool = False, total_slot: int = COUNTER_LIVE_PATHS,
                sum_slot: int = -1) -> None:
        """Move the live rows of ``source`` to the front of ``destination``, order kept.

        Parameters
        ----------
        description : str
            Profile name; the launches are ``"<description>: count tiles"``
            and ``"<description>: move rows"``.
        source : SoA
            ``n`` rows, a view of the first rows of the buffer that ``table``
            was made from; rows are live by the queue's ``live_field``.
        table : (3 * num_fields,) int64
            :func:`field_table` of (source buffer, destination buffer).
        destination : SoA
            The destination buffer.
        dead_to_back : bool
            Mark rows ``[num_live, n)`` of the destination dead as well.
        total_slot : int
            Counter that receives ``num_live``.
        sum_slot : int
            Counter that ``num_live`` is added to (-1: none).
        """
        n = source.size
        if n == 0:
            self.counters[total_slot] = 0
            return
        flag = getattr(source, source.live_field)
        flag_kind = COMPACT_FLAG_U8 if flag.dtype == np.uint8 else COMPACT_FLAG_F32
        tile_size, num_tiles = compaction_tiles(n)
        num_fields = len(dataclasses.fields(source))
        _launch(None, description + ": count tiles", "kd_render_count_live_tiles",
                num_tiles * COMPACT_BLOCK, (
                    _i32(n), _i32(tile_size), flag, _i32(flag_kind), self.tile_count),
                block=COMPACT_BLOCK)
        _launch(None, description + ": move rows", "kd_render_compact_rows",
                num_tiles * COMPACT_BLOCK, (
                    _i32(n), _i32(tile_size), _i32(num_tiles), flag, _i32(flag_kind),
                    self.tile_count, _i32(num_fields), table, _i32(1 if dead_to_back else 0),
                    getattr(destination, source.live_field), self.counters, _i32(total_slot),
                    _i32(sum_slot)),
                block=COMPACT_BLOCK)

    def read_counters(self) -> np.ndarray:
        """The counters on the host: a device-to-host read, which waits for the GPU.

        Returns
        -------
        (NUM_COUNTERS,) int64
            Valid until the next read.
        """
        if self.xp is np:
            return self.counters
        self.counters.get(out=self.counters_host)
        return self.counters_host


@dataclasses.dataclass
class QueueBuffers:
    """The queues of one render, allocated once at the size of a pass and reused by every bounce.

    Attributes
    ----------
    paths : tuple of two PathQueue
        Ping-pong buffers; ``paths[current]`` holds the live queue.
    path_tables : tuple of two (3 * 9,) int64
        :func:`field_table` from ``paths[k]`` to ``paths[1 - k]``.
    light_samples : LightSampleQueue
    shadow : ShadowQueue
        Shadow rays as expanded, one per path.
    shadow_compact : ShadowQueue
        The shadow rays that carry light, at the front.
    shadow_table : (3 * 5,) int64
    ray_tmin : (capacity,) float32
        Zeros: the ``tmin`` of every ray.
    compactor : Compactor or None
        With the kernels only.
    current : int
    """

    paths: tuple
    path_tables: tuple
    light_samples: LightSampleQueue
    shadow: ShadowQueue
    shadow_compact: ShadowQueue
    shadow_table: object
    ray_tmin: object
    compactor: Optional[Compactor]
    current: int = 0

    @classmethod
    def allocate(cls, xp, capacity: int, use_kernels: bool, compaction: bool) -> "QueueBuffers":
        """Buffers for passes of up to ``capacity`` paths.

        The array-expression stages leave rows they do not reach untouched,
        so their buffers start zeroed (finite values everywhere); the kernels
        write every row they later read.
        """
        zero = not use_kernels
        paths = (PathQueue.allocate(xp, capacity, zero=zero),
                 PathQueue.allocate(xp, capacity, zero=zero) if compaction else None)
        shadow = ShadowQueue.allocate(xp, capacity, zero=zero)
        shadow_compact = ShadowQueue.allocate(xp, capacity, zero=zero) if compaction else None
        path_tables = shadow_table = compactor = None
        if compaction and use_kernels:
            path_tables = (field_table(xp, paths[0], paths[1]), field_table(xp, paths[1], paths[0]))
            shadow_table = field_table(xp, shadow, shadow_compact)
            compactor = Compactor(xp)
        return cls(paths=paths, path_tables=path_tables,
                   light_samples=LightSampleQueue.allocate(xp, capacity, zero=zero),
                   shadow=shadow, shadow_compact=shadow_compact, shadow_table=shadow_table,
                   ray_tmin=xp.zeros(capacity, dtype=np.float32), compactor=compactor)


# --- the render context ------------------------------------------------------------
@dataclasses.dataclass
class RenderContext:
    """State shared by the stages of one render."""

    xp: object
    device: str
    scene: DeviceScene
    tracer: object
    width: int
    height: int
    seed: int
    max_depth: Optional[int]
    rr_start_depth: int
    compaction: bool
    use_kernels: bool
    pass_radiance: object = None  # (num_pixels, 3) float32, radiance of the current pass
    film_sum: object = None  # (num_pixels, 3) float32, sum over passes
    buffers: Optional[QueueBuffers] = None

    @property
    def num_pixels(self) -> int:
        return self.width * self.height


_kernel_cache: dict = {}


def _kernel(name: str):
    # about a dozen lookups per bounce: one dict access per (device, kernel)
    # after the first compile through the module factory
    import cupy

    key = (cupy.cuda.runtime.getDevice(), name)
    kernel = _kernel_cache.get(key)
    if kernel is None:
        from .kernels import get_function

        kernel = _kernel_cache[key] = get_function(RENDER_SOURCE, name)
    return kernel


def _launch(ctx: Optional[RenderContext], description: str, name: str, n: int, args: tuple,
            block: Optional[int] = None) -> None:
    from .launch import DEFAULT_BLOCK, launch

    launch(description, _kernel(name), n, args, block=block or DEFAULT_BLOCK)


@contextlib.contextmanager
def _stage(ctx: RenderContext, description: str):
    from .launch import stage

    with stage(description, xp=ctx.xp):
        yield


def _tracer_stage(ctx: RenderContext, description: str):
    # the GPU traversal names and times its own launches ("trace closest hit",
    # "trace any hit"); a stage around it would count that time twice
    if getattr(ctx.tracer, "records_own_launches", False):
        return contextlib.nullcontext()
    return _stage(ctx, description)


def _f32(x) -> np.float32:
    return np.float32(x)


def _i32(x) -> np.int32:
    return np.int32(x)


def scatter_add_rows(xp, target, index, values) -> None:
    """``target[index[i]] += values[i]`` with repeated indices summed.

    Parameters
    ----------
    target : (num_rows, 3) float32
    index : (k,) int
    values : (k, 3) float
    """
    if index.shape[0] == 0:
        return
    if xp is np:
        for c in range(target.shape[1]):
            target[:, c] += np.bincount(index, weights=values[:, c],
                                        minlength=target.shape[0]).astype(np.float32)
    else:
        import cupyx

        cupyx.scatter_add(target, index, values.astype(np.float32))


def _surface(ctx: RenderContext, tri, u, v, direction):
    """Hit point and unit geometric normal facing against ``direction`` (k rows)."""
    xp = ctx.xp
    corners = ctx.scene.tri_vertex[tri]  # (k, 3, 4)
    v0 = corners[:, 0, :3]
    point = v0 + u[:, None] * (corners[:, 1, :3] - v0) + v[:, None] * (corners[:, 2, :3] - v0)
    normal = ctx.scene.tri_normal[tri, :3]
    facing = xp.where(xp.sum(normal * direction, axis=1) < 0, np.float32(1), np.float32(-1))
    return point.astype(np.float32), (normal * facing[:, None]).astype(np.float32)


def offset_origin(ctx: RenderContext, point, normal):
    """Origin of a ray leaving ``point``: pushed along ``normal`` by a scale-relative epsilon.

    The offset grows with the magnitude of the coordinates (the rounding error
    of a float32 hit point does), with a floor of ``min_scale`` near the
    origin; a fixed fraction of the scene size would bias small details of
    large scenes.
    """
    xp = ctx.xp
    sc = ctx.scene
    scale = xp.maximum(xp.max(xp.abs(point), axis=1), _f32(sc.min_scale))
    return (point + (_f32(sc.ray_epsilon) * scale)[:, None] * normal).astype(np.float32)


def emitter_cosine(ctx: RenderContext, normal, direction):
    """Cosine at an emitter toward the receiver; <= 0 on the back of a one-sided emitter.

    ``direction`` is that of the ray arriving at the emitter (k rows).
    """
    c = -ctx.xp.sum(normal * direction, axis=1)
    return ctx.xp.abs(c) if ctx.scene.two_sided else c


def _normalize_rows(xp, a):
    return (a / xp.sqrt(xp.sum(a * a, axis=1))[:, None]).astype(np.float32)


def _power_heuristic(xp, pdf_a, pdf_b):
    a2 = pdf_a * pdf_a
    b2 = pdf_b * pdf_b
    total = a2 + b2
    return xp.where(total > 0, a2 / xp.where(total > 0, total, 1), 0).astype(np.float32)


# --- stages --------------------------------------------------------------------------
def generate_camera_rays(ctx: RenderContext, first_sample: int, num_samples: int) -> PathQueue:
    """One camera ray per (pixel, sample) for samples ``first_sample ...``.

    Path ``i`` belongs to pixel ``i % num_pixels`` and sample
    ``first_sample + i // num_pixels``; the ray goes through a uniformly
    jittered point of the pixel.

    Returns
    -------
    PathQueue
        ``num_pixels * num_samples`` live paths, throughput 1, depth 0: a
        view of the first path buffer.
    """
    xp = ctx.xp
    n = ctx.num_pixels * num_samples
    ctx.buffers.current = 0
    queue = ctx.buffers.paths[0].prefix(n)
    seed_hash = np.uint32(pcg_hash_scalar(int(ctx.seed) & _U32))
    if ctx.use_kernels:
        _launch(ctx, "render: generate camera rays", "kd_render_generate_camera_rays", n, (
            _i32(n), _i32(ctx.width), _i32(ctx.height), _i32(first_sample), seed_hash,
            stream_salt(0, DIM_PIXEL_X), stream_salt(0, DIM_PIXEL_Y), ctx.scene.camera_frame,
            queue.ray_origin, queue.ray_direction, queue.ray_tmax, queue.path_throughput,
            queue.path_bsdf_pdf, queue.path_pixel, queue.path_key, queue.path_depth,
            queue.path_alive))
        return queue
    with _stage(ctx, "render: generate camera rays"):
        path = xp.arange(n, dtype=np.int64)
        pixel = (path % ctx.num_pixels).astype(np.int32)
        sample = (first_sample + path // ctx.num_pixels).astype(np.uint32)
        key = path_keys(xp, ctx.seed, sample, pixel)
        jitter_x = uniform_from_key(xp, key, stream_salt(0, DIM_PIXEL_X))
        jitter_y = uniform_from_key(xp, key, stream_salt(0, DIM_PIXEL_Y))
        px = (pixel % ctx.width).astype(np.float32)
        py = (pixel // ctx.width).astype(np.float32)
        sx = (px + jitter_x) * _f32(2.0 / ctx.width) - _f32(1.0)
        sy = _f32(1.0) - (py + jitter_y) * _f32(2.0 / ctx.height)
        frame = ctx.scene.camera_frame
        direction = frame[3][None, :] + sx[:, None] * frame[1][None, :] + sy[:, None] * frame[2][None, :]
        queue.ray_origin[:] = frame[0][None, :]
        queue.ray_direction[:] = _normalize_rows(xp, direction)
        queue.ray_tmax[:] = np.inf
        queue.path_throughput[:] = 1
        queue.path_bsdf_pdf[:] = 0
        queue.path_pixel[:] = pixel
        queue.path_key[:] = key
        queue.path_depth[:] = 0
        queue.path_alive[:] = 1
    return queue


def intersect_closest(ctx: RenderContext, queue: PathQueue) -> HitQueue:
    """Closest hit of every ray of the queue (dead paths have an empty interval).

    Returns
    -------
    HitQueue
    """
    tmin = ctx.buffers.ray_tmin[:queue.size]
    with _tracer_stage(ctx, "render: intersect closest"):
        return ctx.tracer.intersect(queue.ray_origin, queue.ray_direction, tmin, queue.ray_tmax)


def handle_escaped_rays(ctx: RenderContext, queue: PathQueue, hit: HitQueue) -> None:
    """Add the background to live paths that hit nothing, and end them."""
    xp = ctx.xp
    bg = ctx.scene.background
    if ctx.use_kernels:
        _launch(ctx, "render: handle escaped rays", "kd_render_handle_escaped_rays", queue.size, (
            _i32(queue.size), hit.hit_tri, _f32(bg[0]), _f32(bg[1]), _f32(bg[2]),
            queue.path_throughput, queue.path_pixel, queue.path_alive, queue.ray_tmax,
            ctx.pass_radiance))
        return
    with _stage(ctx, "render: handle escaped rays"):
        escaped = xp.flatnonzero((queue.path_alive != 0) & (hit.hit_tri < 0))
        if max(bg) > 0:
            radiance = queue.path_throughput[escaped] * xp.asarray(bg, dtype=np.float32)[None, :]
            scatter_add_rows(xp, ctx.pass_radiance, queue.path_pixel[escaped], radiance)
        queue.path_alive[escaped] = 0
        queue.ray_tmax[escaped] = -1


def add_emission(ctx: RenderContext, queue: PathQueue, hit: HitQueue, depth: int) -> None:
    """Add emitted radiance at each live path's hit; end paths at ``max_depth``.

    At depth 0 the weight is 1; later the power-heuristic weight of BSDF
    sampling against light sampling (see the module docstring).
    """
    xp = ctx.xp
    sc = ctx.scene
    last = ctx.max_depth is not None and depth >= ctx.max_depth
    if ctx.use_kernels:
        _launch(ctx, "render: add emission", "kd_render_add_emission", queue.size, (
            _i32(queue.size), _i32(depth), _i32(1 if last else 0), _i32(sc.two_sided),
            hit.hit_t, hit.hit_tri,
            queue.ray_direction, queue.path_throughput, queue.path_bsdf_pdf, queue.path_pixel,
            sc.tri_normal, sc.tri_material, sc.material_emission, sc.tri_light_pmf,
            queue.path_alive, queue.ray_tmax, ctx.pass_radiance))
        return
    with _stage(ctx, "render: add emission"):
        live = xp.flatnonzero(queue.path_alive != 0)
        tri = hit.hit_tri[live]
        emission = sc.material_emission[sc.tri_material[tri], :3]
        normal = sc.tri_normal[tri]
        cos_light = emitter_cosine(ctx, normal[:, :3], queue.ray_direction[live])
        emits = xp.flatnonzero((xp.max(emission, axis=1) > 0) & (cos_light > 0))
        if emits.shape[0]:
            rows = live[emits]
            tri_e = tri[emits]
            if depth == 0:
                weight = xp.ones(rows.shape[0], dtype=np.float32)
            else:
                t = hit.hit_t[rows]
                area = normal[emits, 3]
                ok = area > 0
                pdf_light = xp.where(ok, sc.tri_light_pmf[tri_e] * t * t
                                     / xp.where(ok, area * cos_light[emits], 1),
                                     np.inf).astype(np.float32)
                weight = _power_heuristic(xp, queue.path_bsdf_pdf[rows], pdf_light)
            radiance = queue.path_throughput[rows] * emission[emits] * weight[:, None]
            scatter_add_rows(xp, ctx.pass_radiance, queue.path_pixel[rows], radiance)
        if last:
            queue.path_alive[live] = 0
            queue.ray_tmax[live] = -1


def sample_lights(ctx: RenderContext, queue: PathQueue, hit: HitQueue, depth: int) -> LightSampleQueue:
    """Pick a light triangle by power (alias table) and a uniform point on it.

    Paths that are dead, hit a black surface, or live in a scene without
    lights get ``light_tri = -1``.

    Returns
    -------
    LightSampleQueue
    """
    xp = ctx.xp
    sc = ctx.scene
    samples = ctx.buffers.light_samples.prefix(queue.size)
    num_lights = sc.num_lights
    if ctx.use_kernels:
        _launch(ctx, "render: sample lights", "kd_render_sample_lights", queue.size, (
            _i32(queue.size), _i32(num_lights), stream_salt(depth, DIM_LIGHT_SELECT),
            stream_salt(depth, DIM_LIGHT_U), stream_salt(depth, DIM_LIGHT_V), queue.path_alive,
            queue.path_key, hit.hit_tri, sc.tri_material, sc.material_albedo, sc.light_tri,
            sc.light_alias_prob, sc.light_alias_index, samples.light_tri, samples.light_u,
            samples.light_v))
        return samples
    with _stage(ctx, "render: sample lights"):
        samples.light_tri[:] = -1
        if num_lights == 0:
            return samples
        live = xp.flatnonzero(queue.path_alive != 0)
        albedo = sc.material_albedo[sc.tri_material[hit.hit_tri[live]], :3]
        live = live[xp.max(albedo, axis=1) > 0]
        key = queue.path_key[live]
        u_select = uniform_from_key(xp, key, stream_salt(depth, DIM_LIGHT_SELECT))
        r1 = uniform_from_key(xp, key, stream_salt(depth, DIM_LIGHT_U))
        r2 = uniform_from_key(xp, key, stream_salt(depth, DIM_LIGHT_V))
        scaled = u_select * _f32(num_lights)
        bucket = xp.minimum(scaled.astype(np.int32), num_lights - 1)
        keep = (scaled - bucket.astype(np.float32)) < sc.light_alias_prob[bucket]
        chosen = xp.where(keep, bucket, sc.light_alias_index[bucket])
        su = xp.sqrt(r1)
        samples.light_tri[live] = sc.light_tri[chosen]
        samples.light_u[live] = su * (_f32(1) - r2)
        samples.light_v[live] = su * r2
    return samples


def expand_light_samples(ctx: RenderContext, queue: PathQueue, hit: HitQueue,
                         samples: LightSampleQueue) -> ShadowQueue:
    """Turn compact light samples into shadow rays with their MIS-weighted radiance."""
    xp = ctx.xp
    sc = ctx.scene
    # the kernel sets shadow_tmax = -1 where it writes nothing else
    shadow = ctx.buffers.shadow.prefix(queue.size)
    if ctx.use_kernels:
        _launch(ctx, "render: expand light samples", "kd_render_expand_light_samples", queue.size, (
            _i32(queue.size), _f32(sc.ray_epsilon), _f32(sc.min_scale), _i32(sc.two_sided),
            hit.hit_tri, hit.hit_u, hit.hit_v,
            queue.ray_direction, queue.path_throughput, queue.path_pixel, samples.light_tri,
            samples.light_u, samples.light_v, sc.tri_vertex, sc.tri_normal, sc.tri_material,
            sc.material_albedo, sc.material_emission, sc.tri_light_pmf, shadow.shadow_origin,
            shadow.shadow_direction, shadow.shadow_tmax, shadow.shadow_radiance,
            shadow.shadow_pixel))
        return shadow
    with _stage(ctx, "render: expand light samples"):
        shadow.shadow_tmax[:] = -1
        rows = xp.flatnonzero(samples.light_tri >= 0)
        tri = hit.hit_tri[rows]
        point, normal = _surface(ctx, tri, hit.hit_u[rows], hit.hit_v[rows], queue.ray_direction[rows])
        origin = offset_origin(ctx, point, normal)
        light = samples.light_tri[rows]
        corners = sc.tri_vertex[light]
        lv0 = corners[:, 0, :3]
        target = (lv0 + samples.light_u[rows][:, None] * (corners[:, 1, :3] - lv0)
                  + samples.light_v[rows][:, None] * (corners[:, 2, :3] - lv0))
        to_light = target - origin
        distance = xp.sqrt(xp.sum(to_light * to_light, axis=1))
        safe_distance = xp.where(distance > 0, distance, 1)
        wi = (to_light / safe_distance[:, None]).astype(np.float32)
        cos_surface = xp.sum(normal * wi, axis=1)
        light_normal = sc.tri_normal[light]
        cos_light = emitter_cosine(ctx, light_normal[:, :3], wi)
        area = light_normal[:, 3]
        ok = (distance > 0) & (cos_surface > 0) & (cos_light > 0) & (area > 0)
        pdf_light = (sc.tri_light_pmf[light] * distance * distance
                     / xp.where(ok, area * cos_light, 1)).astype(np.float32)
        pdf_bsdf = (cos_surface * _f32(INV_PI)).astype(np.float32)
        weight = _power_heuristic(xp, pdf_light, pdf_bsdf)
        albedo = sc.material_albedo[sc.tri_material[tri], :3]
        emission = sc.material_emission[sc.tri_material[light], :3]
        scale = xp.where(ok, cos_surface * weight / xp.where(ok, pdf_light, 1) * _f32(INV_PI), 0)
        shadow.shadow_origin[rows] = origin
        shadow.shadow_direction[rows] = wi
        shadow.shadow_tmax[rows] = xp.where(ok, distance * _f32(SHADOW_TMAX_SCALE), -1)
        shadow.shadow_radiance[rows] = queue.path_throughput[rows] * albedo * emission * scale[:, None]
        shadow.shadow_pixel[rows] = queue.path_pixel[rows]
    return shadow


def trace_shadow_rays(ctx: RenderContext, queue: PathQueue, hit: HitQueue,
                      samples: LightSampleQueue) -> int:
    """Expand the light samples, test visibility (any hit), add what is unoccluded.

    Returns
    -------
    int
        Shadow rays traced as far as the host knows them: queue entries
        without compaction, the rays that carry light with compaction on the
        array-expression path, and 0 with compaction on the kernel path, where
        they are counted on the device (``COUNTER_SHADOW_RAYS_TOTAL``).
    """
    xp = ctx.xp
    shadow = expand_light_samples(ctx, queue, hit, samples)
    num_counted = shadow.size
    if ctx.compaction:
        shadow, num_counted = compact_shadow_rays(ctx, shadow)
    num_rays = shadow.size
    if num_rays == 0:
        return 0
    tmin = ctx.buffers.ray_tmin[:num_rays]
    with _tracer_stage(ctx, "render: trace shadow rays"):
        occluded = ctx.tracer.occluded(shadow.shadow_origin, shadow.shadow_direction, tmin,
                                       shadow.shadow_tmax)
    if ctx.use_kernels:
        _launch(ctx, "render: add unoccluded light", "kd_render_add_unoccluded", num_rays, (
            _i32(num_rays), occluded.astype(bool, copy=False), shadow.shadow_tmax, shadow.shadow_radiance,
            shadow.shadow_pixel, ctx.pass_radiance))
    else:
        with _stage(ctx, "render: add unoccluded light"):
            visible = xp.flatnonzero(~occluded & (shadow.shadow_tmax > 0))
            scatter_add_rows(xp, ctx.pass_radiance, shadow.shadow_pixel[visible],
                             shadow.shadow_radiance[visible])
    return num_counted


def compact_shadow_rays(ctx: RenderContext, shadow: ShadowQueue):
    """Move the shadow rays that carry light (``shadow_tmax > 0``) to the front.

    With the kernels no count comes to the host: the returned queue keeps all
    ``shadow.size`` rows, the rays in front and rows marked dead
    (``shadow_tmax = -1``) behind them, so the traversal's dead threads are
    whole warps at the end that return at once.

    Returns
    -------
    shadow : ShadowQueue
        A view of the compacted buffer.
    num_counted : int
        The rays in front, or 0 when they are counted on the device.
    """
    b = ctx.buffers
    if ctx.use_kernels:
        b.compactor.compact("render: compact shadow rays", shadow, b.shadow_table,
                            b.shadow_compact, dead_to_back=True, total_slot=COUNTER_SHADOW_RAYS,
                            sum_slot=COUNTER_SHADOW_RAYS_TOTAL)
        return b.shadow_compact.prefix(shadow.size), 0
    with _stage(ctx, "render: compact shadow rays"):
        # device-to-host read on CuPy (the twin's flatnonzero): it sizes the queue
        num_rays = compact_rows_xp(ctx.xp, shadow, b.shadow_compact)
    return b.shadow_compact.prefix(num_rays), num_rays


def sample_bsdf(ctx: RenderContext, queue: PathQueue, hit: HitQueue, depth: int) -> None:
    """Lambertian reflection, cosine-weighted: the next ray of every live path.

    The throughput is multiplied by the albedo (``f * cos / pdf``); paths on
    black surfaces end.
    """
    xp = ctx.xp
    sc = ctx.scene
    if ctx.use_kernels:
        _launch(ctx, "render: sample bsdf", "kd_render_sample_bsdf", queue.size, (
            _i32(queue.size), _f32(sc.ray_epsilon), _f32(sc.min_scale),
            stream_salt(depth, DIM_BSDF_PHI),
            stream_salt(depth, DIM_BSDF_R), hit.hit_tri, hit.hit_u, hit.hit_v, sc.tri_vertex,
            sc.tri_normal, sc.tri_material, sc.material_albedo, queue.path_key, queue.ray_origin,
            queue.ray_direction, queue.ray_tmax, queue.path_throughput, queue.path_bsdf_pdf,
            queue.path_depth, queue.path_alive))
        return
    with _stage(ctx, "render: sample bsdf"):
        live = xp.flatnonzero(queue.path_alive != 0)
        tri = hit.hit_tri[live]
        albedo = sc.material_albedo[sc.tri_material[tri], :3]
        black = xp.max(albedo, axis=1) <= 0
        point, normal = _surface(ctx, tri, hit.hit_u[live], hit.hit_v[live], queue.ray_direction[live])
        key = queue.path_key[live]
        phi = uniform_from_key(xp, key, stream_salt(depth, DIM_BSDF_PHI)) * _f32(2 * math.pi)
        r2 = uniform_from_key(xp, key, stream_salt(depth, DIM_BSDF_R))
        radius = xp.sqrt(r2)
        local_x = radius * xp.cos(phi)
        local_y = radius * xp.sin(phi)
        local_z = xp.sqrt(xp.maximum(_f32(0), _f32(1) - r2))
        tangent, bitangent = orthonormal_basis(xp, normal)
        direction = (local_x[:, None] * tangent + local_y[:, None] * bitangent
                     + local_z[:, None] * normal)
        queue.ray_origin[live] = offset_origin(ctx, point, normal)
        queue.ray_direction[live] = _normalize_rows(xp, direction)
        queue.path_throughput[live] *= albedo
        queue.path_bsdf_pdf[live] = local_z * _f32(INV_PI)
        queue.path_depth[live] += 1
        dead = live[black | (local_z <= 0)]
        queue.path_alive[dead] = 0
        queue.ray_tmax[dead] = -1


def orthonormal_basis(xp, normal):
    """Tangent and bitangent of unit normals (Duff et al. 2017, branchless).

    Parameters
    ----------
    normal : (k, 3) float32

    Returns
    -------
    tangent, bitangent : (k, 3) float32
    """
    nx, ny, nz = normal[:, 0], normal[:, 1], normal[:, 2]
    sign = xp.where(nz >= 0, _f32(1), _f32(-1))
    a = _f32(-1) / (sign + nz)
    b = nx * ny * a
    tangent = xp.stack([_f32(1) + sign * nx * nx * a, sign * b, -sign * nx], axis=1)
    bitangent = xp.stack([b, sign + ny * ny * a, -ny], axis=1)
    return tangent.astype(np.float32), bitangent.astype(np.float32)


def russian_roulette(ctx: RenderContext, queue: PathQueue, depth: int) -> None:
    """End paths at random once ``depth >= rr_start_depth``; reweight survivors.

    A path survives with probability ``q = min(1, max(throughput))`` and its
    throughput is divided by ``q``. ``depth`` is the depth of the paths'
    next vertex.
    """
    if depth < ctx.rr_start_depth:
        return
    xp = ctx.xp
    salt = stream_salt(depth, DIM_ROULETTE)
    if ctx.use_kernels:
        _launch(ctx, "render: russian roulette", "kd_render_russian_roulette", queue.size, (
            _i32(queue.size), salt, queue.path_key, queue.path_throughput, queue.path_alive,
            queue.ray_tmax))
        return
    with _stage(ctx, "render: russian roulette"):
        live = xp.flatnonzero(queue.path_alive != 0)
        throughput = queue.path_throughput[live]
        survive = xp.minimum(xp.max(throughput, axis=1), _f32(1))
        u = uniform_from_key(xp, queue.path_key[live], salt)
        dies = u >= survive
        queue.path_throughput[live] = throughput / xp.where(dies, _f32(1), survive)[:, None]
        dead = live[dies]
        queue.path_alive[dead] = 0
        queue.ray_tmax[dead] = -1


def compact_paths(ctx: RenderContext, queue: PathQueue):
    """Move the live paths to the front of the other path buffer (``compaction=True``), or count them.

    Returns
    -------
    queue : PathQueue
        The compacted queue (a view of the other buffer), or the same one.
    num_live : int
        Live paths (a device-to-host read: the loop needs it to stop, and
        the next bounce's launches are sized by it).
    """
    xp = ctx.xp
    if not ctx.compaction:
        with _stage(ctx, "render: count live paths"):
            return queue, int(xp.count_nonzero(queue.path_alive))
    b = ctx.buffers
    source, target = b.current, 1 - b.current
    if ctx.use_kernels:
        b.compactor.compact("render: compact paths", queue, b.path_tables[source], b.paths[target],
                            total_slot=COUNTER_LIVE_PATHS)
        # device-to-host read of the count (the loop's one synchronization per bounce)
        num_live = int(b.compactor.read_counters()[COUNTER_LIVE_PATHS])
    else:
        with _stage(ctx, "render: compact paths"):
            num_live = compact_rows_xp(xp, queue, b.paths[target])
    b.current = target
    return b.paths[target].prefix(num_live), num_live


def accumulate_film(ctx: RenderContext) -> None:
    """Add the pass's radiance to the film sum and clear it for the next pass."""
    with _stage(ctx, "render: accumulate film"):
        ctx.film_sum += ctx.pass_radiance
        ctx.pass_radiance.fill(0)


def trace_paths(ctx: RenderContext, first_sample: int, num_samples: int, stats: dict) -> None:
    """One pass: ``num_samples`` samples of every pixel, traced to the end."""
    queue = generate_camera_rays(ctx, first_sample, num_samples)
    num_live = queue.size
    depth = 0
    while num_live > 0 and depth < DEPTH_HARD_LIMIT:
        _count(stats["paths_per_depth"], depth, num_live)
        _count(stats["queue_per_depth"], depth, queue.size)
        hit = intersect_closest(ctx, queue)
        handle_escaped_rays(ctx, queue, hit)
        add_emission(ctx, queue, hit, depth)
        if ctx.max_depth is not None and depth >= ctx.max_depth:
            break
        light_samples = sample_lights(ctx, queue, hit, depth)
        stats["shadow_rays"] += trace_shadow_rays(ctx, queue, hit, light_samples)
        sample_bsdf(ctx, queue, hit, depth)
        depth += 1
        russian_roulette(ctx, queue, depth)
        queue, num_live = compact_paths(ctx, queue)
    stats["max_depth_reached"] = max(stats["max_depth_reached"], depth)
    accumulate_film(ctx)


def _count(table: list, index: int, value: int) -> None:
    while len(table) <= index:
        table.append(0)
    table[index] += int(value)


# --- public API ------------------------------------------------------------------------
@dataclasses.dataclass
class RenderResult:
    """A rendered image and what it took.

    Attributes
    ----------
    image : (height, width, 3) float32
        Linear radiance, the mean over samples (a NumPy array).
    stats : dict
        ``device``, ``width``, ``height``, ``spp``, ``max_depth``,
        ``compaction``, ``seconds`` (wall time of the passes, after the tree
        is built), ``samples_per_second`` (pixel samples), ``paths_per_depth``
        (live paths at the start of each depth, summed over passes),
        ``queue_per_depth`` (queue entries processed, including masked dead
        paths without compaction), ``rays`` (closest-hit rays, live only),
        ``shadow_rays`` (with compaction the rays that carry light; without,
        every queue entry, masked ones included), ``max_depth_reached``, ``passes``, ``stages``
        (per-stage profile: ``{description: {"launches", "total_ms", ...}}``),
        ``build_seconds``.
    """

    image: np.ndarray
    stats: dict

    def save_png(self, path, exposure: float = 1.0, method: str = "clamp") -> None:
        """Tone map and write the image (see :func:`save_png`)."""
        save_png(self.image, path, exposure=exposure, method=method)


def build_tree(scene: RenderScene, device: str):
    """A kd-tree over the scene's triangles with the package builder."""
    from .builder import build

    return build(scene.vertices, scene.faces, device=device)


def _check_int(name, value, minimum, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        what = "None or an integer" if allow_none else "an integer"
        raise ValueError(f"{name} must be {what} >= {minimum}, got {value!r}")
    return int(value)


class Renderer:
    """A scene prepared for rendering: tree built, scene arrays on the device.

    Rendering the same scene again (other sample counts, depths, seeds,
    compaction settings) reuses all of it; benchmarks time :meth:`render`
    alone.

    Parameters
    ----------
    scene_or_mesh, width, height, device, tree, camera, accel, kernels, ray_epsilon
        As in :func:`render`.
    """

    def __init__(self, scene_or_mesh, width: int = 512, height: int = 512, device: str = "auto",
                 tree=None, camera=None, accel: str = "kdtree", kernels: str = "cuda",
                 ray_epsilon: float = DEFAULT_RAY_EPSILON):
        self.width = _check_int("width", width, 1)
        self.height = _check_int("height", height, 1)
        if accel not in ACCEL_CHOICES:
            raise ValueError(f"accel must be one of {ACCEL_CHOICES}, got {accel!r}")
        if kernels not in KERNEL_CHOICES:
            raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {kernels!r}")
        if not (isinstance(ray_epsilon, (int, float)) and 0 <= ray_epsilon < 1):
            raise ValueError(f"ray_epsilon must be a number in [0, 1), got {ray_epsilon!r}")
        self.device = resolve_device(device).kind
        self.scene = as_render_scene(scene_or_mesh, camera=camera)
        self.accel = accel
        self.kernels = kernels if self.device == "cuda" else "xp"
        if self.device == "cuda":
            import cupy as xp
        else:
            xp = np
        self.xp = xp
        self.build_seconds = 0.0
        if accel == "brute":
            self.tree = None
            self.tracer = BruteForceTracer(xp, self.scene.vertices, self.scene.faces)
        else:
            if tree is None:
                start = time.perf_counter()
                tree = build_tree(self.scene, self.device)
                self.build_seconds = time.perf_counter() - start
            elif tree.num_triangles != self.scene.num_triangles:
                raise SceneError(f"tree has {tree.num_triangles} triangles but the scene has "
                                 f"{self.scene.num_triangles}; build it over the scene's triangles")
            self.tree = tree
            self.tracer = KdTreeTracer(tree, self.device)
        self.device_scene = upload_scene(xp, self.scene, self.width, self.height, ray_epsilon)
        # stages run as the CUDA kernels of render.cu (else as array expressions)
        self.use_kernels = self.device == "cuda" and self.kernels == "cuda"

    def render(self, spp: int = 64, max_depth: Optional[int] = 8, compaction: bool = True,
               seed: int = 0, rr_start_depth: int = DEFAULT_RR_START_DEPTH,
               paths_per_pass: Optional[int] = None, profile: bool = True,
               profiler=None) -> RenderResult:
        """Trace ``spp`` samples per pixel; see :func:`render` for the parameters.

        Parameters
        ----------
        profile : bool
            Record per-stage times (CUDA events around every launch, or
            ``perf_counter`` on the CPU) into ``stats["stages"]``. Off, the
            stages run without events and ``stats["stages"]`` is empty.
        """
        spp = _check_int("spp", spp, 1)
        max_depth = _check_int("max_depth", max_depth, 0, allow_none=True)
        rr_start_depth = _check_int("rr_start_depth", rr_start_depth, 0)
        if not isinstance(compaction, bool):
            raise TypeError(f"compaction must be a bool, got {compaction!r}")
        xp = self.xp
        ctx = RenderContext(
            xp=xp, device=self.device, scene=self.device_scene, tracer=self.tracer,
            width=self.width, height=self.height, seed=int(seed), max_depth=max_depth,
            rr_start_depth=rr_start_depth, compaction=compaction, use_kernels=self.use_kernels)
        ctx.pass_radiance = xp.zeros((ctx.num_pixels, 3), dtype=np.float32)
        ctx.film_sum = xp.zeros((ctx.num_pixels, 3), dtype=np.float32)
        if paths_per_pass is None:
            paths_per_pass = DEFAULT_PATHS_PER_PASS[self.device]
        paths_per_pass = _check_int("paths_per_pass", paths_per_pass, 1)
        samples_per_pass = max(1, min(spp, paths_per_pass // ctx.num_pixels))
        # every queue of every bounce lives in these (allocated before the clock starts)
        ctx.buffers = QueueBuffers.allocate(xp, samples_per_pass * ctx.num_pixels,
                                            self.use_kernels, compaction)
        stats = {"paths_per_depth": [], "queue_per_depth": [], "shadow_rays": 0,
                 "max_depth_reached": 0}

        from .launch import Profiler, active_profiler, profiling, set_active_profiler

        if profile:
            profiler = profiler or active_profiler() or Profiler()
            before = profiler.as_dict()
            scope = profiling(profiler)
        else:
            profiler = None
            scope = _profiling_off(set_active_profiler)
        passes = 0
        with scope:
            if self.device == "cuda":
                xp.cuda.get_current_stream().synchronize()
            start = time.perf_counter()
            for first in range(0, spp, samples_per_pass):
                trace_paths(ctx, first, min(samples_per_pass, spp - first), stats)
                passes += 1
            image = ctx.film_sum / np.float32(spp)
            if self.device == "cuda":
                image = image.get()  # device-to-host copy: waits for the last pass
            seconds = time.perf_counter() - start
        if ctx.buffers.compactor is not None:
            # shadow rays counted on the device (the GPU is idle: no wait)
            stats["shadow_rays"] += int(
                ctx.buffers.compactor.read_counters()[COUNTER_SHADOW_RAYS_TOTAL])
        stages = _profile_difference(before, profiler.as_dict()) if profile else {}

        stats.update({
            "device": self.device,
            "width": self.width,
            "height": self.height,
            "spp": spp,
            "max_depth": max_depth,
            "compaction": compaction,
            "kernels": self.kernels,
            "accel": self.accel,
            "seed": int(seed),
            "passes": passes,
            "samples_per_pass": samples_per_pass,
            "seconds": seconds,
            "build_seconds": self.build_seconds,
            "samples_per_second": self.width * self.height * spp / max(seconds, 1e-12),
            "rays": int(sum(stats["paths_per_depth"])),
            "stages": stages,
            "scene": self.scene.name,
            "num_triangles": self.scene.num_triangles,
        })
        image = np.asarray(image, dtype=np.float32).reshape(self.height, self.width, 3)
        return RenderResult(image=image, stats=stats)


@contextlib.contextmanager
def _profiling_off(set_active_profiler):
    previous = set_active_profiler(None)
    try:
        yield
    finally:
        set_active_profiler(previous)


def render(scene_or_mesh, width: int = 512, height: int = 512, spp: int = 64,
           max_depth: Optional[int] = 8, device: str = "auto", compaction: bool = True,
           seed: int = 0, tree=None, camera=None, accel: str = "kdtree",
           rr_start_depth: int = DEFAULT_RR_START_DEPTH, paths_per_pass: Optional[int] = None,
           kernels: str = "cuda", ray_epsilon: float = DEFAULT_RAY_EPSILON,
           profile: bool = True, profiler=None) -> RenderResult:
    """Path-trace a scene.

    Parameters
    ----------
    scene_or_mesh : RenderScene, scene object, or (vertices, faces)
        See :func:`kdtree_gpu.render_scene.as_render_scene`; a bare mesh gets
        a default camera and an area light above it.
    width, height : int
        Image size in pixels.
    spp : int
        Samples per pixel.
    max_depth : int or None
        Maximum number of bounces (pbrt-v4 convention, see the module
        docstring); ``None``: no limit but Russian roulette.
    device : {"auto", "cuda", "gpu", "cpu"}
    compaction : bool
        Gather live paths after every bounce (True) or keep dead paths in the
        queue, masked (False).
    seed : int
        Seed of the random numbers; equal seeds give equal images on one
        device.
    tree : KdTree, optional
        Built over exactly the scene's triangles (for a bare mesh: the mesh
        plus the two light triangles appended by
        :func:`~kdtree_gpu.render_scene.mesh_scene`). Default: built here
        with :func:`kdtree_gpu.builder.build` on ``device``.
    camera : Camera, optional
        Replaces the scene's camera.
    accel : {"kdtree", "brute"}
        ``"brute"`` tests every ray against every triangle (a test oracle for
        small scenes; no tree is built).
    rr_start_depth : int
        First depth at which Russian roulette may end a path.
    paths_per_pass : int, optional
        Paths traced together; whole samples per pass, at least one. Default
        about 2M on the GPU and 64K on the CPU.
    kernels : {"cuda", "xp"}
        On the GPU, run the stages as the CUDA kernels of ``render.cu``
        (default) or as their array-expression twins on CuPy (for testing).
    ray_epsilon : float
        Offset of secondary ray origins off the surface, relative to the
        largest coordinate of the hit point (see :func:`offset_origin`).
    profile : bool
        Record per-stage times into ``stats["stages"]``.
    profiler : kdtree_gpu.launch.Profiler, optional
        Records every launch and stage (default: the active profiler, or a
        new one); ``stats["stages"]`` holds this render's share of it.

    Returns
    -------
    RenderResult

    Raises
    ------
    ValueError
        A bad size, sample count, depth or choice.
    SceneError
        A scene that cannot be rendered.
    """
    renderer = Renderer(scene_or_mesh, width, height, device=device, tree=tree, camera=camera,
                        accel=accel, kernels=kernels, ray_epsilon=ray_epsilon)
    return renderer.render(spp=spp, max_depth=max_depth, compaction=compaction, seed=seed,
                           rr_start_depth=rr_start_depth, paths_per_pass=paths_per_pass,
                           profile=profile, profiler=profiler)


def _profile_difference(before: dict, after: dict) -> dict:
    out = {}
    for description, s in after.items():
        b = before.get(description, {"launches": 0, "total_ms": 0.0})
        launches = s["launches"] - b["launches"]
        if launches <= 0:
            continue
        total = s["total_ms"] - b["total_ms"]
        out[description] = {"launches": launches, "total_ms": total, "avg_ms": total / launches}
    grand = sum(s["total_ms"] for s in out.values())
    for s in out.values():
        s["share"] = s["total_ms"] / grand if grand > 0 else 0.0
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["total_ms"]))
