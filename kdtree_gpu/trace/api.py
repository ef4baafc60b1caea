"""Public ray queries: closest hit and any hit, on the CPU or the GPU.

:meth:`KdTree.intersect` and :meth:`KdTree.occluded` call :func:`intersect`
and :func:`occluded`. This module decides where rays run and converts
arrays at the boundary; the work is done by :mod:`kdtree_gpu.trace.cpu`
(numba) or :mod:`kdtree_gpu.trace.gpu` (CUDA).

Where rays run (``device``)
---------------------------
``"auto"``: NumPy (and other host) arrays on the CPU; CuPy arrays, CUDA
PyTorch tensors and other GPU arrays (``__cuda_array_interface__``, DLPack)
on their GPU. ``"cpu"``: always the CPU. ``"gpu"``, ``"cuda"``,
``"cuda:N"``: always that GPU (host input is uploaded).

Results come back in the library of ``origins`` (NumPy, CuPy, or PyTorch on
the same device; other GPU arrays get CuPy arrays, zero-copy views of the
same memory where the library allows). A single ray may be given as ``(3,)``
arrays; the results then have shape ``(1,)``.

On the GPU the work is queued on the caller's stream (CuPy's current
stream, or the current stream of the PyTorch tensors' device) and the rays
are checked inside the traversal kernel: with ``check=True`` one small read
after the launch raises ``ValueError`` naming the first bad ray; with
``check=False`` nothing waits for the GPU and a bad ray is a miss. The CPU
traversal checks the rays as it loads them too (no pass of its own, no
copy): ``check=True`` raises the same error after it, ``check=False`` leaves
bad rays as misses.

Ray conventions (hits with ``tmin <= t <= tmax``, two-sided triangles,
barycentrics ``u`` of ``v1`` and ``v`` of ``v2``) are described in
:mod:`kdtree_gpu.trace.watertight`.
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np

from .. import encoding as enc
from ..arrays import device_of, is_device_array, library, like, on_gpu, to_cupy, to_numpy
from ..device import CPU, Device, parse_device, resolve_device
from .gpu import BadRayRecord, query, trace

_PROBLEMS = {
    enc.RAY_BAD_ORIGIN: "a NaN or infinite value in its origin",
    enc.RAY_BAD_DIRECTION: "a NaN or infinite value in its direction",
    enc.RAY_ZERO_DIRECTION: "a zero-length direction",
    enc.RAY_NAN_TMIN: "a NaN tmin",
    enc.RAY_NAN_TMAX: "a NaN tmax",
    enc.RAY_EMPTY_INTERVAL: "tmin > tmax",
}


# --- where rays run -----------------------------------------------------------------
def _choose_device(device, origins, directions):
    if device == "auto" and is_device_array(origins):
        return Device("cuda", origins.device.id)  # the common case, without a parse
    kind, _ = parse_device(device)
    if kind == "auto":
        for a in (origins, directions):
            if on_gpu(a):
                return device_of(a)
        return CPU
    return resolve_device(device)


def _stream_of(template):
    """The stream to queue work on: a PyTorch tensor's current stream, else CuPy's."""
    if library(template) == "torch" and template.is_cuda:
        import cupy
        import torch

        stream = torch.cuda.current_stream(template.device)
        if hasattr(stream, "__cuda_stream__") and hasattr(cupy.cuda.Stream, "from_external"):
            # the CUDA stream protocol (CuPy 14 deprecates ExternalStream for it)
            return cupy.cuda.Stream.from_external(stream)
        return cupy.cuda.ExternalStream(stream.cuda_stream, template.device.index)
    return contextlib.nullcontext()


# --- validation -----------------------------------------------------------------
def _ray_arrays(xp, origins, directions):
    """Origins and directions as C-contiguous float32 ``(num_rays, 3)`` arrays of ``xp``.

    Only shapes and dtypes are checked here (array metadata: no device read).
    """
    if xp is not np and all(isinstance(a, xp.ndarray) and a.dtype == xp.float32 and a.ndim == 2
                            and a.shape[1] == 3 and a.flags.c_contiguous
                            for a in (origins, directions)):
        if origins.shape[0] != directions.shape[0]:
            raise ValueError(f"origins has {origins.shape[0]} rays but directions has "
                             f"{directions.shape[0]}")
        return origins, directions  # already what the kernel reads: no work at all
    convert = to_numpy if xp is np else to_cupy
    arrays = []
    for name, a in (("origins", origins), ("directions", directions)):
        a = convert(a)
        if a.dtype.kind not in "fiu":
            raise ValueError(f"{name} must be a float array, got dtype {a.dtype}")
        if a.ndim == 1:
            a = a.reshape(1, -1)
        if a.ndim != 2 or a.shape[1] != 3:
            raise ValueError(f"{name} must have shape (num_rays, 3) or (3,), got {a.shape}")
        arrays.append(xp.ascontiguousarray(a, dtype=xp.float32))
    O, D = arrays
    if O.shape[0] != D.shape[0]:
        raise ValueError(f"origins has {O.shape[0]} rays but directions has {D.shape[0]}")
    return O, D


def _interval(xp, value, name, num_rays):
    """A scalar bound stays a Python float; an array becomes a float32 ``(num_rays,)`` array."""
    if _scalar(value):
        return float(value)
    a = to_numpy(value) if xp is np else to_cupy(value)
    if a.ndim == 0:
        return float(a)
    if a.shape != (num_rays,):
        raise ValueError(f"{name} must be a scalar or have shape ({num_rays},), got {a.shape}")
    return xp.ascontiguousarray(a, dtype=xp.float32)


def ray_problems(origins, directions, tmin, tmax):
    """The problem of every ray (``encoding.RAY_BAD_*``, 0 for a good ray), on the host.

    The NumPy twin of the checks the GPU traversal kernel makes while it
    loads each ray (``kd_ray_problem`` in ``cuda/traverse.cu``).

    Returns
    -------
    (num_rays,) int8
    """
    n = origins.shape[0]
    t0 = np.broadcast_to(np.asarray(tmin, np.float32), (n,))
    t1 = np.broadcast_to(np.asarray(tmax, np.float32), (n,))
    problem = np.zeros(n, dtype=np.int8)
    # later checks first, so that the earliest failing check of a ray wins
    problem[t0 > t1] = enc.RAY_EMPTY_INTERVAL
    problem[np.isnan(t1)] = enc.RAY_NAN_TMAX
    problem[np.isnan(t0)] = enc.RAY_NAN_TMIN
    problem[~(directions != 0).any(axis=1)] = enc.RAY_ZERO_DIRECTION
    problem[~np.isfinite(directions).all(axis=1)] = enc.RAY_BAD_DIRECTION
    problem[~np.isfinite(origins).all(axis=1)] = enc.RAY_BAD_ORIGIN
    return problem


def bad_ray_message(index, kind, count, origins, directions, tmin, tmax) -> str:
    """The error naming the first bad ray (host arrays or CuPy arrays: a few reads)."""
    what = _PROBLEMS[kind]
    if kind in (enc.RAY_BAD_ORIGIN, enc.RAY_BAD_DIRECTION):
        values = (origins if kind == enc.RAY_BAD_ORIGIN else directions)[index]
        what += f": {to_numpy(values).tolist()}"
    elif kind == enc.RAY_EMPTY_INTERVAL:
        lo = tmin if isinstance(tmin, float) else float(tmin[index])
        hi = tmax if isinstance(tmax, float) else float(tmax[index])
        what += f" ({lo!r} > {hi!r})"
    return f"ray {index} has {what} ({count} bad {'ray' if count == 1 else 'rays'})"


def check_rays(origins, directions, tmin=0.0, tmax=np.inf):
    """Check rays on the host and return them as contiguous float32 NumPy arrays.

    Parameters
    ----------
    origins, directions : (num_rays, 3) or (3,) array_like of float
    tmin, tmax : float or (num_rays,) array_like of float

    Returns
    -------
    origins, directions : (num_rays, 3) float32
    tmin, tmax : (num_rays,) float32

    Raises
    ------
    ValueError
        Wrong shapes, or a bad ray (NaN or infinite origin or direction,
        zero direction, NaN tmin or tmax, ``tmin > tmax``): the message names
        the first one and counts them.
    """
    O, D = _ray_arrays(np, origins, directions)
    n = O.shape[0]
    t0, t1 = (_interval(np, v, name, n) for v, name in ((tmin, "tmin"), (tmax, "tmax")))
    problem = ray_problems(O, D, t0, t1)
    bad = np.flatnonzero(problem)
    if bad.size:
        i = int(bad[0])
        raise ValueError(bad_ray_message(i, int(problem[i]), int(bad.size), O, D, t0, t1))
    return (O, D, np.full(n, t0, np.float32) if isinstance(t0, float) else t0,
            np.full(n, t1, np.float32) if isinstance(t1, float) else t1)


# --- queries -----------------------------------------------------------------------
def _run(tree, origins, directions, tmin, tmax, device, any_hit, out, check):
    cupy = sys.modules.get("cupy")
    if (device == "auto" and out is None and cupy is not None and type(origins) is cupy.ndarray
            and origins.data.device_id == (device_id := cupy.cuda.runtime.getDevice())
            and _scalar(tmin) and _scalar(tmax) and _kernel_rays(cupy, origins, directions)):
        # the common GPU case in the fewest steps: CuPy float32 rays on the
        # current device, number bounds, results as they come (no device
        # switch, CuPy's current stream); anything else takes the path below
        t0, t1 = float(tmin), float(tmax)
        stream = cupy.cuda.get_current_stream()
        return _checked(cupy, check, lambda record: query(
            tree, origins, directions, t0, t1, any_hit, record, device_id, stream.ptr),
            origins, directions, t0, t1, device_id, stream)
    dev = _choose_device(device, origins, directions)
    if not dev.is_cuda:
        results = _run_cpu(tree, origins, directions, tmin, tmax, any_hit, check)
    else:
        import cupy

        current = cupy.cuda.runtime.getDevice() == dev.index
        direct = (_kernel_out(cupy, out, any_hit, origins)
                  if current and out is not None else None)
        with (contextlib.nullcontext() if current else dev.use()), _stream_of(origins):
            results = _run_gpu(tree, origins, directions, tmin, tmax, any_hit, check, direct)
        if direct is not None:
            return _out_tuple(out, any_hit)
        if out is None and is_device_array(origins) and current:
            return results  # CuPy in, CuPy out, on the current device: nothing to convert
    if out is not None:
        return _write_out(results, out, any_hit)
    return tuple(like(r, origins) for r in results)


RAY_COMPILE_MESSAGE = "kdtree-gpu: compiling CPU ray kernels, once per machine (about 30 s)..."


def warm_up_cpu():
    """Compile (or load from numba's cache) the CPU ray kernels, once per process.

    The first query on the CPU calls it; on a machine where numba compiles,
    :data:`RAY_COMPILE_MESSAGE` goes to stderr first (call it yourself to keep
    compilation out of a measurement).

    Returns
    -------
    kdtree_gpu.warmup.WarmUp
        ``(seconds, compiled)``.
    """
    from ..warmup import compile_once

    return compile_once(_trace_small, name="rays", package=__name__.split(".")[0],
                        message=RAY_COMPILE_MESSAGE)


def _trace_small():
    # the queries' own calls, with the argument types of real ones: scalar and
    # per-ray bounds, closest and any hit, the traversal and the brute force.
    # The traversal gets the layout of a tree that is one leaf holding every
    # triangle: the kernels' types are those of any tree, and no builder runs.
    from .. import encoding as enc
    from ..tree.check import warm_up_walk
    from .brute import brute_cpu
    from .cpu import run_layout
    from .layout import CpuLayout

    rng = np.random.default_rng(0)
    V = rng.random((60, 3)).astype(np.float32)
    F = np.arange(60).reshape(20, 3)
    layout = CpuLayout(np.array([enc.AXIS_LEAF], enc.NODE_AXIS_DTYPE),
                       np.zeros(1, enc.NODE_SPLIT_DTYPE), np.zeros(1, enc.NODE_CHILD_DTYPE),
                       np.array([20], enc.NODE_COUNT_DTYPE), np.arange(20, dtype=np.int32),
                       np.stack([V.min(axis=0), V.max(axis=0)]), V, F, depth=0)
    O, D = _ray_arrays(np, rng.random((16, 3)), rng.normal(size=(16, 3)))
    for tmin, tmax in ((0.0, np.inf), (np.zeros(16, np.float32), np.full(16, 9.0, np.float32))):
        t0, t1 = _interval(np, tmin, "tmin", 16), _interval(np, tmax, "tmax", 16)
        for any_hit in (False, True):
            # as given (coherent or few rays) and in the order incoherent ones take
            for sort in (False, True):
                run_layout(layout, O, D, t0, t1, any_hit, status=np.empty(2, np.int64),
                           force_order=sort)
    O, D, t0, t1 = check_rays(O, D)
    for any_hit in (False, True):
        brute_cpu(V, F, O, D, t0, t1, any_hit=any_hit)
    warm_up_walk()  # the first query walks the tree for its depth


def _run_cpu(tree, origins, directions, tmin, tmax, any_hit, check):
    from .cpu import intersect_cpu, occluded_cpu

    warm_up_cpu()
    O, D = _ray_arrays(np, origins, directions)
    n = O.shape[0]
    t0, t1 = (_interval(np, v, name, n) for v, name in ((tmin, "tmin"), (tmax, "tmax")))
    # the rays are checked inside the traversal, bad ones are misses
    status = np.empty(2, np.int64)
    results = (occluded_cpu if any_hit else intersect_cpu)(tree, O, D, t0, t1, status=status)
    count, first = int(status[0]), int(status[1])
    if count and check:
        index, kind = first >> enc.RAY_KIND_BITS, first & ((1 << enc.RAY_KIND_BITS) - 1)
        raise ValueError(bad_ray_message(index, kind, count, O, D, t0, t1))
    return (results,) if any_hit else results


def _out_tuple(out, any_hit):
    """``out`` as a tuple of arrays (an any-hit query takes one array or a tuple of one)."""
    return (out,) if any_hit and not isinstance(out, (tuple, list)) else tuple(out)


def _kernel_out(cupy, out, any_hit, origins):
    """``out`` as the kernel's outputs (a HitSoA) when it can write them in place.

    That is: CuPy arrays of the query's dtypes, one per ray, C-contiguous, on
    the current device. Anything else (other libraries, shapes to report)
    returns ``None`` and goes through :func:`_write_out`.
    """
    from .soa import HitSoA

    if out is None or not is_device_array(origins):
        return None
    arrays = _out_tuple(out, any_hit)
    dtypes = (np.bool_,) if any_hit else (np.float32, np.int32, np.float32, np.float32)
    n = origins.shape[0] if origins.ndim == 2 else 1
    device = cupy.cuda.runtime.getDevice()
    if len(arrays) != len(dtypes) or not all(
            isinstance(a, cupy.ndarray) and a.dtype == dt and a.shape == (n,)
            and a.flags.c_contiguous and a.device.id == device
            for a, dt in zip(arrays, dtypes)):
        return None
    if any_hit:
        return HitSoA.of(hit_any=arrays[0])
    return HitSoA.of(hit_t=arrays[0], hit_tri=arrays[1], hit_u=arrays[2], hit_v=arrays[3])


def _run_gpu(tree, origins, directions, tmin, tmax, any_hit, check, out=None):
    import cupy

    O, D = _ray_arrays(cupy, origins, directions)
    n = O.shape[0]
    if n > _MAX_RAYS:
        raise ValueError(f"too many rays for one launch: {n}")
    t0, t1 = (_interval(cupy, v, name, n) for v, name in ((tmin, "tmin"), (tmax, "tmax")))
    hits = _checked(cupy, check, lambda record: trace(
        tree, O, D, t0, t1, any_hit=any_hit, out=out,
        status=None if record is None else record.device), O, D, t0, t1)
    if any_hit:
        return (hits.hit_any,)
    return hits.hit_t, hits.hit_tri, hits.hit_u, hits.hit_v


_MAX_RAYS = np.iinfo(np.int32).max  # rays of one launch


def _scalar(value) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)


_FLOAT32 = np.dtype(np.float32)


def _kernel_rays(cupy, origins, directions) -> bool:
    """Whether the arrays are what the kernel reads as they are (no conversion, no check).

    Tests that cost nanoseconds, not microseconds (this runs at every query):
    dtype identity (NumPy's builtin dtypes are singletons; any other float32
    dtype takes the general path, which is as correct) and CuPy's own
    contiguity flag rather than a ``flags`` object made per call.
    """
    shape = origins.shape
    return (type(directions) is cupy.ndarray and origins.dtype is _FLOAT32
            and directions.dtype is _FLOAT32 and len(shape) == 2 and shape[1] == 3
            and directions.shape == shape and shape[0] <= _MAX_RAYS
            and getattr(origins, "_c_contiguous", False)
            and getattr(directions, "_c_contiguous", False)
            and directions.data.device_id == origins.data.device_id)


def _checked(cupy, check, launch, origins, directions, tmin, tmax, device_id=None, stream=None):
    """``launch(record)``'s results, after reading the bad-ray record when ``check``.

    With ``check`` the launch counts bad rays into this stream's record and
    the read after it is the query's one synchronization; a bad ray raises
    ``ValueError`` naming the first. Without, ``launch(None)``: nothing waits.
    ``device_id`` and ``stream``: the current ones, when the caller has them.
    """
    if not check:
        return launch(None)
    record = BadRayRecord.current(cupy, device_id, stream)
    try:
        results = launch(record)
        count, first, kind = record.read()
        record = None
    finally:
        if record is not None:  # interrupted before the read: zero for the next query
            record.reset()
    if count:
        raise ValueError(bad_ray_message(first, kind, count, origins, directions, tmin, tmax))
    return results


def _write_out(results, out, any_hit):
    """Copy results into the caller's arrays (the same library and device as ``out``)."""
    out = _out_tuple(out, any_hit)
    if len(out) != len(results):
        raise ValueError(f"out must hold {len(results)} arrays, got {len(out)}")
    for name, dst, src in zip(("t", "tri", "u", "v") if not any_hit else ("hit",), out, results):
        if tuple(dst.shape) != tuple(src.shape):
            raise ValueError(f"out array {name} has shape {tuple(dst.shape)}, "
                             f"expected {tuple(src.shape)}")
        kind = library(dst)
        if kind == "numpy":
            np.copyto(dst, to_numpy(src), casting="same_kind")
        elif kind == "torch":
            dst.copy_(like(src, dst))
        else:
            to_cupy(dst)[...] = to_cupy(src)
    return out


def intersect(tree, origins, directions, tmin=0.0, tmax=np.inf, *, out=None, check=True,
              device="auto"):
    """Closest hit of each ray against a kd-tree.

    Parameters
    ----------
    tree : KdTree
    origins, directions : (num_rays, 3) or (3,) array_like of float
        NumPy, CuPy, PyTorch or another GPU array; directions need not be
        unit length.
    tmin, tmax : float or (num_rays,) array_like
        Hits with ``tmin <= t <= tmax`` count. A number is passed to the
        kernel as it is (no array is made).
    out : tuple of 4 arrays, optional
        Preallocated ``(t, tri, u, v)`` to write into (the path tracer uses
        it); returned. CuPy arrays of the result dtypes on the rays' device
        are written by the kernel itself (so after a ``ValueError`` for bad
        rays they hold the results, bad rays as misses); others get a copy.
    check : bool
        Raise ``ValueError`` naming the first bad ray (one small read after
        the launch on the GPU); ``False``: bad rays are misses and nothing
        waits for the GPU.
    device : str
        See the module docstring.

    Returns
    -------
    t : (num_rays,) float32
        ``inf`` on a miss.
    tri : (num_rays,) int32
        Triangle id, ``-1`` on a miss.
    u, v : (num_rays,) float32
        Barycentrics of ``v1`` and ``v2``: point = (1-u-v) v0 + u v1 + v v2.

    Raises
    ------
    ValueError
        Bad rays (with ``check=True``), wrong shapes, or an unknown ``device``.
    RuntimeError
        A GPU device without a usable GPU.
    """
    return _run(tree, origins, directions, tmin, tmax, device, False, out, check)


def occluded(tree, origins, directions, tmin=0.0, tmax=np.inf, *, out=None, check=True,
             device="auto"):
    """Whether each ray hits any triangle with ``tmin <= t <= tmax``.

    Parameters and errors as :func:`intersect`; ``out`` is one bool array.

    Returns
    -------
    (num_rays,) bool
    """
    return _run(tree, origins, directions, tmin, tmax, device, True, out, check)[0]


# --- the brute-force oracle ---------------------------------------------------------
def _mesh_of(tree_or_vertices, faces):
    from ..mesh import validate_mesh

    if faces is None:
        return tree_or_vertices.vertices, tree_or_vertices.faces
    return validate_mesh(tree_or_vertices, faces)


def _run_brute(tree_or_vertices, faces, origins, directions, tmin, tmax, device, any_hit):
    V, F = _mesh_of(tree_or_vertices, faces)
    dev = _choose_device(device, origins, directions)
    O, D, t0, t1 = check_rays(origins, directions, tmin, tmax)
    if not dev.is_cuda:
        from .brute import brute_cpu

        warm_up_cpu()
        results = brute_cpu(V, F, O, D, t0, t1, any_hit=any_hit)
        results = (results[1] >= 0,) if any_hit else results
    else:
        import cupy

        from .gpu import brute_intersect_gpu, brute_occluded_gpu

        with dev.use():
            args = tuple(cupy.asarray(a) for a in (O, D, t0, t1))
            results = (brute_occluded_gpu(V, F, *args),) if any_hit else \
                brute_intersect_gpu(V, F, *args)
    return tuple(like(r, origins) for r in results)


def intersect_brute(tree_or_vertices, faces_or_origins, *args, tmin=0.0, tmax=np.inf,
                    device="auto"):
    """Closest hit of each ray over every non-degenerate triangle (the oracle).

    Call as ``intersect_brute(tree, origins, directions)`` or
    ``intersect_brute(vertices, faces, origins, directions)``.

    Parameters
    ----------
    tree_or_vertices : KdTree or (num_vertices, 3) array_like of float
    faces_or_origins : (num_triangles, 3) int array (with vertices) or the origins
    *args : the remaining ``origins`` and/or ``directions``
    tmin, tmax, device
        As :func:`intersect`.

    Returns
    -------
    t, tri, u, v
        As :func:`intersect`; on equal ``t`` the lowest triangle id wins.
    """
    vertices, faces, origins, directions = _brute_args(tree_or_vertices, faces_or_origins, args)
    return _run_brute(vertices, faces, origins, directions, tmin, tmax, device, any_hit=False)


def occluded_brute(tree_or_vertices, faces_or_origins, *args, tmin=0.0, tmax=np.inf,
                   device="auto"):
    """Any hit of each ray over every non-degenerate triangle; see :func:`intersect_brute`.

    Returns
    -------
    (num_rays,) bool
    """
    vertices, faces, origins, directions = _brute_args(tree_or_vertices, faces_or_origins, args)
    return _run_brute(vertices, faces, origins, directions, tmin, tmax, device, any_hit=True)[0]


def _brute_args(first, second, rest):
    if hasattr(first, "leaf_tris"):
        if len(rest) != 1:
            raise TypeError("use intersect_brute(tree, origins, directions)")
        return first, None, second, rest[0]
    if len(rest) != 2:
        raise TypeError("use intersect_brute(vertices, faces, origins, directions)")
    return first, second, rest[0], rest[1]
