"""The builder: ``kd.build`` and the level-by-level pipeline it runs.

The folders follow the pipeline:

* :mod:`.api`: ``build()``: check the input, choose the builder (the CPU
  reference, the level pipeline on NumPy or CuPy, the CUDA drivers), one
  result type (:class:`~kdtree_gpu.KdTree`);
* :mod:`.soa`: the structures of arrays of a level (events, references,
  nodes), declared once, and the structs the CUDA kernels take;
* :mod:`.stages`: the stage functions on ``xp`` arrays: the method as NumPy
  code, and the readable specification of the kernels;
* :mod:`.pipeline`: the level loop over the stage functions;
* :mod:`.gpu`: the CUDA drivers (root preparation, the level-loop kernel,
  one launch per stage, the tree output);
* :mod:`.settings`: how the GPU drivers run their levels.
"""

from .api import KERNEL_CHOICES, MAX_TRIANGLES, build
from .settings import GpuSettings, default_loop_capacity

__all__ = ["GpuSettings", "KERNEL_CHOICES", "MAX_TRIANGLES", "build", "default_loop_capacity"]
