"""Loading triangle meshes from files (anything trimesh reads) and mesh objects.

Real meshes are not shipped with the package: bare names such as
``"stanford_bunny"`` are looked up in the folder named by the environment
variable ``KDTREE_GPU_MESH_DIR`` (see ``meshes/README.md``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np

from .geometry import MeshError, validate_mesh

MESH_DIR_ENV = "KDTREE_GPU_MESH_DIR"
# suffixes tried, in order, after a bare name that is not a file itself
NAME_SUFFIXES = ("", ".ply", ".obj")

__all__ = ["MeshError", "as_arrays", "load_mesh", "mesh_dir", "resolve_mesh_path"]


def mesh_dir() -> Optional[Path]:
    """The mesh folder named by ``KDTREE_GPU_MESH_DIR``, or ``None`` when unset."""
    value = os.environ.get(MESH_DIR_ENV, "").strip()
    return Path(value).expanduser() if value else None


def resolve_mesh_path(path_or_name) -> Path:
    """Find the file for a path or a bare mesh name.

    An existing path is used as is. A bare name (no folder part) is then
    looked up in :func:`mesh_dir`, as given and with ``.ply`` and ``.obj``
    appended.

    Raises
    ------
    FileNotFoundError
        Naming every place that was tried.
    """
    path = Path(path_or_name).expanduser()
    if path.is_file():
        return path
    tried = [str(path)]
    is_bare_name = path.name == str(path_or_name) and path.name not in ("", ".", "..")
    folder = mesh_dir()
    if is_bare_name and folder is not None:
        for suffix in NAME_SUFFIXES:
            candidate = folder / (path.name + suffix)
            if candidate.is_file():
                return candidate
            tried.append(str(candidate))
    hint = ""
    if is_bare_name and folder is None:
        hint = f" (set {MESH_DIR_ENV} to a folder of meshes to look names up there)"
    raise FileNotFoundError(f"mesh {str(path_or_name)!r} not found; looked for: "
                            f"{', '.join(tried)}{hint}")


def _trimesh_arrays(mesh, where):
    import trimesh

    if isinstance(mesh, trimesh.Scene):
        geometries = [g for g in mesh.dump() if isinstance(g, trimesh.Trimesh)]
        if not geometries:
            raise MeshError(f"{where}: the scene holds no triangle geometry")
        mesh = trimesh.util.concatenate(geometries)
    if not isinstance(mesh, trimesh.Trimesh):
        raise MeshError(f"{where}: holds a {type(mesh).__name__}, not a triangle mesh")
    faces = np.asarray(mesh.faces)
    if faces.size == 0:
        raise MeshError(f"{where}: has no faces")
    return np.asarray(mesh.vertices), faces


def as_arrays(mesh_or_arrays):
    """Vertex and face arrays of a mesh given in any supported form.

    Parameters
    ----------
    mesh_or_arrays : trimesh.Trimesh, trimesh.Scene, (vertices, faces), or any
        object with ``vertices`` and ``faces`` attributes (e.g. a built-in scene)

    Returns
    -------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32

    Raises
    ------
    MeshError
        Not a triangle mesh, or invalid (see :func:`kdtree_gpu.geometry.validate_mesh`).
    """
    try:
        import trimesh

        is_trimesh = isinstance(mesh_or_arrays, (trimesh.Trimesh, trimesh.Scene))
    except ImportError:  # pragma: no cover - trimesh is a dependency
        is_trimesh = False
    if is_trimesh:
        V, F = _trimesh_arrays(mesh_or_arrays, f"{type(mesh_or_arrays).__name__} object")
    elif isinstance(mesh_or_arrays, (tuple, list)) and len(mesh_or_arrays) == 2:
        V, F = mesh_or_arrays
    elif hasattr(mesh_or_arrays, "vertices") and hasattr(mesh_or_arrays, "faces"):
        V, F = mesh_or_arrays.vertices, mesh_or_arrays.faces
    else:
        raise MeshError(f"expected a trimesh mesh, a (vertices, faces) pair or an object with "
                        f"vertices and faces, got {type(mesh_or_arrays).__name__}")
    return validate_mesh(V, F)


def load_mesh(path_or_name):
    """Load a triangle mesh from a file, a bare name or a mesh object.

    Parameters
    ----------
    path_or_name : str, os.PathLike, or a mesh object
        A file trimesh can read (PLY, OBJ, STL, GLB/GLTF, OFF, ...); a bare
        name such as ``"stanford_bunny"`` looked up in :func:`mesh_dir`; or
        anything :func:`as_arrays` accepts. Vertex order is kept
        (``process=False``); polygons are triangulated by trimesh; a scene
        with several geometries is concatenated (with its transforms applied).

    Returns
    -------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32

    Raises
    ------
    FileNotFoundError
        No such file (the message lists where it looked).
    MeshError
        The file does not parse, holds no triangles, or the mesh is invalid
        (NaN coordinates, out-of-range indices, ...).
    """
    if not isinstance(path_or_name, (str, os.PathLike)):
        return as_arrays(path_or_name)
    path = resolve_mesh_path(path_or_name)
    import trimesh

    try:
        mesh = trimesh.load(str(path), process=False, force="mesh")
    except Exception as exc:
        raise MeshError(f"{path}: cannot read as a mesh: {type(exc).__name__}: {exc}") from None
    V, F = _trimesh_arrays(mesh, str(path))
    try:
        return validate_mesh(V, F)
    except MeshError as exc:
        raise MeshError(f"{path}: {exc}") from None
