"""One mesh: load it, decide whether its tree is up to date, build and save it.

This is what a Dask worker runs for each task, and what the in-process path
runs in a loop; it needs no Dask.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import Callable, Optional

from ..device import parse_device
from .records import (_HASH_CHUNK, BUILT, FAILED, UP_TO_DATE, BatchSettings, MeshJob, MeshRecord,
                      OutputExistsError)


def build_one(job: MeshJob, settings: BatchSettings, progress: Optional[Callable] = None,
              worker: str = "local") -> MeshRecord:
    """Build and save the tree of one mesh unless it is up to date; never raises.

    This is the task every worker runs (and the in-process loop calls).

    Returns
    -------
    MeshRecord
        ``"built"``, ``"up to date"``, or ``"failed"`` with the error.
    """
    try:
        loader = settings.loader or load_source
        sha256, arrays = _mesh_digest(job.path, loader)
        state, reason, header = _output_state(job, settings, sha256)
        if state == UP_TO_DATE:
            return MeshRecord(index=job.index, input=job.source, output=job.output,
                              status=UP_TO_DATE, triangles=_header_triangles(header),
                              worker=worker, sha256=sha256)
        if progress is not None:
            progress(job, 0.0)
        if arrays is None:
            arrays = loader(job.path)
        vertices, faces = arrays
        tree, notes = _build(vertices, faces, settings,
                             None if progress is None else (lambda f: progress(job, f)))
        tree.build_info["source"] = settings.source_record(sha256, job.path)
        Path(job.output).parent.mkdir(parents=True, exist_ok=True)
        tree.save(job.output)
        device = tree.build_info.get("device")
        return MeshRecord(index=job.index, input=job.source, output=job.output, status=BUILT,
                          reason=reason, triangles=tree.num_triangles,
                          seconds=float(tree.build_info.get("seconds", float("nan"))),
                          worker=worker, device=device, gpu=_gpu_name(device), sha256=sha256,
                          stats=dict(tree.stats()) if settings.stats else {},
                          build_info=dict(tree.build_info),
                          warnings=notes)
    except Exception as exc:
        record = failed_record(job, exc)
        record.worker = worker
        return record


def _build(vertices, faces, settings, progress):
    """``kd.build``; settings the GPU builder lacks build on the CPU when the device is "auto"."""
    from .. import builder

    options = dict(settings.build_options)
    if progress is not None:
        options["progress"] = progress
    try:
        return builder.build(vertices, faces, config=settings.config, device=settings.device,
                             **options), []
    except NotImplementedError as exc:
        if parse_device(settings.device)[0] != "auto":
            raise
        tree = builder.build(vertices, faces, config=settings.config, device="cpu", **options)
        return tree, [f"building on the CPU: {exc}"]


def load_source(source):
    """The default loader: a mesh file or name (:func:`kdtree_gpu.load_mesh`) or a built-in scene.

    Returns
    -------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
    """
    from ..mesh import load_mesh, resolve_mesh_path

    try:
        path = resolve_mesh_path(source)
    except FileNotFoundError:
        from ..scenes import scene_by_name, scene_names

        if str(source) in scene_names():
            return scene_by_name(str(source)).arrays()
        raise
    with warnings.catch_warnings():
        # coordinates beyond float32 make NumPy warn as load_mesh converts
        # them, before it raises the MeshError that names the vertex
        warnings.simplefilter("ignore", RuntimeWarning)
        return load_mesh(path)


def _mesh_digest(path, loader):
    """sha256 of the mesh file's bytes; of the loaded arrays (returned too) when it is no file."""
    digest = hashlib.sha256()
    if os.path.isfile(path):
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(_HASH_CHUNK), b""):
                digest.update(chunk)
        return digest.hexdigest(), None
    arrays = loader(path)
    import numpy as np

    for a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(f"{a.dtype.str}{a.shape}".encode())
        digest.update(memoryview(a).cast("B"))
    return digest.hexdigest(), arrays


def _output_state(job, settings, sha256):
    """``(state, reason, header)``: up to date, to build (why), or an error for a file in the way.

    Raises
    ------
    OutputExistsError
        A file at the output that is not an earlier tree of this mesh (without ``force``).
    """
    from ..tree import TreeFileError, read_header

    if not os.path.lexists(job.output):
        return BUILT, "new", None
    if settings.force:
        return BUILT, "forced", None
    hint = "; use force=True to overwrite it"
    try:
        header = read_header(job.output)
    except (TreeFileError, OSError):
        raise OutputExistsError(f"{job.output} exists and is not a tree file{hint}") from None
    source = (header.get("build_info") or {}).get("source")
    if not isinstance(source, dict) or "sha256" not in source:
        raise OutputExistsError(f"{job.output} exists: a tree without a record of its mesh{hint}")
    same_mesh = source.get("sha256") == sha256
    same_settings = settings.same_settings(header)
    if same_mesh and same_settings:
        return UP_TO_DATE, None, header
    if same_mesh:
        return BUILT, "settings changed", header
    if source.get("path") == job.path:
        return BUILT, "mesh changed", header
    raise OutputExistsError(f"{job.output} exists: the tree of another mesh "
                            f"({source.get('path')}){hint}")


def _up_to_date_record(job, settings) -> Optional[MeshRecord]:
    """The record of a tree found up to date here, else ``None`` (the task decides)."""
    if not os.path.lexists(job.output):
        return None
    try:
        sha256, _ = _mesh_digest(job.path, settings.loader or load_source)
        state, _, header = _output_state(job, settings, sha256)
    except Exception:
        return None
    if state != UP_TO_DATE:
        return None
    return MeshRecord(index=job.index, input=job.source, output=job.output, status=UP_TO_DATE,
                      triangles=_header_triangles(header), worker="local", sha256=sha256)


def _header_triangles(header) -> Optional[int]:
    for entry in header.get("arrays", []):
        if entry.get("name") == "faces":
            return int(entry["shape"][0])
    return None


def failed_record(job: MeshJob, exc: BaseException, message: Optional[str] = None,
                  input_error: Optional[bool] = None) -> MeshRecord:
    """The record of a mesh that failed with ``exc`` (``message``: its line, if not the default)."""
    from ..mesh import MeshError
    from ..tree import TreeFileError

    if input_error is None:
        input_error = isinstance(exc, (MeshError, TreeFileError, OSError, NotImplementedError))

    return MeshRecord(index=job.index, input=job.source, output=job.output, status=FAILED,
                      error=message or _error_text(exc), input_error=input_error,
                      exception=exc)


def _error_text(exc: BaseException) -> str:
    """One line naming the problem (the file of an OS error)."""
    if isinstance(exc, OSError) and exc.filename is not None:
        if isinstance(exc, FileNotFoundError):
            return f"no such file or directory: {exc.filename}"
        return f"{exc.strerror or exc}: {exc.filename}"
    text = " ".join(str(exc).split())
    if isinstance(exc, (ValueError, RuntimeError, TypeError, OSError, MemoryError)) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _gpu_name(device) -> Optional[str]:
    if not device or not str(device).startswith("cuda"):
        return None
    from ..device import device_name

    try:
        name = device_name(device)
    except Exception:
        name = str(device)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f"{name} (CUDA_VISIBLE_DEVICES={visible})" if visible else name
