"""Building subtrees on threads and stitching them into one tree.

Once a node is split, the subtrees below its two children are independent:
each needs only its own events. The parallel build therefore treats every
node above a size (``split_above`` triangles) as a small task that splits it
once and hands back its two children as new tasks
(:func:`cpu_reference.subtree.build_subtree` with ``split_once``), and every
smaller node as a task that builds its whole subtree. The tasks run on
``threads`` worker threads (the kernel releases the GIL), largest first, so
that the splits that open up more work come before the subtrees that only
finish it; with one thread the same tasks run in the calling thread.

Which nodes become tasks depends on the mesh and ``split_above`` only, never
on the number of threads or on timing, and the tasks are stitched together in
a fixed order (:func:`assemble`): the same input gives the same arrays,
node for node, with any number of threads.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import queue
import threading
import time

import numpy as np

from kdtree_gpu import encoding as enc

from .subtree import build_subtree

# progress is reported at most this often (seconds): a bar needs no more
PROGRESS_INTERVAL = 0.2


@dataclasses.dataclass(eq=False)
class Subtree:
    """A node whose subtree is still to be built: one task.

    Attributes
    ----------
    key : tuple of int
        Path of child indices (0 left, 1 right) from the first task's node;
        orders the assembly, so that the output does not depend on timing.
    event_pos, event_kind, event_tri : (3, m) float32, int8, int32
        Events holding the node's (shared with its sibling, only read).
    event_start, event_count : (3,) int64
        The node's events on axis k: ``[event_start[k], event_start[k] + event_count[k])``.
    num_tris, depth : int
    box_lo, box_hi : (3,) float32
    weight : float
        The node's share of the whole build, for progress: 1 for the root,
        divided between two children in proportion to their triangles.
    """

    key: tuple
    event_pos: np.ndarray
    event_kind: np.ndarray
    event_tri: np.ndarray
    event_start: np.ndarray
    event_count: np.ndarray
    num_tris: int
    depth: int
    box_lo: np.ndarray
    box_hi: np.ndarray
    weight: float = 1.0


@dataclasses.dataclass(eq=False)
class BuiltSubtree:
    """What a task made: its part of the tree, and the tasks it handed on.

    Attributes
    ----------
    node_axis, node_split, node_child, node_count : (num_nodes,)
        Its nodes, root at 0, ``node_child`` local (see ``build_subtree``).
    leaf_tris : (num_refs,) int32
    children : list of (int, Subtree)
        Exported nodes (local index) and the tasks that build them.
    """

    node_axis: np.ndarray
    node_split: np.ndarray
    node_child: np.ndarray
    node_count: np.ndarray
    leaf_tris: np.ndarray
    children: list


class SubtreeBuilder:
    """Runs :func:`build_subtree` on a task, with work arrays per thread.

    Parameters
    ----------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
    k_traversal, k_intersect, empty_bonus : float
    leaf_size, max_depth : int
    longest_only, clip : bool
    split_above : int
        Tasks with more triangles split once and hand on their children.
    pool_capacity : int
        Passed to the kernel (0: its own choice).
    """

    def __init__(self, vertices, faces, k_traversal, k_intersect, empty_bonus, leaf_size,
                 max_depth, longest_only, clip, split_above, pool_capacity=0):
        self.vertices = vertices
        self.faces = faces
        self.settings = (float(k_traversal), float(k_intersect), float(empty_bonus),
                         int(leaf_size), int(max_depth), bool(longest_only), bool(clip))
        self.clip = bool(clip)
        self.split_above = int(split_above)
        self.pool_capacity = int(pool_capacity)
        self._local = threading.local()

    def _work_arrays(self):
        # indexed by triangle and written before read, so one uninitialised set per
        # thread: 1 byte per triangle, 5 with clipping
        arrays = getattr(self._local, "arrays", None)
        if arrays is None:
            n = self.faces.shape[0]
            arrays = (np.empty(n, dtype=np.int8), np.empty(n if self.clip else 1, dtype=np.int32))
            self._local.arrays = arrays
        return arrays

    def __call__(self, task: Subtree) -> BuiltSubtree:
        """Build ``task``'s node: all of its subtree, or one split for a large one."""
        tri_class, tri_slot = self._work_arrays()
        split_once = task.num_tris > self.split_above
        (node_axis, node_split, node_child, node_count, leaf_tris, export_node, export_start,
         export_count, export_ntris, export_lo, export_hi, pool_pos, pool_kind,
         pool_tri) = build_subtree(
            self.vertices, self.faces, task.event_pos, task.event_kind, task.event_tri,
            task.event_start, task.event_count, int(task.num_tris), int(task.depth),
            task.box_lo, task.box_hi, *self.settings, split_once, self.pool_capacity,
            tri_class, tri_slot)
        children = []
        total = int(export_ntris.sum())
        for e in range(export_node.shape[0]):
            share = export_ntris[e] / total if total else 1.0 / export_node.shape[0]
            children.append((int(export_node[e]), Subtree(
                key=task.key + (e,), event_pos=pool_pos, event_kind=pool_kind,
                event_tri=pool_tri, event_start=export_start[e].copy(),
                event_count=export_count[e].copy(), num_tris=int(export_ntris[e]),
                depth=task.depth + 1, box_lo=export_lo[e].copy(), box_hi=export_hi[e].copy(),
                weight=task.weight * share)))
        return BuiltSubtree(node_axis, node_split, node_child, node_count, leaf_tris, children)


class ProgressReporter:
    """Calls ``callback(fraction)`` with growing fractions, at most every ``interval`` s.

    Parameters
    ----------
    callback : callable or None
        Called with a float in [0, 1]: 0.0 first, 1.0 last, never decreasing.
    interval : float
    """

    def __init__(self, callback, interval=PROGRESS_INTERVAL):
        self.callback = callback
        self.interval = interval
        self.done = 0.0
        self.reported = -1.0
        self.last_time = -math.inf

    def _report(self, fraction):
        fraction = min(max(fraction, self.reported), 1.0)
        self.reported = fraction
        self.last_time = time.perf_counter()
        self.callback(fraction)

    def start(self):
        if self.callback is not None:
            self._report(0.0)

    def add(self, weight):
        """Count ``weight`` more of the build as finished."""
        self.done += weight
        if self.callback is not None and time.perf_counter() - self.last_time >= self.interval:
            # rounding in the weights could pass 1 before the end: keep 1.0 for finish()
            self._report(min(self.done, 0.999))

    def finish(self):
        if self.callback is not None:
            self._report(1.0)


def run_subtrees(root: Subtree, build, threads: int, progress=None,
                 progress_interval=PROGRESS_INTERVAL) -> dict:
    """Build ``root`` and every task it hands on, on ``threads`` threads.

    Parameters
    ----------
    root : Subtree
    build : callable
        ``build(task) -> BuiltSubtree``; thread-safe (:class:`SubtreeBuilder`).
    threads : int
        1 runs every task in the calling thread.
    progress : callable, optional
        See :class:`ProgressReporter`; called from the calling thread only.
        An exception it raises stops the build (tasks already running end
        on their own) and propagates.
    progress_interval : float
        Least time between two progress calls, in seconds.

    Returns
    -------
    dict
        ``{task.key: BuiltSubtree}`` for every task.
    """
    reporter = ProgressReporter(progress, progress_interval)
    reporter.start()
    results = {}
    if threads == 1:
        _run_inline(root, build, results, reporter)
    else:
        _run_threads(root, build, threads, results, reporter)
    reporter.finish()
    return results


def _priority(task: Subtree):
    # largest first; the key breaks ties so that tasks are never compared
    return (-task.num_tris, task.key)


def _finish_task(task, built, results, reporter):
    results[task.key] = built
    # the parent's pools may be freed once its tasks have copied their events
    task.event_pos = task.event_kind = task.event_tri = None
    if not built.children:
        reporter.add(task.weight)
    return [child for _, child in built.children]


def _run_inline(root, build, results, reporter):
    heap = [(_priority(root), root)]
    while heap:
        _, task = heapq.heappop(heap)
        for child in _finish_task(task, build(task), results, reporter):
            heapq.heappush(heap, (_priority(child), child))


def _run_threads(root, build, threads, results, reporter):
    todo = queue.PriorityQueue()
    done = queue.SimpleQueue()

    def work():
        while True:
            _, task = todo.get()
            if task is None:
                return
            try:
                done.put((task, build(task), None))
            except BaseException as exc:  # handed to the calling thread, raised there
                done.put((task, None, exc))

    workers = [threading.Thread(target=work, name=f"cpu_reference-{i}", daemon=True)
               for i in range(threads)]
    for w in workers:
        w.start()
    todo.put((_priority(root), root))
    outstanding = 1
    try:
        while outstanding:
            task, built, exc = done.get()
            outstanding -= 1
            if exc is not None:
                raise exc
            for child in _finish_task(task, built, results, reporter):
                todo.put((_priority(child), child))
                outstanding += 1
    finally:
        # on an error, tasks not started are dropped; running ones end on their own
        try:
            while True:
                todo.get_nowait()
        except queue.Empty:
            pass
        for i in range(len(workers)):
            todo.put(((math.inf, i), None))  # after every task, never equal to another


def assemble(results: dict):
    """Stitch the tasks' subtrees into one tree (rule R10).

    Each task's root takes the place of the empty leaf that its parent task
    left for it; the task's other nodes and its leaf triangles are appended.
    Tasks are laid out depth first in key order, so the result depends only on
    which tasks there were.

    Parameters
    ----------
    results : dict
        From :func:`run_subtrees`; the first task has key ``()``.

    Returns
    -------
    tuple
        ``(node_axis, node_split, node_child, node_count, leaf_tris)``, the
        arrays of :class:`kdtree_gpu.tree.KdTree` (same names and dtypes).
    """
    if len(results) == 1:
        built = results[()]
        return (built.node_axis, built.node_split, built.node_child, built.node_count,
                built.leaf_tris)
    num_nodes = 1 + sum(b.node_axis.shape[0] - 1 for b in results.values())
    num_refs = sum(b.leaf_tris.shape[0] for b in results.values())
    node_axis = np.empty(num_nodes, dtype=np.int8)
    node_split = np.empty(num_nodes, dtype=np.float32)
    node_child = np.empty(num_nodes, dtype=np.int32)
    node_count = np.empty(num_nodes, dtype=np.int32)
    leaf_tris = np.empty(num_refs, dtype=np.int32)
    next_node = 1
    next_ref = 0
    stack = [((), 0)]  # (task key, where its root goes)
    while stack:
        key, root_at = stack.pop()
        built = results[key]
        n = built.node_axis.shape[0]
        # local node 0 -> root_at, local i >= 1 -> next_node + i - 1
        where = np.arange(next_node - 1, next_node - 1 + n, dtype=np.int64)
        where[0] = root_at
        leaf = built.node_axis == enc.AXIS_LEAF
        node_axis[where] = built.node_axis
        node_split[where] = built.node_split
        node_count[where] = built.node_count
        # children are never local node 0, so they land in the appended block
        node_child[where] = np.where(leaf, built.node_child + next_ref,
                                     built.node_child + (next_node - 1))
        leaf_tris[next_ref:next_ref + built.leaf_tris.shape[0]] = built.leaf_tris
        next_ref += built.leaf_tris.shape[0]
        next_node += n - 1
        # right first on the stack, so that the left child's task is laid out first
        for local, child in reversed(built.children):
            stack.append((child.key, int(where[local])))
    return node_axis, node_split, node_child, node_count, leaf_tris
