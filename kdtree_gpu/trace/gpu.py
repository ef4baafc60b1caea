"""GPU ray queries: kd-tree traversal and the brute-force oracle (CuPy).

These are the CUDA backends behind :mod:`kdtree_gpu.trace`, which checks
the user's input, converts it and calls the functions below with CuPy
arrays. The kernels live in ``kdtree_gpu/cuda/traverse.cu`` (kd-tree),
``brute.cu`` (every triangle) and ``watertight.cuh`` (the ray-triangle test
of Woop, Benthin and Wald 2013, the same as in :mod:`kdtree_gpu.trace.cpu`).

Device layout of a tree (:func:`upload_tree`, cached on the tree)
------------------------------------------------------------------
``nodes``  (num_nodes, 2) int32   the packed 8-byte nodes
                                  (:meth:`KdTree.packed_nodes`), read as one
                                  ``int2`` load per node
``tris``   (3 * num_refs, 4) float32  the three vertices of every leaf
                                  reference in ``leaf_tris`` order, one
                                  ``float4`` each, so that a leaf's triangles
                                  are contiguous 16-byte loads; the first
                                  vertex's ``w`` holds the triangle id (int32
                                  bits)

Ray conventions
---------------
A ray is ``origin + t * direction``; a hit counts when ``tmin <= t <= tmax``
(``t`` in units of the direction's length). Closest hit returns the smallest
``t``, and on equal ``t`` the lowest triangle id. Triangles are two-sided.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..config import MAX_DEPTH_CAP
from ..launch import launch
from ..mesh import degenerate_mask, validate_mesh

TRAVERSE_SOURCE = "traverse.cu"
BRUTE_SOURCE = "brute.cu"
# Threads per block; also passed to the kernels' __launch_bounds__.
TRAVERSE_BLOCK = 128
BRUTE_BLOCK = 128
# The traversal stack holds at most one entry per level below the root.
MAX_STACK = MAX_DEPTH_CAP


@dataclasses.dataclass
class DeviceTree:
    """A tree's traversal data on one GPU (see the module docstring).

    Attributes
    ----------
    nodes : (num_nodes, 2) cupy int32
    tris : (3 * num_refs, 4) cupy float32
    bounds : (2, 3) numpy float32
        Root box, passed to the kernels as six scalars.
    depth : int
        Deepest node (root = 0); the stack needs ``depth`` entries.
    device_id : int
    """

    nodes: object
    tris: object
    bounds: np.ndarray
    depth: int
    device_id: int

    def box_args(self) -> tuple:
        """The root box as the kernels' six ``float`` arguments (lo xyz, hi xyz)."""
        return tuple(np.float32(x) for x in self.bounds.reshape(-1))


def pack_triangles(vertices, faces, tri_ids) -> np.ndarray:
    """Gather triangles into the 16-byte-aligned layout of the kernels.

    Parameters
    ----------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
    tri_ids : (k,) int32
        Triangles to pack, in the order the kernels will read them (a tree's
        ``leaf_tris``, or ascending ids for the brute force).

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


def tree_depth(tree) -> int:
    """Depth of the deepest node of ``tree`` (root = 0).

    Returns
    -------
    int
    """
    from ..tree.check import walk_levels

    node_depth = walk_levels(tree)[0]
    return int(node_depth.max())


def upload_tree(tree) -> DeviceTree:
    """Copy a tree's traversal data to the current GPU, once per device.

    The result is cached in ``tree._device_cache`` under the device id, so
    repeated queries on the same tree upload nothing.

    Parameters
    ----------
    tree : KdTree

    Returns
    -------
    DeviceTree

    Raises
    ------
    ValueError
        The tree is deeper than the traversal stack (``MAX_STACK`` levels).
    """
    import cupy

    device_id = cupy.cuda.runtime.getDevice()
    cached = tree._device_cache.get(device_id)
    if isinstance(cached, DeviceTree):
        return cached
    depth = tree_depth(tree)
    if depth > MAX_STACK:
        raise ValueError(f"tree depth {depth} exceeds the traversal stack of {MAX_STACK} levels "
                         f"(kdtree_gpu.config.MAX_DEPTH_CAP)")
    device_tree = DeviceTree(
        nodes=cupy.asarray(tree.packed_nodes()),
        tris=cupy.asarray(pack_triangles(tree.vertices, tree.faces, tree.leaf_tris)),
        bounds=np.ascontiguousarray(tree.bounds, dtype=np.float32).reshape(2, 3),
        depth=depth,
        device_id=device_id,
    )
    tree._device_cache[device_id] = device_tree
    return device_tree


def intersect_gpu(tree, origins, directions, tmin, tmax):
    """Closest hit of each ray by kd-tree traversal on the GPU.

    Parameters
    ----------
    tree : KdTree
    origins, directions : (num_rays, 3) cupy float32, C-contiguous
    tmin, tmax : (num_rays,) cupy float32

    Returns
    -------
    t : (num_rays,) cupy float32
        ``inf`` on a miss.
    tri : (num_rays,) cupy int32
        Triangle id, ``-1`` on a miss.
    u, v : (num_rays,) cupy float32
        Barycentrics of ``v1`` and ``v2`` (0 on a miss).
    """
    return _trace(tree, origins, directions, tmin, tmax, any_hit=False, counted=False)


def occluded_gpu(tree, origins, directions, tmin, tmax):
    """Whether each ray hits any triangle with ``tmin <= t <= tmax`` (kd-tree, GPU).

    Parameters
    ----------
    tree : KdTree
    origins, directions : (num_rays, 3) cupy float32, C-contiguous
    tmin, tmax : (num_rays,) cupy float32

    Returns
    -------
    hit : (num_rays,) cupy bool
    """
    return _trace(tree, origins, directions, tmin, tmax, any_hit=True, counted=False)[0]


def intersect_counted_gpu(tree, origins, directions, tmin, tmax):
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
    return _trace(tree, origins, directions, tmin, tmax, any_hit=False, counted=True)


def occluded_counted_gpu(tree, origins, directions, tmin, tmax):
    """:func:`occluded_gpu` plus per-ray work counts.

    Returns
    -------
    hit : (num_rays,) cupy bool
    ray_nodes, ray_tests : (num_rays,) cupy int32
    """
    return _trace(tree, origins, directions, tmin, tmax, any_hit=True, counted=True)


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
def _traverse_kernel(name):
    from ..kernels import get_function

    options = (f"-DKD_TRAVERSE_BLOCK={TRAVERSE_BLOCK}", f"-DKD_MAX_STACK={MAX_STACK}")
    return get_function(TRAVERSE_SOURCE, name, options=options)


def _brute_kernel(name):
    from ..kernels import get_function

    return get_function(BRUTE_SOURCE, name, options=(f"-DKD_BRUTE_BLOCK={BRUTE_BLOCK}",))


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


def _trace(tree, origins, directions, tmin, tmax, any_hit, counted):
    import cupy

    num_rays = _check_rays(origins, directions, tmin, tmax)
    device_tree = upload_tree(tree)
    name = "kd_intersect_any" if any_hit else "kd_intersect_closest"
    if counted:
        name += "_counted"
    kernel = _traverse_kernel(name)
    if any_hit:
        outputs = (cupy.empty(num_rays, dtype=cupy.bool_),)
    else:
        outputs = (cupy.empty(num_rays, dtype=cupy.float32), cupy.empty(num_rays, dtype=cupy.int32),
                   cupy.empty(num_rays, dtype=cupy.float32), cupy.empty(num_rays, dtype=cupy.float32))
    if counted:
        outputs += (cupy.empty(num_rays, dtype=cupy.int32), cupy.empty(num_rays, dtype=cupy.int32))
    args = (device_tree.nodes, device_tree.tris, *device_tree.box_args(), origins, directions,
            tmin, tmax, np.int32(num_rays), *outputs)
    description = ("trace any hit" if any_hit else "trace closest hit") + (" counted" if counted else "")
    launch(description, kernel, num_rays, args, block=TRAVERSE_BLOCK)
    return outputs


def _brute(vertices, faces, origins, directions, tmin, tmax, any_hit):
    import cupy

    num_rays = _check_rays(origins, directions, tmin, tmax)
    V, F = validate_mesh(vertices, faces)
    tri_ids = np.flatnonzero(~degenerate_mask(V, F)).astype(np.int32)
    tris = cupy.asarray(pack_triangles(V, F, tri_ids))
    name = "kd_brute_any" if any_hit else "kd_brute_closest"
    kernel = _brute_kernel(name)
    if any_hit:
        outputs = (cupy.empty(num_rays, dtype=cupy.bool_),)
    else:
        outputs = (cupy.empty(num_rays, dtype=cupy.float32), cupy.empty(num_rays, dtype=cupy.int32),
                   cupy.empty(num_rays, dtype=cupy.float32), cupy.empty(num_rays, dtype=cupy.float32))
    args = (tris, np.int32(tri_ids.shape[0]), origins, directions, tmin, tmax, np.int32(num_rays),
            *outputs)
    launch("brute-force " + ("any hit" if any_hit else "closest hit"), kernel, num_rays, args,
           block=BRUTE_BLOCK)
    return outputs
