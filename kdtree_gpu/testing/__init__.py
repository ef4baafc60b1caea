"""Test helpers of the package, as ``numpy.testing`` and ``cupy.testing``.

* :mod:`.rays`: random test rays relative to a mesh and the comparison of two
  ray answers (``kdtree-gpu verify`` and ``demo``, the tests, the benchmark
  checks);
* :mod:`.meshes`: small scenes that reach every build rule (hand-made
  triangles, random soups, grid coordinates, axis-aligned quads, duplicates,
  degenerate triangles, needles through clouds), build settings that reach
  every rule, and the tree comparison the builder tests share.
"""

from .rays import HIT_RTOL, HitComparison, Rays, assert_same_hits, compare_hits, random_rays

__all__ = ["HIT_RTOL", "HitComparison", "Rays", "assert_same_hits", "compare_hits",
           "random_rays"]
