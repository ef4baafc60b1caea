"""``kd.build``: check the input, choose the builder, return one kind of result.

Builders (``kernels=``)
-----------------------
============  =======  ==========================================================
kernels       device   what runs
============  =======  ==========================================================
"reference"   cpu      the Wald & Havran builder of :mod:`cpu_reference` (numba;
                       the default on the CPU: the fastest identical tree there)
"xp"          cpu      the level pipeline (:mod:`.pipeline`) on NumPy
"xp"          cuda     the same stage functions on CuPy (the kernels' twin)
"fused"       cuda     the CUDA drivers (:mod:`.gpu`): levels in the level-loop
                       kernel, large ones one launch per stage (the default;
                       with ``clip=True`` too, the loop clips)
"stages"      cuda     the CUDA drivers, every level one launch per stage
============  =======  ==========================================================

Every builder follows the build rules R1-R10 of :mod:`cpu_reference` and
makes the same tree under the same :class:`~kdtree_gpu.SAHConfig`; each
returns a :class:`~kdtree_gpu.KdTree` whose ``build_info`` has one layout:
``builder`` (``"reference"`` or ``"levels"``), ``device`` (``"cpu"``,
``"cuda:0"``, ...), ``kernels``, ``seconds`` (wall time of the call, less the
CPU builder's one-time compilation, which says so on stderr), plus
builder-specific facts.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from typing import Optional

import numpy as np

from .. import encoding as enc
from ..arrays import device_of, on_gpu, to_numpy
from ..config import SAHConfig
from ..device import parse_device, resolve_device
from ..launch import Profiler
from ..mesh import coerce_mesh, prepare_mesh
from ..tree import KdTree
from .gpu import build_levels_cuda  # (imports nothing of CuPy)
from .gpu.root import coerce_mesh_cuda
from .settings import DEFAULT_SETTINGS, GpuSettings

KERNEL_CHOICES = ("fused", "stages", "xp", "reference")
_KERNELS_ON = {"cpu": ("reference", "xp"), "cuda": ("fused", "stages", "xp")}
MAX_TRIANGLES = enc.MAX_TRIANGLES


def _as_mesh_arrays(vertices, faces):
    if faces is None:
        if hasattr(vertices, "vertices") and hasattr(vertices, "faces"):
            return vertices.vertices, vertices.faces
        raise TypeError("build() needs (vertices, faces) or a mesh object with .vertices and .faces")
    return vertices, faces


def build(vertices, faces=None, config: Optional[SAHConfig] = None, device="auto",
          profile: bool = False, kernels: Optional[str] = None,
          settings: Optional[GpuSettings] = None, progress=None) -> KdTree:
    """Build a full-SAH kd-tree.

    Parameters
    ----------
    vertices : (num_vertices, 3) array_like of float, or a mesh object
        Vertex positions; or a ``trimesh.Trimesh`` (anything with
        ``.vertices`` and ``.faces``) with ``faces`` left out. GPU arrays
        (CuPy, CUDA PyTorch tensors, ``__cuda_array_interface__``, DLPack)
        stay on their GPU: nothing goes through the host.
    faces : (num_triangles, 3) array_like of int, optional
    config : SAHConfig, optional
        Defaults to ``SAHConfig()``.
    device : str
        ``"auto"`` (the GPU that holds the mesh; else a GPU when usable; else
        the CPU), ``"cpu"``, ``"gpu"``, ``"cuda"`` or ``"cuda:N"``
        (:mod:`kdtree_gpu.device`). A tree built on a GPU stays there
        (``tree.device``); its NumPy arrays are made on first host use.
    profile : bool
        Record a per-stage time table in ``tree.build_info["profile"]`` and
        ``["profile_table"]`` (level builders).
    kernels : str, optional
        Which builder runs (module docstring); default ``"fused"`` on a GPU,
        ``"reference"`` on the CPU.
    settings : GpuSettings, optional
        How the GPU drivers run their levels (tests use it to reach every
        path); the default is what the measurements chose.
    progress : callable, optional
        Called with the fraction done (0 to 1) during long builds of the
        reference builder (the command line draws its bar with it); GPU
        builds take milliseconds and do not call it.

    Returns
    -------
    KdTree
        The same tree as ``cpu_reference.build`` under the same settings
        (node order may differ).

    Raises
    ------
    MeshError
        Invalid mesh (see :func:`kdtree_gpu.mesh.validate_mesh`).
    ValueError
        Unknown device or kernels, or kernels that do not run on the device.
    MemoryError
        The build does not fit in device memory (the GPU stays usable).
    """
    cfg = SAHConfig() if config is None else config
    if not isinstance(cfg, SAHConfig):
        raise TypeError(f"config must be a SAHConfig, got {type(cfg).__name__}")
    vertices, faces = _as_mesh_arrays(vertices, faces)
    dev = _build_device(device, vertices, faces)
    if kernels is None:
        kernels = "fused" if dev.is_cuda else "reference"
    if kernels not in KERNEL_CHOICES:
        raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {kernels!r}")
    if kernels not in _KERNELS_ON[dev.kind]:
        raise ValueError(f"kernels={kernels!r} does not run on device {str(dev)!r} "
                         f"(there: {', '.join(_KERNELS_ON[dev.kind])})")
    settings = DEFAULT_SETTINGS if settings is None else settings
    if np.shape(faces)[0] > MAX_TRIANGLES:
        raise ValueError(f"too many triangles: {np.shape(faces)[0]} (at most {MAX_TRIANGLES})")
    if kernels == "reference":
        import cpu_reference

        # compiled once per machine (and said so): not part of "seconds"
        cpu_reference.warm_up()
    start = time.perf_counter()
    if kernels == "reference":
        tree = _build_reference(vertices, faces, cfg, progress)
    else:
        with dev.use(), (Profiler() if profile else contextlib.nullcontext()) as prof:
            tree = _build_levels(vertices, faces, cfg, dev, kernels, settings)
        if profile:
            tree.build_info["profile"] = prof.as_dict()
            tree.build_info["profile_table"] = prof.report()
    tree.build_info.update(device=str(dev), kernels=kernels, seconds=time.perf_counter() - start)
    return tree


def _build_device(device, vertices, faces):
    """The device to build on: ``device``, or for "auto" the GPU that holds the mesh."""
    if parse_device(device)[0] == "auto":
        for a in (vertices, faces):
            if on_gpu(a):
                return device_of(a)
    return resolve_device(device)


def _build_reference(vertices, faces, cfg, progress=None) -> KdTree:
    import cpu_reference

    tree = cpu_reference.build(vertices, faces, cfg, progress=progress)
    tree.build_info = {"builder": "reference", **{k: v for k, v in tree.build_info.items()
                                                  if k != "builder"}}
    return tree


def _build_levels(vertices, faces, cfg, dev, kernels, settings) -> KdTree:
    """The level-by-level builder on NumPy, CuPy (``xp``) or the CUDA drivers."""
    xp = dev.xp
    if kernels == "xp":
        from .pipeline import build_levels_xp

        V, F, tri_lo, tri_hi, valid, bounds = prepare_mesh(vertices, faces)
        with _out_of_memory_is_memory_error(xp, F.shape[0]):
            nodes, leaf_tris, levels, level_sizes = build_levels_xp(xp, cfg, tri_lo, tri_hi,
                                                                    valid, bounds, (V, F))
            host = [to_numpy(a) for a in (*nodes.args(), leaf_tris)]
        info = {"levels": levels, "level_sizes": level_sizes}
        num_degenerate = int((~valid).sum())
    else:
        if on_gpu(vertices) or on_gpu(faces):
            V, F = coerce_mesh_cuda(xp, vertices, faces)
        else:
            V, F = coerce_mesh(vertices, faces)
        with _out_of_memory_is_memory_error(xp, F.shape[0]):
            arrays, layout, info = build_levels_cuda(
                xp, cfg, V, F, loop="grid" if kernels == "fused" else "stages", settings=settings)
        bounds = info.pop("bounds")
        tree = KdTree._from_builder(arrays, f"cuda:{layout.device_id}", cfg,
                                    info.pop("num_degenerate"), {"builder": "levels", **info},
                                    host_bounds=bounds)
        tree._device_cache[("layout", layout.device_id)] = layout
        return tree
    node_axis, node_split, node_child, node_count, leaf_tris = host
    return KdTree(node_axis=node_axis, node_split=node_split, node_child=node_child,
                  node_count=node_count, leaf_tris=leaf_tris, bounds=bounds, vertices=V,
                  faces=F, config=cfg, num_degenerate=num_degenerate,
                  build_info={"builder": "levels", **info})


@contextlib.contextmanager
def _out_of_memory_is_memory_error(xp, num_triangles):
    if xp is np:
        yield
        return
    try:
        yield
    except (xp.cuda.memory.OutOfMemoryError, MemoryError) as exc:
        # CuPy's pool raises OutOfMemoryError; CUB's temporary storage a
        # MemoryError ("std::bad_alloc"). Free the caches so the GPU stays
        # usable, once the failed build's frames no longer hold its arrays (the
        # exception keeps them alive: their blocks would go back to the pools,
        # cached, only after it).
        traceback.clear_frames(exc.__traceback__)
        xp.get_default_memory_pool().free_all_blocks()
        from .gpu.workspace import release_cached

        release_cached()
        raise MemoryError(
            f"the kd-tree build of {num_triangles} triangles does not fit in GPU memory "
            f"({exc}); try device='cpu' or a smaller mesh") from None
