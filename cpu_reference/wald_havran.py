"""Wald & Havran (2006) O(N log N) SAH kd-tree builder, compiled with numba.

The build follows "On building fast kd-trees for ray tracing, and on doing
that in O(N log N)" (Wald & Havran, 2006) and the build rules R1-R10 of
:mod:`cpu_reference`:

* events are made and sorted once per axis at the root (section 4.2);
* each node sweeps its sorted events on every candidate axis, counting
  ``p-``, ``p|`` and ``p+`` per position, and tries the planar triangles on
  both sides of each plane (section 4.1);
* the split classifies every triangle left, right or both with one pass over
  the split axis's events (section 4.4), and splices each axis's events into
  the two children in order, without sorting again; with perfect splits the
  straddling triangles are clipped and only their new events are sorted and
  merged (section 4.3).

The build is depth first with an explicit stack. Events live in one pool per
axis (``pos`` float32, ``kind`` int8, ``tri`` int32) used as a stack: a
node's events are the top segment of each pool, and a split writes the left
child's events in place and the right child's right after them.
"""

from __future__ import annotations

import time

import numba
import numpy as np

from kdtree_gpu import config as cfg
from kdtree_gpu import encoding as enc
from kdtree_gpu.config import SAHConfig
from kdtree_gpu.mesh import prepare_mesh
from kdtree_gpu.tree import KdTree

from .clip import POLY_BUFFER_SHAPE, clip_child_box_into
from .events import event_less, make_events, sort_events

# The cost model is written once (kdtree_gpu.config); compile it, do not retype it.
split_cost = numba.njit(cache=True)(cfg.split_cost)
leaf_cost = numba.njit(cache=True)(cfg.leaf_cost)
box_half_area = numba.njit(cache=True)(cfg.box_half_area)

_STACK_SIZE = 2 * (cfg.MAX_DEPTH_CAP + 4)


def build(vertices, faces, config=None) -> KdTree:
    """Build a full-SAH kd-tree on the CPU (the reference builder).

    Parameters
    ----------
    vertices : (num_vertices, 3) array_like of float
    faces : (num_triangles, 3) array_like of int
    config : SAHConfig, optional
        Build settings; ``SAHConfig()`` when omitted.

    Returns
    -------
    KdTree
        ``build_info`` holds ``builder="cpu_reference"`` and the build time
        in seconds (``build_seconds``, excluding mesh validation).

    Raises
    ------
    kdtree_gpu.MeshError
        Bad input mesh (see :func:`kdtree_gpu.mesh.prepare_mesh`).
    TypeError
        ``config`` is not an :class:`SAHConfig`.
    """
    config = resolve_config(config)
    V, F, tri_lo, tri_hi, valid, bounds = prepare_mesh(vertices, faces)
    num_valid = int(np.count_nonzero(valid))
    max_depth = config.resolved_max_depth(num_valid)
    start = time.perf_counter()
    node_axis, node_split, node_child, node_count, leaf_tris = build_arrays(
        V, F, tri_lo, tri_hi, valid, bounds,
        config.k_traversal, config.k_intersect, config.empty_bonus,
        config.leaf_size, max_depth, config.axes == "longest", config.clip,
    )
    seconds = time.perf_counter() - start
    return KdTree(
        node_axis=node_axis, node_split=node_split, node_child=node_child,
        node_count=node_count, leaf_tris=leaf_tris, bounds=bounds,
        vertices=V, faces=F, config=config,
        num_degenerate=int(F.shape[0] - num_valid),
        build_info={"builder": "cpu_reference", "build_seconds": seconds,
                    "max_depth": max_depth},
    )


def resolve_config(config) -> SAHConfig:
    """Return ``config``, or the default settings for ``None``."""
    if config is None:
        return SAHConfig()
    if not isinstance(config, SAHConfig):
        raise TypeError(f"config must be a kdtree_gpu.SAHConfig or None, got {type(config).__name__}")
    return config


def build_arrays(vertices, faces, tri_lo, tri_hi, valid, bounds, k_traversal, k_intersect,
                 empty_bonus, leaf_size, max_depth, longest_only, clip, pool_capacity=0):
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
        Initial events per axis in the event pools (they grow as needed);
        0 chooses three times the root's events. Tests use a small value to
        exercise the growth.

    Returns
    -------
    node_axis : (num_nodes,) int8
    node_split : (num_nodes,) float32
    node_child : (num_nodes,) int32
    node_count : (num_nodes,) int32
    leaf_tris : (num_refs,) int32
    """
    return _build(
        vertices, faces, tri_lo, tri_hi, valid, np.ascontiguousarray(bounds, dtype=np.float32),
        float(k_traversal), float(k_intersect), float(empty_bonus),
        int(leaf_size), int(max_depth), bool(longest_only), bool(clip), int(pool_capacity),
    )


@numba.njit(cache=True)
def build_root_events(tri_lo, tri_hi, valid, axis):
    """Sorted root events of one axis (rule R3).

    Parameters
    ----------
    tri_lo, tri_hi : (num_triangles, 3) float32
    valid : (num_triangles,) bool
    axis : int

    Returns
    -------
    event_pos : (num_events,) float32
    event_kind : (num_events,) int8
    event_tri : (num_events,) int32
    """
    tri_ids = np.nonzero(valid)[0].astype(np.int32)
    box_lo = tri_lo[tri_ids]
    box_hi = tri_hi[tri_ids]
    n = tri_ids.shape[0]
    event_pos = np.empty(2 * n, dtype=np.float32)
    event_kind = np.empty(2 * n, dtype=np.int8)
    event_tri = np.empty(2 * n, dtype=np.int32)
    m = make_events(tri_ids, box_lo, box_hi, axis, event_pos, event_kind, event_tri)
    event_pos = event_pos[:m].copy()
    event_kind = event_kind[:m].copy()
    event_tri = event_tri[:m].copy()
    sort_events(event_pos, event_kind, event_tri)
    return event_pos, event_kind, event_tri


@numba.njit(cache=True)
def find_best_plane(pool_pos, pool_kind, seg_start, seg_count, num_tris, node_lo, node_hi,
                    k_traversal, k_intersect, empty_bonus, longest_only):
    """Sweep the node's events and return the best plane (rules R5-R8).

    Parameters
    ----------
    pool_pos : (3, capacity) float32
    pool_kind : (3, capacity) int8
        Event pools; the node's events on axis k are
        ``[seg_start[k], seg_start[k] + seg_count[k])``.
    seg_start, seg_count : (3,) int64
    num_tris : int
        Triangles in the node, N.
    node_lo, node_hi : (3,) float32
        The node's box.

    Returns
    -------
    best_cost : float
        ``inf`` when there is no candidate plane.
    best_axis : int
    best_pos : float32
    best_side : int
        ``SIDE_LEFT`` or ``SIDE_RIGHT``: where planar triangles on the plane go.
    """
    # scalars, not small arrays: this runs once per node and must not allocate
    ext0 = np.float64(node_hi[0]) - np.float64(node_lo[0])
    ext1 = np.float64(node_hi[1]) - np.float64(node_lo[1])
    ext2 = np.float64(node_hi[2]) - np.float64(node_lo[2])
    area_node = box_half_area(ext0, ext1, ext2)
    axis_first = 0
    axis_last = 2
    if longest_only:
        longest = 0
        if ext1 > ext0:
            longest = 1
        if ext2 > (ext1 if longest == 1 else ext0):
            longest = 2
        axis_first = longest
        axis_last = longest
    best_cost = np.inf
    best_axis = -1
    best_pos = np.float32(0.0)
    best_side = enc.SIDE_LEFT
    for k in range(axis_first, axis_last + 1):
        lo_k = node_lo[k]
        hi_k = node_hi[k]
        if not lo_k < hi_k:
            continue
        n_left = 0
        n_right = num_tris
        i = seg_start[k]
        end = i + seg_count[k]
        pos = pool_pos[k]
        kind = pool_kind[k]
        while i < end:
            p = pos[i]
            n_end = 0
            n_planar = 0
            n_start = 0
            while i < end and pos[i] == p and kind[i] == enc.EVENT_END:
                n_end += 1
                i += 1
            while i < end and pos[i] == p and kind[i] == enc.EVENT_PLANAR:
                n_planar += 1
                i += 1
            while i < end and pos[i] == p and kind[i] == enc.EVENT_START:
                n_start += 1
                i += 1
            # move the plane onto p: triangles ending at p or lying on it leave the right side
            n_right -= n_end + n_planar
            if lo_k < p and p < hi_k:
                d_left = np.float64(p) - np.float64(lo_k)
                d_right = np.float64(hi_k) - np.float64(p)
                if k == 0:
                    area_left = box_half_area(d_left, ext1, ext2)
                    area_right = box_half_area(d_right, ext1, ext2)
                elif k == 1:
                    area_left = box_half_area(ext0, d_left, ext2)
                    area_right = box_half_area(ext0, d_right, ext2)
                else:
                    area_left = box_half_area(ext0, ext1, d_left)
                    area_right = box_half_area(ext0, ext1, d_right)
                # planar triangles on the plane: try them on each side (Wald & Havran §4.1)
                cost_left = split_cost(k_traversal, k_intersect, empty_bonus, area_left,
                                       area_right, area_node, n_left + n_planar, n_right)
                cost_right = split_cost(k_traversal, k_intersect, empty_bonus, area_left,
                                        area_right, area_node, n_left, n_right + n_planar)
                if cost_left <= cost_right:
                    cost = cost_left
                    side = enc.SIDE_LEFT
                else:
                    cost = cost_right
                    side = enc.SIDE_RIGHT
                # strict '<': ties keep the lower axis, then the lower position
                if cost < best_cost:
                    best_cost = cost
                    best_axis = k
                    best_pos = p
                    best_side = side
            n_left += n_start + n_planar
    return best_cost, best_axis, best_pos, best_side


@numba.njit(cache=True)
def classify_triangles(pool_pos, pool_kind, pool_tri, seg_start, seg_count, axis, split_pos,
                       side, tri_class):
    """Classify the node's triangles for a split (rule R9), Wald & Havran §4.4.

    Parameters
    ----------
    pool_pos, pool_kind, pool_tri : (3, capacity) float32, int8, int32
    seg_start, seg_count : (3,) int64
    axis : int
    split_pos : float32
    side : int
        Side of the planar triangles on the plane.
    tri_class : (num_triangles,) int8
        Written with ``CLASS_LEFT``, ``CLASS_RIGHT`` or ``CLASS_BOTH`` for
        every triangle of the node.

    Returns
    -------
    num_left, num_right : int
        Triangles in each child.
    """
    start = seg_start[axis]
    end = start + seg_count[axis]
    pos = pool_pos[axis]
    kind = pool_kind[axis]
    tri = pool_tri[axis]
    num_left = 0
    num_right = 0
    # every triangle has exactly one START or PLANAR event on the axis
    for i in range(start, end):
        if kind[i] != enc.EVENT_END:
            tri_class[tri[i]] = enc.CLASS_BOTH
    for i in range(start, end):
        p = pos[i]
        e = kind[i]
        t = tri[i]
        if e == enc.EVENT_END:
            if p <= split_pos:
                tri_class[t] = enc.CLASS_LEFT
        elif e == enc.EVENT_START:
            if p >= split_pos:
                tri_class[t] = enc.CLASS_RIGHT
        else:
            if p < split_pos or (p == split_pos and side == enc.SIDE_LEFT):
                tri_class[t] = enc.CLASS_LEFT
            else:
                tri_class[t] = enc.CLASS_RIGHT
    for i in range(start, end):
        if kind[i] != enc.EVENT_END:
            c = tri_class[tri[i]]
            if c & enc.CLASS_LEFT:
                num_left += 1
            if c & enc.CLASS_RIGHT:
                num_right += 1
    return num_left, num_right


@numba.njit(cache=True)
def split_events(pool_pos, pool_kind, pool_tri, seg_start, seg_count, tri_class, skip_both,
                 scratch_pos, scratch_kind, scratch_tri, tri_box_lo, tri_box_hi, kept_left,
                 kept_right):
    """Splice each axis's events into the two children, keeping their order.

    The left child's events are written in place over the node's (a
    subsequence never overtakes the read position), the right child's into
    the scratch buffers.

    Parameters
    ----------
    pool_pos, pool_kind, pool_tri : (3, capacity)
    seg_start, seg_count : (3,) int64
    tri_class : (num_triangles,) int8
    skip_both : bool
        Leave out the events of straddling triangles (perfect splits make new
        ones) and record their current boxes in ``tri_box_lo``/``tri_box_hi``.
    scratch_pos, scratch_kind, scratch_tri : (3, max_events)
        Receive the right child's kept events.
    tri_box_lo, tri_box_hi : (num_triangles, 3) float32
    kept_left, kept_right : (3,) int64
        Output: events kept per axis for each child.
    """
    for k in range(3):
        pos = pool_pos[k]
        kind = pool_kind[k]
        tri = pool_tri[k]
        s_pos = scratch_pos[k]
        s_kind = scratch_kind[k]
        s_tri = scratch_tri[k]
        w_left = seg_start[k]
        w_right = 0
        for i in range(seg_start[k], seg_start[k] + seg_count[k]):
            p = pos[i]
            e = kind[i]
            t = tri[i]
            c = tri_class[t]
            if skip_both and c == enc.CLASS_BOTH:
                if e != enc.EVENT_END:
                    tri_box_lo[t, k] = p
                if e != enc.EVENT_START:
                    tri_box_hi[t, k] = p
                continue
            if c & enc.CLASS_RIGHT:
                s_pos[w_right] = p
                s_kind[w_right] = e
                s_tri[w_right] = t
                w_right += 1
            if c & enc.CLASS_LEFT:
                pos[w_left] = p
                kind[w_left] = e
                tri[w_left] = t
                w_left += 1
        kept_left[k] = w_left - seg_start[k]
        kept_right[k] = w_right


@numba.njit(cache=True)
def clip_straddling(vertices, faces, both_tris, tri_box_lo, tri_box_hi, child_lo, child_hi,
                    new_lo, new_hi):
    """New boxes of the straddling triangles in one child (rule R9).

    Parameters
    ----------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
    both_tris : (num_both,) int32
    tri_box_lo, tri_box_hi : (num_triangles, 3) float32
        Boxes in the parent node.
    child_lo, child_hi : (3,) float32
    new_lo, new_hi : (>= num_both, 3) float32
        Output, row ``i`` for ``both_tris[i]``.
    """
    poly = np.empty(POLY_BUFFER_SHAPE, dtype=np.float64)
    work = np.empty(POLY_BUFFER_SHAPE, dtype=np.float64)
    clip_lo = np.empty(3, dtype=np.float32)
    clip_hi = np.empty(3, dtype=np.float32)
    for i in range(both_tris.shape[0]):
        t = both_tris[i]
        clip_child_box_into(vertices[faces[t, 0]], vertices[faces[t, 1]], vertices[faces[t, 2]],
                            tri_box_lo[t], tri_box_hi[t], child_lo, child_hi, new_lo[i],
                            new_hi[i], poly, work, clip_lo, clip_hi)


@numba.njit(cache=True)
def merge_events_backward(pos, kind, tri, start, num_kept, new_pos, new_kind, new_tri, num_new):
    """Merge sorted new events into kept events that sit at ``start``, in place.

    Writing from the back never overwrites a kept event not yet moved.
    """
    i = num_kept - 1
    j = num_new - 1
    w = num_kept + num_new - 1
    while j >= 0:
        if i >= 0 and event_less(new_pos[j], new_kind[j], new_tri[j],
                                 pos[start + i], kind[start + i], tri[start + i]):
            pos[start + w] = pos[start + i]
            kind[start + w] = kind[start + i]
            tri[start + w] = tri[start + i]
            i -= 1
        else:
            pos[start + w] = new_pos[j]
            kind[start + w] = new_kind[j]
            tri[start + w] = new_tri[j]
            j -= 1
        w -= 1


@numba.njit(cache=True)
def merge_events_into(pos, kind, tri, start, a_pos, a_kind, a_tri, num_a, b_pos, b_kind, b_tri,
                      num_b):
    """Merge two sorted event lists into ``pos/kind/tri[start:]``."""
    i = 0
    j = 0
    w = start
    while i < num_a or j < num_b:
        if j >= num_b or (i < num_a and event_less(a_pos[i], a_kind[i], a_tri[i],
                                                    b_pos[j], b_kind[j], b_tri[j])):
            pos[w] = a_pos[i]
            kind[w] = a_kind[i]
            tri[w] = a_tri[i]
            i += 1
        else:
            pos[w] = b_pos[j]
            kind[w] = b_kind[j]
            tri[w] = b_tri[j]
            j += 1
        w += 1


@numba.njit(cache=True)
def grow_pools(pool_pos, pool_kind, pool_tri, used, capacity):
    """Copy the first ``used`` events of each axis into pools of ``capacity``."""
    new_pos = np.empty((3, capacity), dtype=np.float32)
    new_kind = np.empty((3, capacity), dtype=np.int8)
    new_tri = np.empty((3, capacity), dtype=np.int32)
    for k in range(3):
        new_pos[k, :used[k]] = pool_pos[k, :used[k]]
        new_kind[k, :used[k]] = pool_kind[k, :used[k]]
        new_tri[k, :used[k]] = pool_tri[k, :used[k]]
    return new_pos, new_kind, new_tri


@numba.njit(cache=True)
def sort_small(values, start, end):
    """Sort ``values[start:end]`` in place; insertion sort for the usual small leaf."""
    if end - start > 32:
        values[start:end] = np.sort(values[start:end])
        return
    for i in range(start + 1, end):
        v = values[i]
        j = i - 1
        while j >= start and values[j] > v:
            values[j + 1] = values[j]
            j -= 1
        values[j + 1] = v


@numba.njit(cache=True)
def _grow_1d(arr, capacity):
    out = np.empty(capacity, dtype=arr.dtype)
    out[:arr.shape[0]] = arr
    return out


@numba.njit(cache=True)
def _build(vertices, faces, tri_lo, tri_hi, valid, bounds, k_traversal, k_intersect,
           empty_bonus, leaf_size, max_depth, longest_only, clip, pool_capacity):
    num_triangles = faces.shape[0]

    # --- root events, sorted once per axis (Wald & Havran §4.2)
    root_count = np.zeros(3, dtype=np.int64)
    capacity = 16
    for k in range(3):
        root_count[k] = 0
        for t in range(num_triangles):
            if valid[t]:
                root_count[k] += 1 if tri_lo[t, k] == tri_hi[t, k] else 2
        capacity = max(capacity, 3 * root_count[k] + 16)
    if pool_capacity > 0:
        capacity = max(pool_capacity, root_count.max())
    pool_pos = np.empty((3, capacity), dtype=np.float32)
    pool_kind = np.empty((3, capacity), dtype=np.int8)
    pool_tri = np.empty((3, capacity), dtype=np.int32)
    max_events = 16
    for k in range(3):
        max_events = max(max_events, root_count[k])
    for k in range(3):
        e_pos, e_kind, e_tri = build_root_events(tri_lo, tri_hi, valid, k)
        pool_pos[k, :root_count[k]] = e_pos
        pool_kind[k, :root_count[k]] = e_kind
        pool_tri[k, :root_count[k]] = e_tri
    scratch_pos = np.empty((3, max_events), dtype=np.float32)
    scratch_kind = np.empty((3, max_events), dtype=np.int8)
    scratch_tri = np.empty((3, max_events), dtype=np.int32)

    tri_class = np.zeros(num_triangles, dtype=np.int8)
    num_valid = 0
    for t in range(num_triangles):
        if valid[t]:
            num_valid += 1

    # perfect-split buffers (small when clip is off)
    n_clip = num_triangles if clip else 1
    tri_box_lo = np.empty((n_clip, 3), dtype=np.float32)
    tri_box_hi = np.empty((n_clip, 3), dtype=np.float32)
    both_tris = np.empty(n_clip, dtype=np.int32)
    new_lo = np.empty((n_clip, 3), dtype=np.float32)
    new_hi = np.empty((n_clip, 3), dtype=np.float32)
    new_pos = np.empty(2 * n_clip, dtype=np.float32)
    new_kind = np.empty(2 * n_clip, dtype=np.int8)
    new_tri = np.empty(2 * n_clip, dtype=np.int32)

    # --- output, grown by doubling
    node_cap = 1024
    node_axis = np.empty(node_cap, dtype=np.int8)
    node_split = np.empty(node_cap, dtype=np.float32)
    node_child = np.empty(node_cap, dtype=np.int32)
    node_count = np.empty(node_cap, dtype=np.int32)
    num_nodes = 1
    leaf_cap = max(1024, 2 * num_valid)
    leaf_tris = np.empty(leaf_cap, dtype=np.int32)
    num_refs = 0

    # --- explicit depth-first stack
    stk_node = np.empty(_STACK_SIZE, dtype=np.int64)
    stk_depth = np.empty(_STACK_SIZE, dtype=np.int64)
    stk_ntris = np.empty(_STACK_SIZE, dtype=np.int64)
    stk_start = np.empty((_STACK_SIZE, 3), dtype=np.int64)
    stk_count = np.empty((_STACK_SIZE, 3), dtype=np.int64)
    stk_lo = np.empty((_STACK_SIZE, 3), dtype=np.float32)
    stk_hi = np.empty((_STACK_SIZE, 3), dtype=np.float32)
    top = 0
    stk_node[0] = 0
    stk_depth[0] = 0
    stk_ntris[0] = num_valid
    for k in range(3):
        stk_start[0, k] = 0
        stk_count[0, k] = root_count[k]
        stk_lo[0, k] = bounds[0, k]
        stk_hi[0, k] = bounds[1, k]
    top = 1

    seg_start = np.empty(3, dtype=np.int64)
    seg_count = np.empty(3, dtype=np.int64)
    node_lo = np.empty(3, dtype=np.float32)
    node_hi = np.empty(3, dtype=np.float32)
    child_lo = np.empty(3, dtype=np.float32)
    child_hi = np.empty(3, dtype=np.float32)
    left_count = np.empty(3, dtype=np.int64)
    right_count = np.empty(3, dtype=np.int64)
    used = np.empty(3, dtype=np.int64)
    kept_left = np.empty(3, dtype=np.int64)
    kept_right = np.empty(3, dtype=np.int64)

    while top > 0:
        top -= 1
        node = stk_node[top]
        depth = stk_depth[top]
        num_tris = stk_ntris[top]
        for k in range(3):
            seg_start[k] = stk_start[top, k]
            seg_count[k] = stk_count[top, k]
            node_lo[k] = stk_lo[top, k]
            node_hi[k] = stk_hi[top, k]

        # --- R4: leaf tests before any split search, then R5-R8: best plane
        make_leaf = num_tris <= leaf_size or depth >= max_depth
        best_cost = np.inf
        best_axis = -1
        best_pos = np.float32(0.0)
        best_side = enc.SIDE_LEFT
        if not make_leaf:
            best_cost, best_axis, best_pos, best_side = find_best_plane(
                pool_pos, pool_kind, seg_start, seg_count, num_tris, node_lo, node_hi,
                k_traversal, k_intersect, empty_bonus, longest_only)
            make_leaf = best_axis < 0 or not (best_cost < leaf_cost(k_intersect, num_tris))

        if make_leaf:
            # --- emit the leaf: its triangles are the axis-0 START/PLANAR events
            if num_refs + num_tris > leaf_cap:
                leaf_cap = max(2 * leaf_cap, num_refs + num_tris)
                leaf_tris = _grow_1d(leaf_tris, leaf_cap)
            w = num_refs
            for i in range(seg_start[0], seg_start[0] + seg_count[0]):
                if pool_kind[0, i] != enc.EVENT_END:
                    leaf_tris[w] = pool_tri[0, i]
                    w += 1
            sort_small(leaf_tris, num_refs, w)
            node_axis[node] = enc.AXIS_LEAF
            node_split[node] = 0.0
            node_child[node] = num_refs
            node_count[node] = w - num_refs
            num_refs = w
            continue

        # --- split: two adjacent children (R10)
        if num_nodes + 2 > node_cap:
            node_cap = 2 * node_cap
            node_axis = _grow_1d(node_axis, node_cap)
            node_split = _grow_1d(node_split, node_cap)
            node_child = _grow_1d(node_child, node_cap)
            node_count = _grow_1d(node_count, node_cap)
        left = num_nodes
        num_nodes += 2
        node_axis[node] = best_axis
        node_split[node] = best_pos
        node_child[node] = left
        node_count[node] = 0

        # children need at most twice the node's events; make room above its segment
        need = 0
        for k in range(3):
            used[k] = seg_start[k] + seg_count[k]
            need = max(need, seg_start[k] + 2 * seg_count[k])
        if need > pool_pos.shape[1]:
            pool_pos, pool_kind, pool_tri = grow_pools(
                pool_pos, pool_kind, pool_tri, used, max(2 * pool_pos.shape[1], need))

        # --- classify triangles (R9), splice events into the children
        num_left, num_right = classify_triangles(
            pool_pos, pool_kind, pool_tri, seg_start, seg_count, best_axis, best_pos,
            best_side, tri_class)
        num_both = 0
        if clip:
            # the straddling triangles, listed before the events are overwritten
            for i in range(seg_start[best_axis], seg_start[best_axis] + seg_count[best_axis]):
                if pool_kind[best_axis, i] != enc.EVENT_END:
                    t = pool_tri[best_axis, i]
                    if tri_class[t] == enc.CLASS_BOTH:
                        both_tris[num_both] = t
                        num_both += 1
        split_events(pool_pos, pool_kind, pool_tri, seg_start, seg_count, tri_class, clip,
                     scratch_pos, scratch_kind, scratch_tri, tri_box_lo, tri_box_hi, kept_left,
                     kept_right)

        if not clip:
            for k in range(3):
                left_count[k] = kept_left[k]
                right_count[k] = kept_right[k]
                dst = seg_start[k] + kept_left[k]
                pool_pos[k, dst:dst + kept_right[k]] = scratch_pos[k, :kept_right[k]]
                pool_kind[k, dst:dst + kept_right[k]] = scratch_kind[k, :kept_right[k]]
                pool_tri[k, dst:dst + kept_right[k]] = scratch_tri[k, :kept_right[k]]
        else:
            # --- perfect splits (Wald & Havran §4.3): clip straddling triangles
            a = best_axis
            both = both_tris[:num_both]
            # left child first: its events stay where the node's were
            for k in range(3):
                child_lo[k] = node_lo[k]
                child_hi[k] = node_hi[k]
            child_hi[a] = best_pos
            clip_straddling(vertices, faces, both, tri_box_lo, tri_box_hi, child_lo, child_hi,
                            new_lo, new_hi)
            for k in range(3):
                m = make_events(both, new_lo, new_hi, k, new_pos, new_kind, new_tri)
                sort_events(new_pos[:m], new_kind[:m], new_tri[:m])
                merge_events_backward(pool_pos[k], pool_kind[k], pool_tri[k], seg_start[k],
                                      kept_left[k], new_pos, new_kind, new_tri, m)
                left_count[k] = kept_left[k] + m
            # right child: kept events in scratch, merged in after the left child
            for k in range(3):
                child_lo[k] = node_lo[k]
                child_hi[k] = node_hi[k]
            child_lo[a] = best_pos
            clip_straddling(vertices, faces, both, tri_box_lo, tri_box_hi, child_lo, child_hi,
                            new_lo, new_hi)
            for k in range(3):
                m = make_events(both, new_lo, new_hi, k, new_pos, new_kind, new_tri)
                sort_events(new_pos[:m], new_kind[:m], new_tri[:m])
                merge_events_into(pool_pos[k], pool_kind[k], pool_tri[k],
                                  seg_start[k] + left_count[k],
                                  scratch_pos[k], scratch_kind[k], scratch_tri[k], kept_right[k],
                                  new_pos, new_kind, new_tri, m)
                right_count[k] = kept_right[k] + m

        # --- push left below right, so that the right child is on top of the pools
        for c in range(2):
            stk_node[top] = left + c
            stk_depth[top] = depth + 1
            stk_ntris[top] = num_left if c == 0 else num_right
            for k in range(3):
                if c == 0:
                    stk_start[top, k] = seg_start[k]
                    stk_count[top, k] = left_count[k]
                else:
                    stk_start[top, k] = seg_start[k] + left_count[k]
                    stk_count[top, k] = right_count[k]
                stk_lo[top, k] = node_lo[k]
                stk_hi[top, k] = node_hi[k]
            if c == 0:
                stk_hi[top, best_axis] = best_pos
            else:
                stk_lo[top, best_axis] = best_pos
            top += 1

    return (node_axis[:num_nodes].copy(), node_split[:num_nodes].copy(),
            node_child[:num_nodes].copy(), node_count[:num_nodes].copy(),
            leaf_tris[:num_refs].copy())
