"""The kd-tree format shared by every builder: flat node arrays plus the mesh.

Node encoding is defined in :mod:`kdtree_gpu.encoding`. The root is node 0;
the two children of an interior node are adjacent (left, left + 1). Leaf
triangle lists are stored in ascending triangle order, so that two builders
that make the same decisions produce byte-identical leaves.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .. import encoding as enc
from ..config import SAHConfig
from .check import check_tree, tree_stats
from .compare import compare_trees
from .io import TreeFileError, read_tree_file, save_tree


# The arrays of a tree and their dtypes (in file order, see .io.ARRAY_NAMES).
ARRAY_DTYPES = {
    "node_axis": enc.NODE_AXIS_DTYPE, "node_split": enc.NODE_SPLIT_DTYPE,
    "node_child": enc.NODE_CHILD_DTYPE, "node_count": enc.NODE_COUNT_DTYPE,
    "leaf_tris": enc.LEAF_TRIS_DTYPE, "bounds": np.float32, "vertices": np.float32,
    "faces": np.int32,
}


def _array_property(name):
    def get(self):
        return self._host_array(name)

    def set(self, value):
        # no shape checks across arrays here: tests and tools change one array
        # at a time, and check() names what is inconsistent
        self._set_arrays({name: value}, check_shapes=False)

    return property(get, set, doc=f"{name} as a NumPy array (made on first host use).")


class KdTree:
    """A kd-tree over a triangle mesh, living where it was built.

    A tree built on a GPU keeps its arrays on that GPU (``tree.device`` is
    ``"cuda:N"``), together with the traversal layout the builder wrote, so
    the first ray query launches the traversal kernel and nothing else.
    Reading an array attribute (``tree.node_axis``), :meth:`stats`,
    :meth:`check`, :meth:`compare` and :meth:`save` make NumPy copies on
    first use and keep them (read-only, so that they cannot drift from the
    device arrays); :meth:`to` copies the tree to another device.

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
        Facts about the build (``builder``, ``device``, ``kernels``, ``seconds``, ...).
    device : str
        Where the arrays live: ``"cpu"`` or ``"cuda:N"``.
    """

    node_axis = _array_property("node_axis")
    node_split = _array_property("node_split")
    node_child = _array_property("node_child")
    node_count = _array_property("node_count")
    leaf_tris = _array_property("leaf_tris")
    bounds = _array_property("bounds")
    vertices = _array_property("vertices")
    faces = _array_property("faces")

    def __init__(self, node_axis, node_split, node_child, node_count, leaf_tris, bounds, vertices,
                 faces, config: SAHConfig, num_degenerate: int = 0,
                 build_info: Optional[dict] = None):
        self._start(config, num_degenerate, build_info)
        self._set_arrays(dict(node_axis=node_axis, node_split=node_split, node_child=node_child,
                              node_count=node_count, leaf_tris=leaf_tris, bounds=bounds,
                              vertices=vertices, faces=faces))

    @classmethod
    def _from_builder(cls, arrays: dict, device: str, config: SAHConfig, num_degenerate: int,
                      build_info: dict, host_bounds=None) -> "KdTree":
        """A tree of a builder's arrays, taken as they are (no checks, no copies).

        For the GPU builder's own output, whose dtypes, shapes and device are
        what :meth:`_set_arrays` would make them (a test holds it to that):
        checking and converting the eight arrays took 0.12 ms of a profiled
        2.3 ms Cornell-box build (cProfile, on an H200 machine).
        ``host_bounds``: the NumPy bounds the builder already read, kept as the
        host copy.
        """
        tree = cls.__new__(cls)
        tree._start(config, num_degenerate, build_info)
        tree._arrays = dict(arrays)
        tree.device = device
        if host_bounds is not None:
            host = np.array(host_bounds, dtype=ARRAY_DTYPES["bounds"]).reshape(2, 3)
            host.flags.writeable = False
            tree._host["bounds"] = host
        return tree

    def _start(self, config: SAHConfig, num_degenerate: int, build_info: Optional[dict]) -> None:
        """Everything but the arrays (both constructors)."""
        self.config = config
        self.num_degenerate = int(num_degenerate)
        self.build_info = {} if build_info is None else build_info
        self._arrays = {}  # name -> array on self.device (NumPy on the CPU, CuPy on a GPU)
        self._host = {}  # name -> NumPy copy of a device array
        self._device_cache = {}  # derived data: traversal layouts per device, ...
        self.device = "cpu"

    def _set_arrays(self, arrays: dict, check_shapes: bool = True) -> None:
        """Replace arrays (all on one device: NumPy, or CuPy on one GPU) and check shapes."""
        from ..arrays import device_of, library

        merged = {**self._arrays, **arrays}
        devices = {str(device_of(a)) for a in merged.values() if library(a) != "numpy"}
        if len(devices) > 1 or (devices and any(library(a) == "numpy"
                                                for a in merged.values())):
            raise ValueError("a KdTree's arrays must all live on one device")
        device = devices.pop() if devices else "cpu"
        for name, value in arrays.items():
            if not check_shapes:
                # stored as given (an assignment): check() names a wrong dtype or shape
                merged[name] = value if device != "cpu" else np.asarray(value)
                continue
            if device == "cpu":
                value = np.ascontiguousarray(value, dtype=ARRAY_DTYPES[name])
            else:
                import cupy

                value = cupy.ascontiguousarray(value, dtype=ARRAY_DTYPES[name])
            if name == "bounds":
                value = value.reshape(2, 3)
            merged[name] = value
        n = merged["node_axis"].shape[0]
        for name in ("node_split", "node_child", "node_count"):
            if check_shapes and merged[name].shape != (n,):
                raise ValueError(f"{name} must have shape ({n},), got {merged[name].shape}")
        if check_shapes and n == 0:
            raise ValueError("a tree needs at least a root node")
        self._arrays = merged
        self.device = device
        for name in arrays:
            self._host.pop(name, None)
        self._device_cache.clear()

    def _host_array(self, name):
        a = self._arrays[name]
        if self.device == "cpu":
            return a
        host = self._host.get(name)
        if host is None:
            host = a.get()
            host.flags.writeable = False
            self._host[name] = host
        return host

    def device_array(self, name: str):
        """Array ``name`` where the tree lives (NumPy on the CPU, CuPy on a GPU); no copy."""
        return self._arrays[name]

    def to(self, device) -> "KdTree":
        """A copy of the tree on ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"``).

        Returns ``self`` when the tree already lives there.
        """
        from ..device import resolve_device

        dev = resolve_device(device)
        if str(dev) == self.device:
            return self
        if dev.is_cuda:
            import cupy

            with dev.use():
                arrays = {name: cupy.asarray(self._host_array(name) if self.device == "cpu"
                                             else a) for name, a in self._arrays.items()}
        else:
            arrays = {name: np.array(self._host_array(name)) for name in self._arrays}
        return KdTree(**arrays, config=self.config, num_degenerate=self.num_degenerate,
                      build_info=dict(self.build_info))

    def __repr__(self) -> str:
        return (f"KdTree({self.num_triangles} triangles, {self.num_nodes} nodes, "
                f"{self.num_refs} references, device={self.device!r})")

    # --- sizes ---------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return int(self._arrays["node_axis"].shape[0])

    @property
    def num_refs(self) -> int:
        return int(self._arrays["leaf_tris"].shape[0])

    @property
    def num_triangles(self) -> int:
        return int(self._arrays["faces"].shape[0])

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

    # --- ray queries (kdtree_gpu.trace) ---------------------------------------
    def intersect(self, origins, directions, tmin=0.0, tmax=np.inf, *, out=None, check=True,
                  device="auto"):
        """Closest hit of each ray.

        Parameters
        ----------
        origins, directions : (num_rays, 3) array_like of float
            NumPy arrays run on the CPU (or on a GPU with ``device="cuda"``);
            CuPy arrays, CUDA PyTorch tensors and other GPU arrays run on
            their GPU and results come back in the same library, on the same
            device, on the caller's stream.
        tmin, tmax : float or (num_rays,) array_like
            Ray interval; hits with ``tmin <= t <= tmax`` count.
        out : tuple of 4 arrays, optional
            Preallocated ``(t, tri, u, v)``.
        check : bool
            Raise ``ValueError`` naming the first bad ray; ``False``: bad rays
            are misses and the GPU path never waits for the GPU.
        device : str
            ``"auto"`` (where the rays are), ``"cpu"``, ``"gpu"``, ``"cuda"``, ``"cuda:N"``.

        Returns
        -------
        t : (num_rays,) float32
            Distance along the direction (in units of its length); ``inf`` on a miss.
        tri : (num_rays,) int32
            Triangle index, ``-1`` on a miss.
        u, v : (num_rays,) float32
            Barycentrics of the hit (point = (1-u-v) v0 + u v1 + v v2).

        See :func:`kdtree_gpu.trace.intersect`.
        """
        from ..trace import intersect

        return intersect(self, origins, directions, tmin, tmax, out=out, check=check,
                         device=device)

    def occluded(self, origins, directions, tmin=0.0, tmax=np.inf, *, out=None, check=True,
                 device="auto"):
        """Whether each ray hits anything in ``[tmin, tmax]`` (any hit).

        Parameters as :meth:`intersect` (``out`` is one bool array).

        Returns
        -------
        (num_rays,) bool
        """
        from ..trace import occluded

        return occluded(self, origins, directions, tmin, tmax, out=out, check=check,
                        device=device)


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
    FileNotFoundError, TreeFileError
        As :func:`kdtree_gpu.tree.io.read_tree_file`, and a header that does
        not describe a tree.
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
