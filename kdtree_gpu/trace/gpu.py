"""GPU ray queries: kd-tree traversal and the brute-force oracle (CuPy).

These are the CUDA backends behind :mod:`kdtree_gpu.trace.api`, which reads
the caller's arrays and calls the functions below with CuPy arrays. The
kernels live in ``kdtree_gpu/cuda/traverse.cu`` (kd-tree), ``brute.cu``
(every triangle) and ``watertight.cuh`` (the ray-triangle test of Woop,
Benthin and Wald 2013, the same as in :mod:`kdtree_gpu.trace.cpu`).

The traversal layout of a tree (:class:`TraversalLayout`)
---------------------------------------------------------
``nodes``  (num_nodes, 2) int32     packed 8-byte nodes (:func:`encoding.pack_nodes`),
                                    one ``int2`` load per node
``refs``   (num_refs,) int32         the leaves' triangles as rows of ``tris``
                                    (``leaf_tris`` renumbered)
``tris``   (3 * rows, 4) float32    every referenced triangle's vertices, one
                                    ``float4`` each, once however many leaves hold
                                    it (6 on the bunny), in the order of their first
                                    references (a leaf's triangles mostly side by
                                    side); the first vertex's ``w`` is the id
All are packed on the device (``kd_pack_layout`` and two more launches):
the GPU builder packs them as its last step, and a tree that lives elsewhere
(built on the CPU, loaded from a file) is copied to the device as it is and
packed there on its first query. Split positions and vertices are stored
times the tree's trace scale (:func:`kdtree_gpu.trace.scale.trace_scale`, a
power of two); the kernel scales every ray the same way, which leaves
``t``, ``u`` and ``v`` unchanged.

Ray conventions
---------------
A ray is ``origin + t * direction``; a hit counts when ``tmin <= t <= tmax``
(``t`` in units of the direction's length). Closest hit returns the smallest
``t``, and on equal ``t`` the lowest triangle id. Triangles are two-sided. A
ray with a NaN or infinite origin or direction, a zero direction, a NaN
interval bound or ``tmin > tmax`` is a miss; with a status record the kernel
counts such rays and keeps the first (:func:`bad_ray_message` names it).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading

import numpy as np

from .. import encoding as enc
from ..kernels import get_function, get_function_pointer
from ..launch import DEFAULT_BLOCK, launch
from ..packed_launch import PackedLaunch
from ..primitives.scan import inclusive_scan
from ..mesh import degenerate_mask, validate_mesh
from ..soa import field_names
from .scale import trace_scale
from .soa import HitSoA, RaySoA, TraceParams

TRAVERSE_SOURCE = "traverse.cu"
# kd_trace's parameter list as cuda/traverse.cu defines it, packed for the
# driver: a query is one launch, and CuPy's RawKernel call costs twice the driver's
_TRACE_LAUNCH = PackedLaunch.of_kernel(TRAVERSE_SOURCE, "kd_trace",
                                       structs=(TraceParams, RaySoA, HitSoA))
# What a query returns, in order: HitSoA fields and the dtypes of the arrays
# made for them (an any-hit result is a bool array over the kernel's bytes)
_QUERY_OUTPUTS = {False: (("hit_t", np.dtype(np.float32)), ("hit_tri", np.dtype(np.int32)),
                          ("hit_u", np.dtype(np.float32)), ("hit_v", np.dtype(np.float32))),
                  True: (("hit_any", np.dtype(np.bool_)),)}
# for each HitSoA field (declaration order), its index in a query's outputs or -1 (null)
_HIT_SLOTS = {any_hit: tuple(next((i for i, (name, _) in enumerate(outputs) if name == field), -1)
                             for field in field_names(HitSoA))
              for any_hit, outputs in _QUERY_OUTPUTS.items()}
if field_names(RaySoA) != ("ray_origin", "ray_direction", "ray_tmin", "ray_tmax"):
    raise ImportError("query() passes RaySoA as (origins, directions, null, null)")
# TraceParams' last fields are each query's; the others come with the layout
_QUERY_FIELDS = ("tmin", "tmax", "num_rays")
_FIXED_FIELDS = field_names(TraceParams)[:-len(_QUERY_FIELDS)]
if field_names(TraceParams)[-len(_QUERY_FIELDS):] != _QUERY_FIELDS:
    raise ImportError(f"TraceParams must end with the query's fields {_QUERY_FIELDS}")
BRUTE_SOURCE = "brute.cu"
_KERNEL_NAMES = {(a, c): f"kd_trace<{'true' if a else 'false'}, {'true' if c else 'false'}>"
                 for a in (False, True) for c in (False, True)}
TRACE_NAME_EXPRESSIONS = tuple(_KERNEL_NAMES.values())  # (every traverse.cu kernel's module)
_DESCRIPTIONS = {(False, False): "trace closest hit", (True, False): "trace any hit",
                 (False, True): "trace closest hit counted", (True, True): "trace any hit counted"}


@dataclasses.dataclass
class TraversalLayout:
    """A tree's traversal data on one GPU (see the module docstring).

    Attributes
    ----------
    nodes : (num_nodes, 2) cupy int32
    refs : (num_refs,) cupy int32
        The leaves' triangles as rows of ``tris``.
    tris : (3 * rows, 4) cupy float32
        Rows of the referenced triangles; a tree with degenerate triangles
        leaves a few rows at the end unused.
    bounds : (2, 3) numpy float32
        The root box (unscaled).
    scale : float
        The trace scale: a power of two.
    device_id : int
    """

    nodes: object
    refs: object
    tris: object
    bounds: np.ndarray
    scale: float
    device_id: int

    def __post_init__(self):
        # The kernel parameters' box and scale, made with the layout (in the
        # build) so that the first query costs what any later one does: the
        # values of TraceParams' fields before the query's own.
        lo, hi = (self.bounds.astype(np.float32) * np.float32(self.scale)).tolist()
        box = dict(lo_x=lo[0], lo_y=lo[1], lo_z=lo[2], hi_x=hi[0], hi_y=hi[1], hi_z=hi[2],
                   scale=self.scale)
        self.fixed = tuple(box[name] for name in _FIXED_FIELDS)
        # kd_trace's first three parameters
        self.addresses = tuple(0 if a is None else a.data.ptr
                               for a in (self.nodes, self.refs, self.tris))
        # the launch of the common query, these values packed once
        self.launch = _TRACE_LAUNCH.bound((*self.addresses, *self.fixed))

    def params(self, num_rays: int, tmin: float = 0.0, tmax: float = np.inf):
        """The kernels' :class:`TraceParams` struct (by-value argument) for these rays."""
        return TraceParams(**dict(zip(_FIXED_FIELDS, self.fixed)), tmin=tmin, tmax=tmax,
                           num_rays=num_rays).struct()


def pack_layout(cp, node_axis, node_split, node_child, node_count, leaf_tris, vertices, faces,
                bounds) -> TraversalLayout:
    """Pack a tree's traversal layout on the current device, from its device arrays.

    Parameters
    ----------
    node_axis, node_split, node_child, node_count : (num_nodes,) cupy arrays
    leaf_tris : (num_refs,) cupy int32
    vertices : (num_vertices, 3) cupy float32
    faces : (num_triangles, 3) cupy int32
    bounds : (2, 3) float32 (host)

    Returns
    -------
    TraversalLayout

    Raises
    ------
    ValueError
        The tree is too large for the packed node encoding.
    """
    from ..builder.soa import TreeNodeSoA  # the builder's, whose package imports this module

    num_nodes, num_refs = int(node_axis.shape[0]), int(leaf_tris.shape[0])
    num_tris = int(faces.shape[0])
    if max(num_nodes, num_refs) > enc.PACK_MAX_INDEX:
        raise ValueError(f"tree too large for the packed traversal layout: {num_nodes} nodes, "
                         f"{num_refs} references (at most {enc.PACK_MAX_INDEX} each)")
    bounds = np.ascontiguousarray(bounds, dtype=np.float32).reshape(2, 3)
    scale = np.float32(trace_scale(bounds))
    nodes = cp.empty((num_nodes, 2), dtype=np.int32)
    # each triangle's lowest reference, then the references that are one,
    # numbered in order: the rows of the triangles (cuda/traverse.cu)
    first = cp.empty(num_tris, dtype=np.int32)
    first.data.memset_async(0x7F, first.nbytes)  # 0x7F7F7F7F: above every reference
    tree_nodes = TreeNodeSoA(node_axis, node_split, node_child, node_count)
    _pack_launch()("pack layout", _traverse_function("kd_pack_layout"),
                   max(num_nodes, num_refs), DEFAULT_BLOCK,
                   (*tree_nodes.addresses(), num_nodes, scale, leaf_tris.data.ptr, num_refs,
                    first.data.ptr, nodes.data.ptr), cp.cuda.get_current_stream().ptr)
    first_ref = cp.empty(num_refs, dtype=np.int64)
    launch("mark first references", _traverse_kernel("kd_layout_firsts"), num_refs,
           (leaf_tris, np.int64(num_refs), first, first_ref))
    row = inclusive_scan(first_ref, description="number triangle rows")
    del first_ref
    refs = cp.empty(num_refs, dtype=np.int32)
    # every referenced triangle once: at most min(triangles, references) rows
    tris = cp.empty((3 * min(num_tris, num_refs), 4), dtype=np.float32)
    launch("pack triangles", _traverse_kernel("kd_layout_tris"), num_refs,
           (leaf_tris, np.int64(num_refs), first, row, vertices, faces, scale, refs, tris))
    return TraversalLayout(nodes=nodes, refs=refs, tris=tris, bounds=bounds, scale=float(scale),
                           device_id=cp.cuda.runtime.getDevice())


@functools.lru_cache(maxsize=None)
def _pack_launch() -> PackedLaunch:
    # the same launcher as the queries' (a GPU build's last launch, so that
    # the first query finds it ready); made at first use: TreeNodeSoA is
    # the builder's, whose package imports this module
    from ..builder.soa import TreeNodeSoA

    return PackedLaunch.of_kernel(TRAVERSE_SOURCE, "kd_pack_layout", structs=(TreeNodeSoA,))


def traversal_layout(tree, device_id=None) -> TraversalLayout:
    """The tree's traversal layout on the current device (packed there once, then cached).

    A tree built on this GPU already holds it. Otherwise the tree's arrays
    are copied to the device as they are (no host packing) and packed there.
    ``device_id`` is the current device's, when the caller has it.
    """
    import cupy

    if device_id is None:
        device_id = cupy.cuda.runtime.getDevice()
    key = ("layout", device_id)
    layout = tree._device_cache.get(key)
    if layout is None:
        names = ("node_axis", "node_split", "node_child", "node_count", "leaf_tris", "vertices",
                 "faces")
        # host arrays are uploaded, another GPU's arrays copied (asarray would keep them there)
        arrays = [cupy.array(tree.device_array(name), copy=tree.device != f"cuda:{device_id}")
                  for name in names]
        layout = pack_layout(cupy, *arrays, bounds=tree.bounds)
        tree._device_cache[key] = layout
    return layout


def trace(tree, origins, directions, tmin=0.0, tmax=np.inf, *, any_hit=False, counted=False,
          out=None, status=None) -> HitSoA:
    """Launch the traversal kernel on the current stream.

    Parameters
    ----------
    tree : KdTree
    origins, directions : (num_rays, 3) cupy float32, C-contiguous
    tmin, tmax : float or (num_rays,) cupy float32
        A Python number is a kernel parameter (no array is made).
    any_hit, counted : bool
        The query (closest or any hit) and whether to count nodes and tests.
    out : HitSoA, optional
        Preallocated outputs (the fields the query writes); made otherwise.
    status : (2,) cupy uint64, zeroed, optional
        Receives the bad-ray record; ``None``: bad rays are misses, nothing
        is recorded and nothing is read back.

    Returns
    -------
    HitSoA
        With the fields of the query set.
    """
    import cupy

    num_rays = int(origins.shape[0])
    device_id = cupy.cuda.runtime.getDevice()
    layout = traversal_layout(tree, device_id)
    if out is None:
        out = _outputs(cupy, num_rays, any_hit, counted)
    _TRACE_LAUNCH(_DESCRIPTIONS[any_hit, counted], _trace_function(any_hit, counted, device_id),
                  num_rays, enc.TRAVERSE_BLOCK,
                  _trace_values(layout, origins, directions, tmin, tmax, num_rays, out, status),
                  cupy.cuda.get_current_stream().ptr)
    return out


def _outputs(cupy, num_rays, any_hit, counted) -> HitSoA:
    empty = cupy.empty
    out = HitSoA.of(**{name: empty(num_rays, dtype=dtype) for name, dtype in _QUERY_OUTPUTS[any_hit]})
    if counted:
        out.ray_nodes = empty(num_rays, dtype=cupy.int32)
        out.ray_tests = empty(num_rays, dtype=cupy.int32)
    return out


def _trace_values(layout, origins, directions, tmin, tmax, num_rays, out, status) -> tuple:
    """kd_trace's parameters, flattened as :data:`_TRACE_LAUNCH` packs them."""
    scalar_min = isinstance(tmin, (int, float, np.floating, np.integer))
    scalar_max = isinstance(tmax, (int, float, np.floating, np.integer))
    rays = RaySoA(origins, directions, None if scalar_min else tmin, None if scalar_max else tmax)
    return (*layout.addresses, *layout.fixed,
            tmin if scalar_min else 0.0, tmax if scalar_max else np.inf, num_rays,
            *rays.addresses(), *out.addresses(), 0 if status is None else status.data.ptr)


def query(tree, origins, directions, tmin: float, tmax: float, any_hit: bool, record,
          device_id: int, stream: int) -> tuple:
    """One closest- or any-hit query in the fewest host steps (the API's common case).

    A query is a few microseconds of GPU work for a small batch, so the
    host's work per call is what a caller waiting for each result sees; this
    is :func:`trace` without its generality. The layout's launch has the
    tree's addresses and box packed already (:class:`kdtree_gpu.packed_launch.BoundLaunch`);
    only the output memory is taken before the launch, and the arrays over
    it are made while the kernel runs.

    Parameters
    ----------
    tree : KdTree
    origins, directions : (num_rays, 3) cupy float32, C-contiguous, on the current device
    tmin, tmax : float
    any_hit : bool
    record : BadRayRecord or None
        Counts the bad rays (``None``: they are misses, nothing recorded).
    device_id, stream : int
        The current device and the ``cudaStream_t`` to queue on.

    Returns
    -------
    tuple of cupy arrays
        ``(t, tri, u, v)`` or ``(hit,)``, queued on ``stream``.
    """
    cupy = sys.modules["cupy"]
    num_rays = origins.shape[0]
    layout = tree._device_cache.get(("layout", device_id)) or traversal_layout(tree, device_id)
    outputs = _QUERY_OUTPUTS[any_hit]
    alloc = cupy.cuda.alloc
    memory = [alloc(num_rays * dtype.itemsize) for _, dtype in outputs]
    layout.launch(_DESCRIPTIONS[any_hit, False], _trace_function(any_hit, False, device_id),
                  num_rays, enc.TRAVERSE_BLOCK,
                  (tmin, tmax, num_rays, origins.data.ptr, directions.data.ptr, 0, 0,
                   *[memory[i].ptr if i >= 0 else 0 for i in _HIT_SLOTS[any_hit]],
                   0 if record is None else record.address), stream)
    ndarray = cupy.ndarray
    return tuple(ndarray((num_rays,), dtype, memptr=m) for (_, dtype), m in zip(outputs, memory))


def _trace_function(any_hit, counted, device_id=None) -> int:
    return _traverse_function(_KERNEL_NAMES[any_hit, counted], device_id)


# Every kernel of traverse.cu comes from one module (the same name
# expressions), so that the source is compiled once, not once per lookup style.
def _traverse_function(name, device_id=None) -> int:
    return get_function_pointer(TRAVERSE_SOURCE, name, name_expressions=TRACE_NAME_EXPRESSIONS,
                                device_id=device_id)


def _traverse_kernel(name):
    return get_function(TRAVERSE_SOURCE, name, name_expressions=TRACE_NAME_EXPRESSIONS)


def prepared_launch(tree, origins, directions, tmin=0.0, tmax=np.inf, any_hit=False):
    """The traversal kernel with every argument made in advance: ``launch()`` runs it.

    For timing the kernel alone (benchmarks): each call is one kernel launch
    (``cuLaunchKernel`` with parameters packed in advance) on the current
    stream and nothing else, into the same output arrays. ``tmin`` and
    ``tmax`` are numbers.

    Returns
    -------
    launch : callable
    hits : HitSoA
        The outputs every launch writes.
    """
    import cupy

    num_rays = int(origins.shape[0])
    layout = traversal_layout(tree)
    hits = trace(tree, origins, directions, tmin, tmax, any_hit=any_hit)
    values = _trace_values(layout, origins, directions, tmin, tmax, num_rays, hits, None)
    launch_ = _TRACE_LAUNCH.prepared(_trace_function(any_hit, False), num_rays,
                                     enc.TRAVERSE_BLOCK, values,
                                     cupy.cuda.get_current_stream().ptr)
    return launch_, hits


def intersect_gpu(tree, origins, directions, tmin=0.0, tmax=np.inf, out=None):
    """Closest hit of each ray by kd-tree traversal on the GPU (no ray checks).

    Parameters
    ----------
    tree : KdTree
    origins, directions : (num_rays, 3) cupy float32, C-contiguous
    tmin, tmax : float or (num_rays,) cupy float32
    out : HitSoA, optional
        Preallocated ``hit_t``, ``hit_tri``, ``hit_u``, ``hit_v``.

    Returns
    -------
    t : (num_rays,) cupy float32
        ``inf`` on a miss (also for a bad ray).
    tri : (num_rays,) cupy int32
        Triangle id, ``-1`` on a miss.
    u, v : (num_rays,) cupy float32
        Barycentrics of ``v1`` and ``v2`` (0 on a miss).
    """
    hits = trace(tree, origins, directions, tmin, tmax, out=out)
    return hits.hit_t, hits.hit_tri, hits.hit_u, hits.hit_v


def occluded_gpu(tree, origins, directions, tmin=0.0, tmax=np.inf, out=None):
    """Whether each ray hits any triangle with ``tmin <= t <= tmax`` (no ray checks).

    Returns
    -------
    hit : (num_rays,) cupy bool
    """
    return trace(tree, origins, directions, tmin, tmax, any_hit=True, out=out).hit_any


def intersect_counted_gpu(tree, origins, directions, tmin=0.0, tmax=np.inf):
    """:func:`intersect_gpu` plus per-ray work counts (a separate, slower kernel).

    Returns
    -------
    t, tri, u, v
        As :func:`intersect_gpu`.
    ray_nodes : (num_rays,) cupy int32
        Nodes visited, interior nodes and leaves.
    ray_tests : (num_rays,) cupy int32
        Ray-triangle tests.
    """
    h = trace(tree, origins, directions, tmin, tmax, counted=True)
    return h.hit_t, h.hit_tri, h.hit_u, h.hit_v, h.ray_nodes, h.ray_tests


def occluded_counted_gpu(tree, origins, directions, tmin=0.0, tmax=np.inf):
    """:func:`occluded_gpu` plus per-ray work counts.

    Returns
    -------
    hit : (num_rays,) cupy bool
    ray_nodes, ray_tests : (num_rays,) cupy int32
    """
    h = trace(tree, origins, directions, tmin, tmax, any_hit=True, counted=True)
    return h.hit_any, h.ray_nodes, h.ray_tests


class BadRayRecord:
    """Where a checked query's kernel counts bad rays, and the read of it.

    A device record (zero between queries) that the traversal kernel counts
    into, and a pinned host copy of it, one pair per (device, stream,
    thread). :meth:`read` queues the copy to the host behind the traversal
    on the stream, then waits for the stream: a checked query's one
    synchronization, with nothing allocated and no blocking copy. The kernel
    writes the record only for bad rays, so only then is it zeroed again
    (queued on the stream, ready for the next query there).
    """

    __slots__ = ("device", "host", "stream", "address", "_addresses")
    _records: dict = {}  # (device id, stream pointer, thread id) -> BadRayRecord

    def __init__(self, cupy, stream):
        import cupyx

        self.device = cupy.zeros(2, dtype=np.uint64)
        self.host = cupyx.empty_pinned(2, dtype=np.uint64)
        self.stream = stream
        self.address = self.device.data.ptr  # the kernel's status parameter
        self._addresses = (self.host.ctypes.data, self.address, self.host.nbytes, stream.ptr)

    @classmethod
    def current(cls, cupy, device_id=None, stream=None) -> "BadRayRecord":
        """The record of the current device, stream and thread (made on first use).

        ``device_id`` and ``stream`` (a ``cupy.cuda.Stream``): the current
        ones, when the caller has them.
        """
        if stream is None:
            stream = cupy.cuda.get_current_stream()
        if device_id is None:
            device_id = cupy.cuda.runtime.getDevice()
        key = (device_id, stream.ptr, threading.get_ident())
        record = cls._records.get(key)
        if record is None:
            if len(cls._records) >= 64:  # threads and streams come and go
                cls._records.clear()
            record = cls._records[key] = cls(cupy, stream)
        return record

    def read(self) -> tuple:
        """Wait for the stream and decode the record (zeroed again on the device if written).

        Returns
        -------
        count : int
            Bad rays of the query.
        first : int or None
            Index of the first one.
        kind : int
            Its problem (``encoding.RAY_BAD_*``; 0 when there is none).
        """
        from cupy.cuda import runtime

        host, device, nbytes, stream = self._addresses
        runtime.memcpyAsync(host, device, nbytes, runtime.memcpyDeviceToHost, stream)
        self.stream.synchronize()
        count, first = int(self.host[0]), int(self.host[1])
        if count == 0:
            return 0, None, 0  # the kernel wrote nothing: the record is still zero
        self.reset()
        packed = ~first & 0xFFFFFFFFFFFFFFFF
        return count, packed >> enc.RAY_KIND_BITS, packed & ((1 << enc.RAY_KIND_BITS) - 1)

    def reset(self) -> None:
        """Queue the zeroing of the device record on its stream."""
        from cupy.cuda import runtime

        _, device, nbytes, stream = self._addresses
        runtime.memsetAsync(device, 0, nbytes, stream)


def brute_intersect_gpu(vertices, faces, origins, directions, tmin, tmax):
    """Closest hit of each ray over every triangle (the traversal's GPU oracle).

    Degenerate (zero-area) triangles are left out, as in every tree. On equal
    ``t`` the lowest triangle id wins.

    Parameters
    ----------
    vertices : (num_vertices, 3) array_like of float
    faces : (num_triangles, 3) array_like of int
    origins, directions : (num_rays, 3) cupy float32, C-contiguous
    tmin, tmax : (num_rays,) cupy float32

    Returns
    -------
    t, tri, u, v : (num_rays,) cupy arrays
        As :func:`intersect_gpu`.
    """
    return _brute(vertices, faces, origins, directions, tmin, tmax, any_hit=False)


def brute_occluded_gpu(vertices, faces, origins, directions, tmin, tmax):
    """Any hit over every triangle: ``(num_rays,)`` cupy bool."""
    return _brute(vertices, faces, origins, directions, tmin, tmax, any_hit=True)[0]



# --- helpers -------------------------------------------------------------------
def pack_triangles(vertices, faces, tri_ids) -> np.ndarray:
    """Gather triangles into the 16-byte-aligned layout of the kernels.

    Parameters
    ----------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
    tri_ids : (k,) int32
        Triangles to pack, in the order the kernels will read them (ascending
        ids for the brute force; a tree's triangles in the order of their first
        leaf reference are its traversal layout's ``tris``, which
        :func:`pack_layout` packs on the device).

    Returns
    -------
    (3 * k, 4) float32
        Rows ``3j, 3j+1, 3j+2`` are the vertices of ``tri_ids[j]``; column 3 of
        row ``3j`` holds ``tri_ids[j]`` as int32 bits, the other column-3 slots 0.
    """
    tri_ids = np.ascontiguousarray(tri_ids, dtype=np.int32)
    corners = np.asarray(vertices, dtype=np.float32)[np.asarray(faces)[tri_ids]]  # (k, 3, 3)
    packed = np.zeros((tri_ids.shape[0], 3, 4), dtype=np.float32)
    packed[:, :, :3] = corners
    packed[:, 0, 3] = tri_ids.view(np.float32)
    return packed.reshape(-1, 4)



def _check_rays(origins, directions, tmin, tmax) -> int:
    import cupy

    for name, a in (("origins", origins), ("directions", directions)):
        if not isinstance(a, cupy.ndarray) or a.dtype != cupy.float32 or a.ndim != 2 \
                or a.shape[1] != 3 or not a.flags.c_contiguous:
            raise ValueError(f"{name} must be a C-contiguous (num_rays, 3) cupy float32 array, got "
                             f"{type(a).__name__} {getattr(a, 'dtype', '')} "
                             f"{getattr(a, 'shape', '')}")
    num_rays = origins.shape[0]
    if directions.shape[0] != num_rays:
        raise ValueError(f"origins has {num_rays} rays but directions has {directions.shape[0]}")
    for name, a in (("tmin", tmin), ("tmax", tmax)):
        if not isinstance(a, cupy.ndarray) or a.dtype != cupy.float32 or a.shape != (num_rays,) \
                or not a.flags.c_contiguous:
            raise ValueError(f"{name} must be a contiguous ({num_rays},) cupy float32 array, got "
                             f"{type(a).__name__} {getattr(a, 'dtype', '')} "
                             f"{getattr(a, 'shape', '')}")
    if num_rays > np.iinfo(np.int32).max:
        raise ValueError(f"too many rays for one launch: {num_rays}")
    return num_rays


def _brute(vertices, faces, origins, directions, tmin, tmax, any_hit):
    import cupy

    num_rays = _check_rays(origins, directions, tmin, tmax)
    V, F = validate_mesh(vertices, faces)
    tri_ids = np.flatnonzero(~degenerate_mask(V, F)).astype(np.int32)
    corners = V[F[tri_ids]].reshape(-1, 3)
    bounds = np.stack([corners.min(0), corners.max(0)]) if len(corners) else np.zeros((2, 3))
    scale = np.float32(trace_scale(bounds))
    tris = cupy.asarray(pack_triangles(V * scale, F, tri_ids))
    layout = TraversalLayout(nodes=None, refs=None, tris=tris, bounds=bounds, scale=float(scale),
                             device_id=cupy.cuda.runtime.getDevice())
    if any_hit:
        hits = HitSoA.of(hit_any=cupy.empty(num_rays, dtype=cupy.bool_))
    else:
        hits = HitSoA.of(hit_t=cupy.empty(num_rays, dtype=cupy.float32),
                         hit_tri=cupy.empty(num_rays, dtype=cupy.int32),
                         hit_u=cupy.empty(num_rays, dtype=cupy.float32),
                         hit_v=cupy.empty(num_rays, dtype=cupy.float32))
    names = ("kd_brute<false>", "kd_brute<true>")
    kernel = get_function(BRUTE_SOURCE, names[any_hit], name_expressions=names)
    launch("brute-force " + ("any hit" if any_hit else "closest hit"), kernel, num_rays,
           (tris, np.int32(tri_ids.shape[0]), layout.params(num_rays),
            RaySoA(origins, directions, tmin, tmax).struct(), hits.struct()),
           block=enc.BRUTE_BLOCK)
    return (hits.hit_any,) if any_hit else (hits.hit_t, hits.hit_tri, hits.hit_u, hits.hit_v)
