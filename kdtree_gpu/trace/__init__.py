"""Ray queries against a kd-tree: the public API (:mod:`.api`), the CPU
traversal (:mod:`.cpu`, numba) and the GPU traversal (:mod:`.gpu`, CUDA).

Both backends follow the same ray conventions and the same watertight
ray-triangle test, so they decide alike; each has a brute-force oracle.
"""

from .api import check_rays, intersect, intersect_brute, occluded, occluded_brute

__all__ = ["check_rays", "intersect", "intersect_brute", "occluded", "occluded_brute"]
