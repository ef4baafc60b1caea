"""Triangle meshes: loading, names in the mesh folder, validation, preparation.

Every builder, the ray oracles and the command line take their meshes from
here, so all of them accept the same inputs, reject the same bad input with
the same message and leave out the same degenerate triangles.

Real meshes are not shipped with the package: bare names such as
``"stanford_bunny"`` are looked up in the folder named by the environment
variable ``KDTREE_GPU_MESH_DIR`` (see ``meshes/README.md``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np

from .arrays import to_numpy

MESH_DIR_ENV = "KDTREE_GPU_MESH_DIR"
# suffixes tried, in order, after a bare name that is not a file itself
MESH_SUFFIXES = (".ply", ".obj", ".off", ".stl", ".glb", ".gltf")

__all__ = ["MeshError", "MESH_DIR_ENV", "MESH_SUFFIXES", "as_arrays", "coerce_mesh",
           "degenerate_mask", "load_mesh", "mesh_dir", "prepare_mesh", "resolve_mesh_path",
           "triangle_bounds", "validate_mesh"]


class MeshError(ValueError):
    """A mesh that cannot be built into a tree; the message names the problem."""


def _as_array(x, name):
    # NumPy, CuPy, PyTorch and anything numpy.asarray reads, on the host
    try:
        return to_numpy(x)
    except Exception as exc:  # pragma: no cover - exotic objects
        raise MeshError(f"{name} cannot be converted to an array: {exc}") from exc


def coerce_mesh(vertices, faces):
    """Shape, dtype and emptiness checks and conversion, without value checks.

    The GPU builder checks the values (finite coordinates, indices in range)
    on the device and calls :func:`validate_mesh` only to name a problem it
    found. Non-int32 indices are range-checked here, since converting an
    out-of-range int64 index to int32 would hide it.

    Returns
    -------
    vertices : (num_vertices, 3) float32
        With -0.0 folded into +0.0.
    faces : (num_triangles, 3) int32
    """
    V = _as_array(vertices, "vertices")
    F = _as_array(faces, "faces")
    _check_shapes(V, F)
    if F.dtype != np.int32:
        lo, hi = int(F.min()), int(F.max())
        if lo < 0 or hi >= V.shape[0]:
            validate_mesh(V, F)  # raises, naming the first bad face
        F = F.astype(np.int32)
    V32 = np.ascontiguousarray(V, dtype=np.float32) + np.float32(0.0)
    return V32, np.ascontiguousarray(F, dtype=np.int32)


def _check_shapes(V, F):
    if V.ndim != 2 or V.shape[1] != 3:
        raise MeshError(f"vertices must have shape (n, 3), got {V.shape}")
    if F.ndim != 2 or F.shape[1] != 3:
        raise MeshError(f"faces must have shape (m, 3) (triangles only), got {F.shape}")
    if V.dtype.kind not in "fiu":
        raise MeshError(f"vertices must be a float array, got dtype {V.dtype}")
    if F.dtype.kind not in "iu":
        if F.dtype.kind == "f" and F.size and np.all(np.isfinite(F)) and np.all(F == np.round(F)):
            raise MeshError(f"faces must be an integer array, got dtype {F.dtype} "
                            "(convert with faces.astype(np.int32))")
        raise MeshError(f"faces must be an integer array, got dtype {F.dtype}")
    if F.shape[0] == 0:
        raise MeshError("empty mesh: faces has no triangles")
    if V.shape[0] == 0:
        raise MeshError("empty mesh: vertices has no points")
    if F.shape[0] > np.iinfo(np.int32).max // 8:
        raise MeshError(f"too many triangles for int32 indexing: {F.shape[0]}")


def validate_mesh(vertices, faces):
    """Check a triangle mesh and return it as contiguous float32 / int32 arrays.

    Parameters
    ----------
    vertices : (num_vertices, 3) array_like of float
        Finite coordinates. float32 is used as is; other float or integer
        dtypes are converted (float64 is rounded to float32).
    faces : (num_triangles, 3) array_like of int
        Vertex indices in ``[0, num_vertices)``.

    Returns
    -------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32

    Raises
    ------
    MeshError
        Wrong shape or dtype, NaN or infinite coordinates, negative or
        out-of-range indices, an empty mesh.
    """
    V = _as_array(vertices, "vertices")
    F = _as_array(faces, "faces")
    _check_shapes(V, F)
    if V.dtype.kind == "f":
        bad = ~np.isfinite(V)
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            kind = "a NaN" if np.isnan(V[row]).any() else "an infinite"
            raise MeshError(f"vertex {row} has {kind} coordinate: {V[row].tolist()}")
    # "+ 0" turns -0.0 into +0.0: event sorts compare bit patterns, and a
    # negative zero would sort apart from a positive one at the same position.
    V32 = np.ascontiguousarray(V, dtype=np.float32) + np.float32(0.0)
    if V.dtype.kind == "f" and not np.all(np.isfinite(V32)):
        row = int(np.argwhere(~np.isfinite(V32))[0][0])
        raise MeshError(f"vertex {row} overflows float32: {V[row].tolist()}")
    F64 = F.astype(np.int64, copy=False)
    lo, hi = int(F64.min()), int(F64.max())
    if lo < 0:
        row = int(np.argwhere(F64 < 0)[0][0])
        raise MeshError(f"face {row} has a negative vertex index: {F64[row].tolist()}")
    if hi >= V.shape[0]:
        row = int(np.argwhere(F64 >= V.shape[0])[0][0])
        raise MeshError(
            f"face {row} has vertex index {hi} out of range for {V.shape[0]} vertices: "
            f"{F64[row].tolist()}"
        )
    return V32, np.ascontiguousarray(F64, dtype=np.int32)


def triangle_bounds(vertices, faces):
    """Axis-aligned box of every triangle.

    Parameters
    ----------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32

    Returns
    -------
    tri_lo, tri_hi : (num_triangles, 3) float32
        Exact per-axis minimum and maximum of the three vertices.
    """
    P = vertices[faces]  # (m, 3 vertices, 3 axes)
    return P.min(axis=1), P.max(axis=1)


def degenerate_mask(vertices, faces):
    """Triangles of zero area.

    The cross product of two edges is computed in float64. Differences of
    float32 values and products of those differences are exact in float64, so
    the cross product is exactly zero if and only if the three float32 points
    are collinear (or coincide).

    Returns
    -------
    (num_triangles,) bool
    """
    P = vertices[faces].astype(np.float64)
    e1 = P[:, 1] - P[:, 0]
    e2 = P[:, 2] - P[:, 0]
    c = np.cross(e1, e2)
    return ~np.any(c != 0.0, axis=1)


def prepare_mesh(vertices, faces):
    """Validate a mesh and compute what every builder needs.

    Returns
    -------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
    tri_lo, tri_hi : (num_triangles, 3) float32
        Triangle boxes (also for degenerate triangles; builders skip those).
    valid : (num_triangles,) bool
        False for zero-area triangles, which are left out of the tree.
    bounds : (2, 3) float32
        Union of the boxes of the valid triangles: the root node's box.

    Raises
    ------
    MeshError
        As :func:`validate_mesh`, and when every triangle is degenerate.
    """
    V, F = validate_mesh(vertices, faces)
    tri_lo, tri_hi = triangle_bounds(V, F)
    valid = ~degenerate_mask(V, F)
    if not valid.any():
        raise MeshError(f"all {F.shape[0]} triangles are degenerate (zero area); nothing to build")
    bounds = np.stack([tri_lo[valid].min(axis=0), tri_hi[valid].max(axis=0)]).astype(np.float32)
    check_trace_range(bounds, *smallest_triangle(tri_lo, tri_hi, valid))
    return V, F, tri_lo, tri_hi, valid, bounds


# --- files and names ----------------------------------------------------------
def mesh_dir() -> Optional[Path]:
    """The mesh folder named by ``KDTREE_GPU_MESH_DIR``, or ``None`` when unset."""
    value = os.environ.get(MESH_DIR_ENV, "").strip()
    return Path(value).expanduser() if value else None


def resolve_mesh_path(path_or_name) -> Path:
    """Find the file for a path or a bare mesh name.

    An existing path is used as is. A bare name (no folder part) is then
    looked up in :func:`mesh_dir`, as given and with each of
    :data:`MESH_SUFFIXES` appended.

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
        for suffix in ("",) + MESH_SUFFIXES:
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

    ``mesh_or_arrays`` is a ``trimesh.Trimesh``, a ``trimesh.Scene``, a
    ``(vertices, faces)`` pair, or any object with ``vertices`` and ``faces``
    attributes (a built-in scene, say). Returns float32 vertices and int32
    faces as :func:`validate_mesh` does, and raises :class:`MeshError` for
    anything that is not a valid triangle mesh.
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
    vertices, faces
        As :func:`validate_mesh` returns them.

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
        # no force="mesh": it turns a single mesh into a scene and back, copying and
        # hashing every array (2.5 of 2.9 s for 5.5M triangles); a scene of several
        # geometries is concatenated below, transforms applied
        mesh = trimesh.load(str(path), process=False)
    except Exception as exc:
        raise MeshError(f"{path}: cannot read as a mesh: {type(exc).__name__}: {exc}") from None
    V, F = _trimesh_arrays(mesh, str(path))
    try:
        return validate_mesh(V, F)
    except MeshError as exc:
        raise MeshError(f"{path}: {exc}") from None


# --- the range float32 ray tracing can serve ------------------------------------
def smallest_triangle(tri_lo, tri_hi, valid):
    """The non-degenerate triangle with the smallest box, by its largest side.

    Parameters
    ----------
    tri_lo, tri_hi : (num_triangles, 3) float32
        Triangle boxes (:func:`triangle_bounds`).
    valid : (num_triangles,) bool
        False for degenerate triangles, which are skipped.

    Returns
    -------
    size : float
        ``max(tri_hi[i] - tri_lo[i])`` of that triangle (float32 differences);
        ``inf`` when no triangle is valid.
    index : int
        Its index (the lowest on ties), -1 when none is valid.
    """
    size = (tri_hi - tri_lo).max(axis=1)
    size = np.where(valid, size, np.float32(np.inf))
    if size.size == 0:
        return float("inf"), -1
    index = int(np.argmin(size))
    return float(size[index]), (index if np.isfinite(size[index]) else -1)


def check_trace_range(bounds, smallest_size, triangle=None):
    """Refuse a mesh that float32 ray tracing cannot answer correctly, even scaled.

    Rays meet triangles in scaled space (:mod:`kdtree_gpu.trace.scale`): the
    root box's largest absolute coordinate ``M`` becomes about 1 there, and
    a triangle of size ``h`` has edge functions of about ``(h * s)**2``.
    Both builders call this with the root box before building (the CPU
    builders through :func:`prepare_mesh`, the GPU builder with the box and
    the smallest triangle it reduced on the device).

    Parameters
    ----------
    bounds : (2, 3) array_like of float
        The root box (union of the non-degenerate triangles' boxes).
    smallest_size : float
        The largest side of the smallest non-degenerate triangle's box
        (:func:`smallest_triangle`).
    triangle : int, optional
        That triangle's index, named in the message.

    Raises
    ------
    MeshError
        ``M`` outside ``[2**-100, 2**100)`` (about 7.9e-31 to 1.3e30), or a
        triangle smaller than ``2**-40 / s`` with ``s`` the trace scale (about
        1e-12 times ``M``). The message names the problem and the usable range.
    """
    from .trace.scale import (MAX_COORDINATE, MIN_COORDINATE, MIN_SCALED_TRIANGLE,
                              exponent_of_largest, largest_abs)

    box = np.asarray(bounds, dtype=np.float32).reshape(2, 3)
    largest = largest_abs(box)
    if not (MIN_COORDINATE <= largest < MAX_COORDINATE):
        raise MeshError(
            f"the mesh's largest absolute coordinate is {largest:.6g}, outside the range float32 "
            f"ray tracing serves: [2^-100, 2^100), about [{MIN_COORDINATE:.3g}, "
            f"{MAX_COORDINATE:.3g}); scale the mesh into it")
    scale = 2.0 ** exponent_of_largest(largest)  # trace_scale(box), its box read once
    min_size = MIN_SCALED_TRIANGLE / scale
    if smallest_size < min_size:
        which = f"triangle {triangle}" if triangle is not None and triangle >= 0 else "a triangle"
        raise MeshError(
            f"{which} is too small for float32 ray tracing beside the mesh's largest coordinate "
            f"{largest:.6g}: the largest side of its box is {smallest_size:.6g}; usable triangle "
            f"sizes at this scale are >= {min_size:.6g} (2^-40 of {1 / scale:.6g}, the power "
            f"of two above the largest coordinate), below that their edge functions underflow; "
            f"remove such triangles or trace the small parts as a mesh of their own")

__all__ += ["check_trace_range", "smallest_triangle"]
