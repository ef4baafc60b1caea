"""Wald & Havran (2006) O(N log N) SAH kd-tree builder: the entry point.

The build follows "On building fast kd-trees for ray tracing, and on doing
that in O(N log N)" (Wald & Havran, 2006) and the build rules R1-R10 of
:mod:`cpu_reference`:

* events are made and sorted once per axis at the root (section 4.2,
  :mod:`cpu_reference.events`);
* each node sweeps its sorted events on every candidate axis, counting
  ``p-``, ``p|`` and ``p+`` per position, and tries the planar triangles on
  both sides of each plane (section 4.1, :mod:`cpu_reference.sweep`);
* the split classifies every triangle left, right or both with one pass over
  the split axis's events (section 4.4), and splices each axis's events into
  the two children in order, without sorting again; with perfect splits the
  straddling triangles are clipped and only their new events are sorted and
  merged (section 4.3, :mod:`cpu_reference.split`).

Subtrees are built depth first by a compiled kernel
(:mod:`cpu_reference.subtree`); independent subtrees run on several threads
(:mod:`cpu_reference.tasks`). The numba code is compiled, or loaded from
numba's cache, once per process (:mod:`kdtree_gpu.warmup`).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kdtree_gpu.config import SAHConfig
from kdtree_gpu.mesh import prepare_mesh
from kdtree_gpu.tree import KdTree
from kdtree_gpu.warmup import WarmUp, compile_once

from .events import build_root_events
from .tasks import Subtree, SubtreeBuilder, assemble, run_subtrees
from .warmup import COMPILE_MESSAGE

# Nodes with more triangles than this share of the root's are split one task
# at a time, so that the tree is cut into a few hundred independent subtrees
# (enough to keep every thread busy to the end) whatever the thread count.
SUBTREES_SHARE = 1 / 64
# ... but a node this small is always built whole: below it, handing the
# children on costs more than it gains.
SPLIT_ABOVE_MIN = 2048


def build(vertices, faces, config=None, *, threads=None, progress=None) -> KdTree:
    """Build a full-SAH kd-tree on the CPU (the reference builder).

    Parameters
    ----------
    vertices : (num_vertices, 3) array_like of float
    faces : (num_triangles, 3) array_like of int
    config : SAHConfig, optional
        Build settings; ``SAHConfig()`` when omitted.
    threads : int, optional
        Threads that build subtrees side by side; ``None`` uses every core
        this process may run on. The tree is the same, node for node, for
        any number of threads.
    progress : callable, optional
        ``progress(fraction)``, called from the calling thread with a float
        in [0, 1] that never decreases: 0.0 first, 1.0 last, and in between
        at most every 0.2 s the share of the build finished (subtrees done,
        weighted by their triangles).

    Returns
    -------
    KdTree
        ``build_info`` holds ``builder="cpu_reference"``, ``threads``,
        ``seconds`` (mesh preparation and build, without compilation),
        ``build_seconds`` (the build alone), ``compile_seconds`` (compiling
        or loading the numba code, 0 after the first build in a process),
        ``compiled`` (whether that compiled), ``subtrees`` (tasks run) and
        ``max_depth`` (the resolved depth limit).

    Raises
    ------
    kdtree_gpu.MeshError
        Bad input mesh (see :func:`kdtree_gpu.mesh.prepare_mesh`).
    TypeError
        ``config`` is not an :class:`SAHConfig`, or ``threads`` not an int.
    ValueError
        ``threads`` < 1.
    """
    config = resolve_config(config)
    threads = resolve_threads(threads)
    start = time.perf_counter()
    V, F, tri_lo, tri_hi, valid, bounds = prepare_mesh(vertices, faces)
    prepare_seconds = time.perf_counter() - start
    # after the mesh checks, so that a bad mesh fails before a long first compile
    compile_seconds, compiled = warm_up()
    num_valid = int(np.count_nonzero(valid))
    max_depth = config.resolved_max_depth(num_valid)
    start = time.perf_counter()
    arrays, num_subtrees = _build_arrays(
        V, F, tri_lo, tri_hi, valid, bounds,
        config.k_traversal, config.k_intersect, config.empty_bonus,
        config.leaf_size, max_depth, config.axes == "longest", config.clip,
        threads=threads, progress=progress)
    build_seconds = time.perf_counter() - start
    node_axis, node_split, node_child, node_count, leaf_tris = arrays
    return KdTree(
        node_axis=node_axis, node_split=node_split, node_child=node_child,
        node_count=node_count, leaf_tris=leaf_tris, bounds=bounds,
        vertices=V, faces=F, config=config,
        num_degenerate=int(F.shape[0] - num_valid),
        build_info={"builder": "cpu_reference", "threads": threads,
                    "seconds": prepare_seconds + build_seconds,
                    "build_seconds": build_seconds, "compile_seconds": compile_seconds,
                    "compiled": compiled, "subtrees": num_subtrees, "max_depth": max_depth},
    )


def warm_up() -> WarmUp:
    """Compile, or load from numba's cache, every kernel the builder calls.

    The first call in a process builds two small trees (without and with
    perfect splits) through the same calls as :func:`build` and prints
    :data:`cpu_reference.warmup.COMPILE_MESSAGE` on stderr before numba
    starts compiling, if it has to; later calls return at once.
    :func:`build` calls it, so call it yourself only to keep compilation out
    of a measurement.

    Returns
    -------
    WarmUp
        ``(seconds, compiled)``.
    """
    return compile_once(_build_small_trees, name="builder", package="cpu_reference",
                        message=COMPILE_MESSAGE)


def _build_small_trees():
    # the build's own code path, on a mesh big enough to split into tasks: the
    # kernels see the argument types of a real build and compile for exactly those
    rng = np.random.default_rng(0)
    centres = rng.uniform(0.0, 1.0, size=(24, 1, 3))
    vertices = (centres + 0.1 * rng.uniform(-1.0, 1.0, size=(24, 3, 3))).reshape(-1, 3)
    faces = np.arange(vertices.shape[0]).reshape(-1, 3)
    V, F, tri_lo, tri_hi, valid, bounds = prepare_mesh(vertices, faces)
    config = SAHConfig()
    for clip in (False, True):
        _build_arrays(V, F, tri_lo, tri_hi, valid, bounds, config.k_traversal,
                      config.k_intersect, config.empty_bonus, config.leaf_size,
                      config.resolved_max_depth(F.shape[0]), False, clip, threads=1,
                      split_above=8)


def resolve_config(config) -> SAHConfig:
    """Return ``config``, or the default settings for ``None``."""
    if config is None:
        return SAHConfig()
    if not isinstance(config, SAHConfig):
        raise TypeError(f"config must be a kdtree_gpu.SAHConfig or None, got {type(config).__name__}")
    return config


def resolve_threads(threads) -> int:
    """Return ``threads``, or for ``None`` the cores this process may run on.

    The affinity mask, where the system has one, rather than
    ``os.cpu_count()``: a container or ``taskset`` may allow fewer cores
    than the machine has.
    """
    if threads is None:
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            return max(1, os.cpu_count() or 1)
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads must be an int or None, got {type(threads).__name__}")
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    return int(threads)


def default_split_above(num_tris: int) -> int:
    """Triangles above which a node is split as a task of its own.

    Depends on the mesh only (not on the thread count), so that every thread
    count cuts the tree into the same subtrees and gives the same arrays.
    """
    return max(SPLIT_ABOVE_MIN, int(num_tris * SUBTREES_SHARE))


def build_arrays(vertices, faces, tri_lo, tri_hi, valid, bounds, k_traversal, k_intersect,
                 empty_bonus, leaf_size, max_depth, longest_only, clip, pool_capacity=0, *,
                 threads=1, split_above=None, progress=None):
    """Run the compiled build on prepared mesh arrays.

    Parameters
    ----------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
    tri_lo, tri_hi : (num_triangles, 3) float32
    valid : (num_triangles,) bool
    bounds : (2, 3) float32
    k_traversal, k_intersect, empty_bonus : float
    leaf_size, max_depth : int
    longest_only, clip : bool
    pool_capacity : int
        Initial events per axis in each subtree's event pools (they grow as
        needed); 0 lets the kernel choose. Tests use a small value to
        exercise the growth.
    threads : int
        Worker threads (1: the calling thread only).
    split_above : int, optional
        Nodes with more triangles are split one task at a time
        (:func:`default_split_above` when omitted). Any value gives the same
        tree; tests use small ones to make many tasks.
    progress : callable, optional
        As in :func:`build`.

    Returns
    -------
    tuple
        The tree's arrays, as from :func:`.tasks.assemble`.
    """
    arrays, _ = _build_arrays(
        vertices, faces, tri_lo, tri_hi, valid, bounds, k_traversal, k_intersect, empty_bonus,
        leaf_size, max_depth, longest_only, clip, pool_capacity, threads=threads,
        split_above=split_above, progress=progress)
    return arrays


def _build_arrays(vertices, faces, tri_lo, tri_hi, valid, bounds, k_traversal, k_intersect,
                  empty_bonus, leaf_size, max_depth, longest_only, clip, pool_capacity=0, *,
                  threads=1, split_above=None, progress=None):
    """:func:`build_arrays`, and the number of tasks it ran."""
    num_valid = int(np.count_nonzero(valid))
    if split_above is None:
        split_above = default_split_above(num_valid)
    if num_valid <= split_above:
        threads = 1  # one task: starting threads would cost more than the whole build
    event_pos, event_kind, event_tri, event_count = sorted_root_events(
        tri_lo, tri_hi, valid, threads)
    bounds = np.ascontiguousarray(bounds, dtype=np.float32)
    root = Subtree(key=(), event_pos=event_pos, event_kind=event_kind, event_tri=event_tri,
                   event_start=np.zeros(3, dtype=np.int64), event_count=event_count,
                   num_tris=num_valid, depth=0, box_lo=bounds[0].copy(),
                   box_hi=bounds[1].copy())
    del event_pos, event_kind, event_tri  # the first task frees them once copied
    builder = SubtreeBuilder(vertices, faces, k_traversal, k_intersect, empty_bonus, leaf_size,
                             max_depth, longest_only, clip, split_above, pool_capacity)
    results = run_subtrees(root, builder, threads, progress)
    return assemble(results), len(results)


def sorted_root_events(tri_lo, tri_hi, valid, threads=1):
    """The root's events, sorted, one row per axis (rule R3, Wald & Havran §4.2).

    Parameters
    ----------
    tri_lo, tri_hi : (num_triangles, 3) float32
    valid : (num_triangles,) bool
    threads : int
        The three axes are sorted on up to three threads.

    Returns
    -------
    event_pos, event_kind, event_tri : (3, max_events) float32, int8, int32
        Axis k's events in ``[k, :event_count[k]]``.
    event_count : (3,) int64
    """
    if threads > 1:
        with ThreadPoolExecutor(min(threads, 3)) as pool:
            per_axis = list(pool.map(lambda k: build_root_events(tri_lo, tri_hi, valid, k),
                                     range(3)))
    else:
        per_axis = [build_root_events(tri_lo, tri_hi, valid, k) for k in range(3)]
    event_count = np.array([p.shape[0] for p, _, _ in per_axis], dtype=np.int64)
    m = int(event_count.max())
    event_pos = np.empty((3, m), dtype=np.float32)
    event_kind = np.empty((3, m), dtype=np.int8)
    event_tri = np.empty((3, m), dtype=np.int32)
    for k, (pos, kind, tri) in enumerate(per_axis):
        event_pos[k, :pos.shape[0]] = pos
        event_kind[k, :pos.shape[0]] = kind
        event_tri[k, :pos.shape[0]] = tri
    return event_pos, event_kind, event_tri, event_count
