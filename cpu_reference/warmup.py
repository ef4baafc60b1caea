"""The CPU builder's one-time compilation message.

:func:`cpu_reference.warm_up` passes the first build's calls on a small mesh
through :func:`kdtree_gpu.warmup.compile_once` (shared with the CPU ray
queries), so that numba compiles (or loads its cache) there, before any
timing, and prints this once when it really compiles.
"""

COMPILE_MESSAGE = "kdtree-gpu: compiling CPU kernels, once per machine (about 30 s)..."
