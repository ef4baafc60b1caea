"""The kd-tree format shared by every builder: flat node arrays plus the mesh.

Node encoding is defined in :mod:`kdtree_gpu.encoding`. The root is node 0;
the two children of an interior node are adjacent (left, left + 1). Leaf
triangle lists are stored in ascending triangle order, so that two builders
that make the same decisions produce byte-identical leaves.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from .. import encoding as enc
from ..config import SAHConfig
from .check import check_tree, tree_stats
from .compare import compare_trees
from .io import TreeFileError, read_tree_file, save_tree


@dataclasses.dataclass(eq=False)
class KdTree:
    """A kd-tree over a triangle mesh.

    Attributes
    ----------
    node_axis : (num_nodes,) int8
        0, 1, 2: split axis of an interior node; 3 (``AXIS_LEAF``): leaf.
    node_split : (num_nodes,) float32
        Split position of an interior node (0 for leaves).
    node_child : (num_nodes,) int32
        Interior: index of the left child (the right child is ``left + 1``).
        Leaf: offset of its first triangle in ``leaf_tris``.
    node_count : (num_nodes,) int32
        Leaf: number of triangles; interior: 0.
    leaf_tris : (num_refs,) int32
        Triangle indices of all leaves, leaf by leaf, ascending within a leaf.
    bounds : (2, 3) float32
        Box of the root node (union of the non-degenerate triangles' boxes).
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
        The mesh the tree was built from; a saved tree is self-contained.
    config : SAHConfig
        Settings used by the build.
    num_degenerate : int
        Zero-area triangles left out of the tree.
    build_info : dict
        Free-form facts about the build (builder name, device, timings).
    """

    node_axis: np.ndarray
    node_split: np.ndarray
    node_child: np.ndarray
    node_count: np.ndarray
    leaf_tris: np.ndarray
    bounds: np.ndarray
    vertices: np.ndarray
    faces: np.ndarray
    config: SAHConfig
    num_degenerate: int = 0
    build_info: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.node_axis = np.ascontiguousarray(self.node_axis, dtype=enc.NODE_AXIS_DTYPE)
        self.node_split = np.ascontiguousarray(self.node_split, dtype=enc.NODE_SPLIT_DTYPE)
        self.node_child = np.ascontiguousarray(self.node_child, dtype=enc.NODE_CHILD_DTYPE)
        self.node_count = np.ascontiguousarray(self.node_count, dtype=enc.NODE_COUNT_DTYPE)
        self.leaf_tris = np.ascontiguousarray(self.leaf_tris, dtype=enc.LEAF_TRIS_DTYPE)
        self.bounds = np.ascontiguousarray(self.bounds, dtype=np.float32).reshape(2, 3)
        self.vertices = np.ascontiguousarray(self.vertices, dtype=np.float32)
        self.faces = np.ascontiguousarray(self.faces, dtype=np.int32)
        n = self.node_axis.shape[0]
        for name in ("node_split", "node_child", "node_count"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"{name} must have shape ({n},), got {getattr(self, name).shape}")
        if n == 0:
            raise ValueError("a tree needs at least a root node")
        self.num_degenerate = int(self.num_degenerate)
        self._device_cache = {}

    # --- sizes ---------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return int(self.node_axis.shape[0])

    @property
    def num_refs(self) -> int:
        return int(self.leaf_tris.shape[0])

    @property
    def num_triangles(self) -> int:
        return int(self.faces.shape[0])

    def leaf_mask(self) -> np.ndarray:
        """(num_nodes,) bool: True for leaves."""
        return self.node_axis == enc.AXIS_LEAF

    def packed_nodes(self) -> np.ndarray:
        """(num_nodes, 2) int32: the 8-byte traversal layout (see ``encoding``)."""
        return enc.pack_nodes(self.node_axis, self.node_split, self.node_child, self.node_count)

    # --- statistics, invariants (check), comparison (compare) ---------------
    def stats(self) -> dict:
        """Statistics: nodes, leaves, empty leaves, depths, references, SAH cost.

        See :func:`kdtree_gpu.tree.check.tree_stats`.
        """
        return tree_stats(self)

    def check(self) -> None:
        """Raise ``ValueError`` naming the first violated invariant.

        See :func:`kdtree_gpu.tree.check.check_tree`.
        """
        check_tree(self)

    def compare(self, other: "KdTree", atol_split: float = 0.0) -> Optional[str]:
        """Compare two trees from the root down, ignoring node order.

        Returns
        -------
        str or None
            ``None`` when the trees are identical, else a description of the
            first difference (with the path from the root).
        """
        return compare_trees(self, other, atol_split=atol_split)

    # --- files (kdtree_gpu.tree.io) ------------------------------------------
    def save(self, path) -> None:
        """Write the tree to one file atomically (see :mod:`kdtree_gpu.tree.io`)."""
        save_tree(self, path)

    # --- ray queries -----------------------------------------------------------
    def intersect(self, origins, directions, tmin=0.0, tmax=np.inf, device="auto"):
        """Closest hit of each ray.

        Parameters
        ----------
        origins, directions : (num_rays, 3) array_like of float
            NumPy arrays run on the CPU (or on the GPU with ``device="cuda"``,
            results copied back); CuPy and CUDA PyTorch arrays run on the GPU
            and results come back as the same library on the same device.
        tmin, tmax : float or (num_rays,) array_like
            Ray interval; hits with ``tmin <= t <= tmax`` count.
        device : {"auto", "cpu", "cuda"}

        Returns
        -------
        t : (num_rays,) float32
            Distance along the direction (in units of its length); ``inf`` on a miss.
        tri : (num_rays,) int32
            Triangle index, ``-1`` on a miss.
        u, v : (num_rays,) float32
            Barycentrics of the hit (point = (1-u-v) v0 + u v1 + v v2).
        """
        from ..trace import intersect

        return intersect(self, origins, directions, tmin, tmax, device=device)

    def occluded(self, origins, directions, tmin=0.0, tmax=np.inf, device="auto"):
        """Whether each ray hits anything in ``[tmin, tmax]`` (any hit).

        Returns
        -------
        (num_rays,) bool
        """
        from ..trace import occluded

        return occluded(self, origins, directions, tmin, tmax, device=device)


def load_tree(path, check: bool = False) -> KdTree:
    """Read a tree written by :meth:`KdTree.save`.

    Parameters
    ----------
    path : str or os.PathLike
    check : bool
        Also run :meth:`KdTree.check` on the result.

    Returns
    -------
    KdTree

    Raises
    ------
    FileNotFoundError
        No such file.
    TreeFileError
        Not a tree file, unsupported version, truncated file, checksum
        mismatch, or a header that does not describe a tree.
    """
    header, arrays = read_tree_file(path)
    try:
        config = SAHConfig.from_dict(header["config"])
        tree = KdTree(**arrays, config=config, num_degenerate=header["num_degenerate"],
                      build_info=header.get("build_info") or {})
    except (KeyError, TypeError, ValueError) as exc:
        raise TreeFileError(f"{path}: the header does not describe a valid tree: {exc}") from None
    if check:
        tree.check()
    return tree
