"""Public ray queries: closest hit and any hit, on the CPU or the GPU.

:meth:`KdTree.intersect` and :meth:`KdTree.occluded` call :func:`intersect`
and :func:`occluded`. This module checks the rays, decides where they run and
converts arrays at the boundary; the work is done by
:mod:`kdtree_gpu.trace.cpu` (numba) or :mod:`kdtree_gpu.trace.gpu` (CuPy).

Where rays run (``device``)
---------------------------
``"auto"``: NumPy (and other host) arrays on the CPU; CuPy arrays and CUDA
PyTorch tensors on their GPU. ``"cpu"``: always the CPU (device arrays are
copied to the host, results go back to the caller's library and device).
``"cuda"``: always the GPU (NumPy input is uploaded, results come back as
NumPy); a ``RuntimeError`` says so when no GPU is usable.

Results come back in the library of ``origins`` (NumPy, CuPy, or PyTorch on
the same device). A single ray may be given as ``(3,)`` arrays; the results
then have shape ``(1,)``.

Ray conventions (hits with ``tmin <= t <= tmax``, two-sided triangles,
barycentrics ``u`` of ``v1`` and ``v`` of ``v2``) are described in
:mod:`kdtree_gpu.trace.cpu`.
"""

from __future__ import annotations

import numpy as np

DEVICES = ("auto", "cpu", "cuda")


# --- array libraries ------------------------------------------------------------
def _library(x) -> str:
    module = type(x).__module__
    if module.startswith("cupy"):
        return "cupy"
    if module.startswith("torch"):
        return "torch"
    return "numpy"


def _to_numpy(x):
    kind = _library(x)
    if kind == "cupy":
        return x.get()
    if kind == "torch":
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _to_cupy(x):
    import cupy

    kind = _library(x)
    if kind == "cupy":
        return x
    if kind == "torch":
        if x.is_cuda:
            return cupy.from_dlpack(x.detach().contiguous())
        x = x.detach().numpy()
    return cupy.asarray(np.asarray(x))


def _result_like(result, like, like_kind):
    """Return ``result`` (NumPy or CuPy) in the library and device of ``like``."""
    if like_kind == "numpy":
        return result.get() if _library(result) == "cupy" else np.asarray(result)
    if like_kind == "cupy":
        import cupy

        if _library(result) == "cupy":
            return result
        with cupy.cuda.Device(like.device.id):
            return cupy.asarray(result)
    import torch

    if _library(result) == "cupy":
        out = torch.from_dlpack(result)
    else:
        out = torch.from_numpy(np.ascontiguousarray(result))
    return out.to(like.device)


def _gpu_usable() -> bool:
    try:
        import cupy

        return bool(cupy.is_available())
    except Exception:
        return False


def _choose_device(device, origins, directions) -> str:
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    kinds = {_library(origins), _library(directions)}
    on_gpu = "cupy" in kinds or ("torch" in kinds and any(
        _library(a) == "torch" and a.is_cuda for a in (origins, directions)))
    if device == "auto":
        device = "cuda" if on_gpu else "cpu"
    if device == "cuda" and not _gpu_usable():
        raise RuntimeError("device='cuda' was asked for, but no usable CUDA GPU was found "
                           "(CuPy missing or cupy.is_available() is False)")
    return device


# --- validation -----------------------------------------------------------------
def check_rays(origins, directions, tmin=0.0, tmax=np.inf, xp=np):
    """Check rays and return them as contiguous float32 arrays of ``xp``.

    Parameters
    ----------
    origins, directions : (num_rays, 3) or (3,) array_like of float
    tmin, tmax : float or (num_rays,) array_like of float
    xp : module
        ``numpy`` (the rays are brought to the host) or ``cupy`` (the rays
        are moved to, or stay on, the current GPU and are checked there).

    Returns
    -------
    origins, directions : (num_rays, 3) float32
    tmin, tmax : (num_rays,) float32

    Raises
    ------
    ValueError
        Wrong shapes, NaN or infinite origins or directions, zero-length
        directions, NaN in tmin or tmax, or ``tmin > tmax``; the message names
        the first bad ray.
    """
    convert = _to_numpy if xp is np else _to_cupy
    O = convert(origins)
    D = convert(directions)
    for name, a in (("origins", O), ("directions", D)):
        if a.dtype.kind not in "fiu":
            raise ValueError(f"{name} must be a float array, got dtype {a.dtype}")
    if O.ndim == 1:
        O = O.reshape(1, -1)
    if D.ndim == 1:
        D = D.reshape(1, -1)
    for name, a in (("origins", O), ("directions", D)):
        if a.ndim != 2 or a.shape[1] != 3:
            raise ValueError(f"{name} must have shape (num_rays, 3) or (3,), got {a.shape}")
    if O.shape[0] != D.shape[0]:
        raise ValueError(f"origins has {O.shape[0]} rays but directions has {D.shape[0]}")
    num_rays = O.shape[0]
    O = xp.ascontiguousarray(O, dtype=xp.float32)
    D = xp.ascontiguousarray(D, dtype=xp.float32)
    # each bool() below is one device-to-host read when xp is cupy
    for name, a in (("origins", O), ("directions", D)):
        bad = ~xp.isfinite(a).all(axis=1)
        if bool(bad.any()):
            i = int(xp.flatnonzero(bad)[0])
            raise ValueError(f"ray {i} has a NaN or infinite value in its {name[:-1]}: "
                             f"{a[i].tolist()} ({int(bad.sum())} such rays)")
    zero = ~(D != 0).any(axis=1)
    if bool(zero.any()):
        i = int(xp.flatnonzero(zero)[0])
        raise ValueError(f"ray {i} has a zero-length direction ({int(zero.sum())} such rays)")
    bounds = []
    for name, value in (("tmin", tmin), ("tmax", tmax)):
        if isinstance(value, (int, float, np.number)):
            a = xp.full(num_rays, value, dtype=xp.float32)
        else:
            a = convert(value)
            if a.ndim == 0:
                a = xp.full(num_rays, float(a), dtype=xp.float32)
            elif a.shape != (num_rays,):
                raise ValueError(f"{name} must be a scalar or have shape ({num_rays},), "
                                 f"got {a.shape}")
        a = xp.ascontiguousarray(a, dtype=xp.float32)
        nan = xp.isnan(a)
        if bool(nan.any()):
            i = int(xp.flatnonzero(nan)[0])
            raise ValueError(f"ray {i} has a NaN {name}")
        bounds.append(a)
    tmin32, tmax32 = bounds
    bad = tmin32 > tmax32
    if bool(bad.any()):
        i = int(xp.flatnonzero(bad)[0])
        raise ValueError(f"ray {i} has tmin > tmax ({float(tmin32[i])!r} > {float(tmax32[i])!r})")
    return O, D, tmin32, tmax32


def _device_id(x, kind):
    # the GPU that holds the caller's rays, or None
    if kind == "cupy":
        return x.device.id
    if kind == "torch" and x.is_cuda:
        return x.device.index
    return None


def _run(tree, origins, directions, tmin, tmax, device, any_hit):
    device = _choose_device(device, origins, directions)
    like_kind = _library(origins)
    if device == "cpu":
        from .cpu import intersect_cpu, occluded_cpu

        O, D, t0, t1 = check_rays(origins, directions, tmin, tmax)
        results = (occluded_cpu(tree, O, D, t0, t1),) if any_hit else \
            intersect_cpu(tree, O, D, t0, t1)
    else:
        import cupy

        from .gpu import intersect_gpu, occluded_gpu

        device_id = _device_id(origins, like_kind)
        if device_id is None:
            device_id = cupy.cuda.runtime.getDevice()
        with cupy.cuda.Device(device_id):
            args = check_rays(origins, directions, tmin, tmax, xp=cupy)
            results = (occluded_gpu(tree, *args),) if any_hit else intersect_gpu(tree, *args)
    return tuple(_result_like(r, origins, like_kind) for r in results)


def intersect(tree, origins, directions, tmin=0.0, tmax=np.inf, device="auto"):
    """Closest hit of each ray against a kd-tree.

    Parameters
    ----------
    tree : KdTree
    origins, directions : (num_rays, 3) or (3,) array_like of float
        NumPy, CuPy or PyTorch; directions need not be unit length.
    tmin, tmax : float or (num_rays,) array_like
        Hits with ``tmin <= t <= tmax`` count.
    device : {"auto", "cpu", "cuda"}
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
        Bad rays (see :func:`check_rays`) or an unknown ``device``.
    RuntimeError
        ``device="cuda"`` without a usable GPU.
    """
    return _run(tree, origins, directions, tmin, tmax, device, any_hit=False)


def occluded(tree, origins, directions, tmin=0.0, tmax=np.inf, device="auto"):
    """Whether each ray hits any triangle with ``tmin <= t <= tmax``.

    Parameters and errors as :func:`intersect`.

    Returns
    -------
    (num_rays,) bool
    """
    return _run(tree, origins, directions, tmin, tmax, device, any_hit=True)[0]


def _mesh_of(tree_or_vertices, faces):
    from ..mesh import validate_mesh

    if faces is None:
        return tree_or_vertices.vertices, tree_or_vertices.faces
    return validate_mesh(tree_or_vertices, faces)


def _run_brute(tree_or_vertices, faces, origins, directions, tmin, tmax, device, any_hit):
    V, F = _mesh_of(tree_or_vertices, faces)
    device = _choose_device(device, origins, directions)
    like_kind = _library(origins)
    if device == "cpu":
        from .cpu import brute_cpu

        O, D, t0, t1 = check_rays(origins, directions, tmin, tmax)
        results = brute_cpu(V, F, O, D, t0, t1, any_hit=any_hit)
        results = (results[1] >= 0,) if any_hit else results
    else:
        import cupy

        from .gpu import brute_intersect_gpu, brute_occluded_gpu

        device_id = _device_id(origins, like_kind)
        if device_id is None:
            device_id = cupy.cuda.runtime.getDevice()
        with cupy.cuda.Device(device_id):
            args = check_rays(origins, directions, tmin, tmax, xp=cupy)
            results = (brute_occluded_gpu(V, F, *args),) if any_hit else \
                brute_intersect_gpu(V, F, *args)
    return tuple(_result_like(r, origins, like_kind) for r in results)


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
