"""kdtree-gpu: full-SAH kd-trees for triangle meshes, built on the GPU.

Quick use::

    import kdtree_gpu as kd
    V, F = kd.load_mesh("stanford_bunny.ply")      # or kd.scenes.cornell_box()
    tree = kd.build(V, F)                          # GPU when usable, else CPU
    t, tri, u, v = tree.intersect(origins, directions)

``import kdtree_gpu`` needs neither CuPy nor a GPU; GPU work is asked for
explicitly (``device="cuda"``) or chosen by ``device="auto"`` when usable.
"""

from importlib import import_module

from .config import SAHConfig
from .mesh import MeshError
from .tree import KdTree

__version__ = "0.1.0"

# Public names resolved on first use, so that importing the package stays
# cheap (numba compiles, CuPy loads only when asked for).
_LAZY = {
    "build": ("kdtree_gpu.builder", "build"),
    "build_many": ("kdtree_gpu.batch", "build_many"),
    "GpuSettings": ("kdtree_gpu.builder", "GpuSettings"),
    "load_mesh": ("kdtree_gpu.mesh", "load_mesh"),
    "mesh_dir": ("kdtree_gpu.mesh", "mesh_dir"),
    "load_tree": ("kdtree_gpu.tree", "load_tree"),
    "TreeFileError": ("kdtree_gpu.tree", "TreeFileError"),
    "scenes": ("kdtree_gpu.scenes", None),
    "gpu_available": ("kdtree_gpu.device", "gpu_available"),
    # not "render": that name is the kdtree_gpu.render module, which
    # ``from kdtree_gpu import render`` must keep returning
    "Renderer": ("kdtree_gpu.render", "Renderer"),
}


def __getattr__(name):
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'kdtree_gpu' has no attribute {name!r}") from None
    module = import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


__all__ = ["SAHConfig", "KdTree", "MeshError", *_LAZY]
