"""The root level on the device: mesh preparation (R1) and the sorted root events (R3).

The GPU twin of :func:`kdtree_gpu.mesh.prepare_mesh` and
:func:`kdtree_gpu.builder.stages.create_root_events`, with one device-to-host
read (the summary record that sizes everything after it).
"""

from __future__ import annotations

import contextlib

import numpy as np

from ... import encoding as enc
from ...kernels import get_function
from ...launch import launch, stage
from ...mesh import MeshError, check_trace_range, smallest_triangle, validate_mesh
from ...primitives import inclusive_scan_in_place, ordered_uint_to_float
from ..soa import EventSoA, NodeSoA, RefSoA
from .order import morton_order_cuda
from .workspace import arrays_in_one_block, carved, lasting

_SOURCE = "build.cu"
_init_cache: dict = {}


def _summary_init(cp):
    # Flags and counts start at 0, the box minimum at the largest key and the
    # maximum at the smallest (order-preserving bits): a cached device copy.
    device = cp.cuda.Device().id
    init = _init_cache.get(device)
    if init is None:
        host = np.zeros(enc.SUMMARY_SLOTS, dtype=np.uint64)
        host[enc.SUMMARY_LO:enc.SUMMARY_HI] = 0xFFFFFFFF
        with lasting():  # kept across builds: not from a build's workspace
            init = _init_cache[device] = cp.asarray(host)
    return init


def coerce_mesh_cuda(cp, vertices, faces):
    """:func:`kdtree_gpu.mesh.coerce_mesh` for arrays that live on the GPU, on the GPU.

    Shapes and dtypes are read from the arrays' metadata; values stay on the
    device (the range of non-int32 indices is checked there, one small read,
    since converting an out-of-range int64 index to int32 would hide it).

    Parameters
    ----------
    vertices : (num_vertices, 3) GPU array of float
    faces : (num_triangles, 3) GPU array of int
        CuPy arrays, CUDA tensors, or anything with ``__cuda_array_interface__``
        or DLPack (zero-copy views where the library allows).

    Returns
    -------
    vertices : (num_vertices, 3) cupy float32
        With -0.0 folded into +0.0.
    faces : (num_triangles, 3) cupy int32
    """
    from ...arrays import to_cupy, to_numpy
    from ...mesh import _check_shapes

    V = to_cupy(vertices)
    F = to_cupy(faces)
    _check_shapes(V, F)
    if F.dtype != np.int32:
        # one read: a wider index out of int32 range would wrap when converted
        lo, hi = (int(x) for x in cp.stack([F.min(), F.max()]).astype(np.int64).get())
        if lo < 0 or hi >= V.shape[0]:
            validate_mesh(to_numpy(V), to_numpy(F))  # raises, naming the first bad face
        F = F.astype(np.int32)
    V32 = cp.ascontiguousarray(V, dtype=np.float32) + np.float32(0.0)
    return V32, cp.ascontiguousarray(F, dtype=np.int32)


def prepare_mesh_cuda(cp, V, F, records: int = 0, morton: bool = False):
    """Rule R1 on the device: triangle boxes, degenerate test, the root level.

    Parameters
    ----------
    V : (num_vertices, 3) float32, F : (num_triangles, 3) int32
        Host arrays from :func:`kdtree_gpu.mesh.coerce_mesh`, or CuPy arrays
        from :func:`coerce_mesh_cuda`.
    records : int
        Rows of deferral records (``encoding.SMALL_RECORD`` int32 each) to
        cut from the boxes' block: they live as long (until the subtree
        stage is done), and one device allocation fewer is about 0.1 ms of
        a small build's host time (H100).
    morton : bool
        Number the triangles in Morton order (:mod:`.order`): ``tri_lo``,
        ``tri_hi`` and the references are in that order, ``order`` maps it
        to the given one.

    Returns
    -------
    V_d, F_d : the mesh on the device
    tri_lo, tri_hi : (num_triangles, 3) float32 (device)
    refs : RefSoA
        The root's references: the non-degenerate triangles, ascending.
    nodes : NodeSoA
        The root node (box and offsets; events per axis from ``planar``).
    bounds : (2, 3) float32 (host)
    planar : (3,) int (host)
        Valid triangles that are flat on each axis (one event instead of two).
    num_degenerate : int
    deferred : (records, SMALL_RECORD) int32 (device), or None without records
    order : (num_triangles,) int32 (device), or None without ``morton``
        The given index of each triangle of the build's order.

    Raises
    ------
    MeshError
        Out-of-range indices or non-finite coordinates (named by
        :func:`kdtree_gpu.mesh.validate_mesh`), no valid triangle, or a mesh
        float32 ray tracing cannot serve (:func:`kdtree_gpu.mesh.check_trace_range`
        with the box and the smallest triangle reduced on the device).
    """
    from ...arrays import to_numpy

    m = int(F.shape[0])
    V_d = cp.asarray(V)
    F_d = cp.asarray(F)
    # Two device blocks, not seven arrays (inside the build's workspace every
    # allocation is the device's, and given back): the boxes, which last until
    # the subtrees are built, and the root level with its scan and summary,
    # which the first level consumes.
    boxes = [((m, 3), np.float32)] * 2
    if records:
        boxes.append(((int(records), enc.SMALL_RECORD), np.int32))
    tri_lo, tri_hi, *deferred = arrays_in_one_block(cp, boxes)
    # (in Morton order the given order's boxes are a temporary: permuted into tri_lo, tri_hi)
    given_lo, given_hi = arrays_in_one_block(cp, boxes[:2]) if morton else (tri_lo, tri_hi)
    node_shapes = list(NodeSoA.shapes(1).values())
    valid, summary, ref_tri, ref_node, *node_arrays = arrays_in_one_block(
        cp, [((m,), np.int64), ((enc.SUMMARY_SLOTS,), np.uint64), ((m,), np.int32),
             ((m,), np.int32), *node_shapes])
    summary[...] = _summary_init(cp)
    launch("prepare_mesh", get_function(_SOURCE, "kd_prepare_triangles"), m,
           (V_d, F_d, np.int64(V.shape[0]), np.int64(m), given_lo, given_hi, valid, summary),
           block=enc.PREPARE_BLOCK)
    # One deliberate read: problems, root box and event counts size everything after.
    host = summary.get()
    if host[enc.SUMMARY_FLAGS] != 0:
        validate_mesh(to_numpy(V), to_numpy(F))  # names the first bad vertex or face
        raise MeshError("invalid mesh (non-finite coordinates or out-of-range indices)")
    num_valid = int(host[enc.SUMMARY_VALID])
    if num_valid == 0:
        raise MeshError(f"all {m} triangles are degenerate (zero area); nothing to build")
    box_bits = np.concatenate([host[enc.SUMMARY_LO:enc.SUMMARY_LO + 3],
                               host[enc.SUMMARY_HI:enc.SUMMARY_HI + 3]]).astype(np.uint32)
    bounds = ordered_uint_to_float(box_bits).reshape(2, 3).copy()
    smallest = float(ordered_uint_to_float(host[enc.SUMMARY_MIN_SIZE:enc.SUMMARY_MIN_SIZE + 1]
                                           .astype(np.uint32))[0])
    try:
        check_trace_range(bounds, smallest)
    except MeshError:
        # name the triangle: the host recomputes the sizes (error path only)
        size, index = smallest_triangle(given_lo.get(), given_hi.get(),
                                        valid.get().astype(bool))
        check_trace_range(bounds, size, index)
        raise
    planar = host[enc.SUMMARY_PLANAR:enc.SUMMARY_LO].astype(np.int64)
    order = None
    if morton:
        order = morton_order_cuda(cp, given_lo, given_hi, valid, summary, tri_lo, tri_hi)
    del given_lo, given_hi
    # The root level: references numbered by a scan of the valid flags (in place).
    valid_scan = inclusive_scan_in_place(valid, description="prepare_mesh: number references")
    refs = RefSoA(ref_tri[:num_valid], ref_node[:num_valid])
    nodes = NodeSoA(*node_arrays)
    launch("prepare_mesh: root level", get_function(_SOURCE, "kd_root_level"), m,
           (valid_scan, np.int64(m), summary, *refs.args(), *nodes.args()))
    return (V_d, F_d, tri_lo, tri_hi, refs, nodes, bounds, planar, m - num_valid,
            deferred[0] if deferred else None, order)


def root_event_count(num_refs: int, planar) -> int:
    """Events of the root level: two per reference and axis, one where it is flat."""
    return sum(2 * int(num_refs) - int(p) for p in planar)


def create_root_events_cuda(cp, tri_lo, tri_hi, ref_tri, planar, out=None,
                            scratch=None, segments=True) -> EventSoA:
    """Rule R3 on the device: one key per event, one radix sort, decode.

    Parameters
    ----------
    tri_lo, tri_hi : (num_triangles, 3) float32 (device)
    ref_tri : (num_refs,) int32 (device)
    planar : (3,) int (host)
        From :func:`prepare_mesh_cuda`.
    out : EventSoA, optional
        Where to decode the events (:func:`root_event_count` rows; the level
        loop's buffers); by default new arrays.
    scratch : (MemoryPointer, int), optional
        Device memory not in use that the keys and the sort may take
        (:func:`.workspace.carved`; what does not fit is allocated as usual).
    segments : bool
        Store each event's segment in new arrays (perfect splits, and a
        root the per-stage path runs: ``level_stages.staged_segments``; else
        ``event_seg`` is ``None``).

    Returns
    -------
    EventSoA
        Sorted by (axis, position, kind, reference); segment = axis.
    """
    num_refs = int(ref_tri.shape[0])
    with carved(cp, *scratch) if scratch is not None else contextlib.nullcontext():
        keys = cp.empty(3 * 2 * num_refs, dtype=np.uint64)
        launch("create_root_events: keys", get_function(_SOURCE, "kd_root_event_keys"), num_refs,
               (tri_lo, tri_hi, ref_tri, np.int64(num_refs), keys))
        with stage(xp=cp, description="create_root_events: sort"):
            # Keys are unique and start with the axis, so one sort gives rule R3's
            # order on every axis; planar triangles' unused slots hold the largest
            # key and sort after all real events. In place: cupy.sort would copy
            # the keys first, a third buffer of 8 bytes per event beside the
            # keys and the sort's own (measured 48 bytes per triangle of the
            # build's peak on the bunny).
            keys.sort()
    total = root_event_count(num_refs, planar)
    events = EventSoA.allocate_level(cp, total, segments) if out is None else out
    launch("create_root_events: decode", get_function(_SOURCE, "kd_root_events_decode"), total,
           (keys, np.int64(total), events.struct()))
    return events
