"""Parallel primitives of the level-by-level builder, for CuPy and NumPy: one interface.

Every function takes CuPy or NumPy arrays and returns arrays of the same
kind (``xp = get_xp(...)``); the NumPy path is the CPU fallback and the test
oracle of the CuPy path. CuPy built-ins (CUB/Thrust sorts, binary
searches, ``nonzero``, float scans) come first; the custom kernels in
``kdtree_gpu/cuda/primitives.cu`` cover what has no exact built-in (the
segmented min / max / argmin: CuPy's ``atomicMin(double*)`` rounds through
float32) and what a measurement said was faster (the int64 scan, see
:mod:`.scan`). The builder's CUDA stage kernels are fused forms of these
primitives (``cuda/scan.cuh`` is the block scan of both).

Modules: :mod:`.scan` (prefix sums), :mod:`.keys` (order-preserving float
keys), :mod:`.segmented` (segment ids, reductions, arg-min), :mod:`.sort`
(radix sort, binary search, also within segments, compaction).

Segments
--------
Segments are given by ``offsets : (num_segments + 1,)`` with ``offsets[0] ==
0``, ``offsets[-1] == n`` and ``offsets`` non-decreasing: segment ``s`` is
``values[offsets[s]:offsets[s + 1]]``; empty segments are allowed. The NumPy
path checks these conditions; the CuPy path checks only shapes (a check of
the contents would read device memory, a synchronization).

Synchronization
---------------
Only :func:`compact` and :func:`compact_indices` read from the device (the
count that sizes their output). Everything else is launched asynchronously.
"""

from .keys import float_to_ordered_uint, ordered_uint_to_float
from .scan import (exclusive_scan, inclusive_scan, inclusive_scan_in_place,
                   segmented_scan, tile_scan)
from .segmented import REDUCE_OPS, segment_ids, segmented_argmin, segmented_reduce
from .sort import (compact, compact_indices, lower_bound, radix_sort, segmented_lower_bound,
                   upper_bound)

__all__ = ["REDUCE_OPS", "compact", "compact_indices", "exclusive_scan", "float_to_ordered_uint",
           "inclusive_scan", "inclusive_scan_in_place", "lower_bound",
           "ordered_uint_to_float", "radix_sort", "segment_ids", "segmented_argmin",
           "segmented_lower_bound", "segmented_reduce", "segmented_scan", "tile_scan",
           "upper_bound"]
