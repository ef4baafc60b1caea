"""Depth-first build of one subtree from its sorted events: the compiled kernel.

:func:`build_subtree` builds the part of the tree below one node, given that
node's events in the order of rule R3. It is the whole single-threaded
builder of Wald & Havran (2006) with an explicit stack, and the unit of work
of the parallel build (:mod:`cpu_reference.tasks`): it is compiled with
``nogil=True``, so that threads run subtrees side by side, and it allocates
nothing that another call shares.

Events live in one pool per axis (``pos`` float32, ``kind`` int8, ``tri``
int32) used as a stack: a node's events are the top segment of each pool,
and a split writes the left child's events in place and the right child's
right after them (:mod:`cpu_reference.split` classifies and splices).

The split is written out in the loop rather than called as one function:
passing the loop's two dozen arrays to a helper once per node made the build
10 to 20 % slower in numba 0.68, even with ``inline="always"``.

With ``split_once`` the kernel splits its root only and hands back both
children, with their events, as *exports* instead of building them: the
parallel build cuts the top of the tree into independent subtrees this way.
"""

from __future__ import annotations

import numba
import numpy as np

from kdtree_gpu import config as cfg
from kdtree_gpu import encoding as enc

from .events import make_events, merge_events_backward, merge_events_into, sort_events
from .split import classify_triangles, clip_straddling, split_events
from .sweep import find_best_plane, leaf_cost

_STACK_SIZE = 2 * (cfg.MAX_DEPTH_CAP + 4)


@numba.njit(cache=True, nogil=True)
def build_subtree(vertices, faces, in_pos, in_kind, in_tri, in_start, in_count, num_tris, depth,
                  box_lo, box_hi, k_traversal, k_intersect, empty_bonus, leaf_size, max_depth,
                  longest_only, clip, split_once, pool_capacity, tri_class, tri_slot):
    """Build the subtree below one node (rules R4-R10).

    Parameters
    ----------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
    in_pos, in_kind, in_tri : (3, m) float32, int8, int32
        Events; the subtree root's events on axis k are
        ``[in_start[k], in_start[k] + in_count[k])``, sorted (rule R3). Only
        read: several calls may share them.
    in_start, in_count : (3,) int64
    num_tris : int
        Triangles in the subtree root.
    depth : int
        Depth of the subtree root in the whole tree.
    box_lo, box_hi : (3,) float32
        The subtree root's box.
    k_traversal, k_intersect, empty_bonus : float
    leaf_size, max_depth : int
    longest_only, clip : bool
        The build settings (``SAHConfig``; ``max_depth`` resolved).
    split_once : bool
        Split the root only and export both children (unless it is a leaf).
    pool_capacity : int
        Initial events per axis in the event pools (they grow as needed);
        0 chooses three times the root's events (twice with ``split_once``).
    tri_class : (num_triangles,) int8
    tri_slot : (num_triangles,) int32, or (1,) without clipping
        Work arrays indexed by triangle, not initialised; one set per thread
        (a set indexed by triangle, so that the few triangles of a node need
        no lookup, and per thread, because subtrees share triangles).

    Returns
    -------
    node_axis : (num_nodes,) int8
    node_split : (num_nodes,) float32
    node_child : (num_nodes,) int32
    node_count : (num_nodes,) int32
        The subtree, root at 0 (rule R10); ``node_child`` indexes these
        arrays for interior nodes and ``leaf_tris`` for leaves. An exported
        node is an empty leaf here.
    leaf_tris : (num_refs,) int32
    export_node : (num_exports,) int64
        The exported nodes: none, or the root's children ``[1, 2]``.
    export_start, export_count : (num_exports, 3) int64
        Where each export's events lie in ``pool_pos``/``pool_kind``/``pool_tri``.
    export_ntris : (num_exports,) int64
    export_lo, export_hi : (num_exports, 3) float32
        The exported nodes' triangle counts and boxes; their depth is
        ``depth + 1``.
    pool_pos, pool_kind, pool_tri : (3, capacity) float32, int8, int32
        The event pools, holding the exports' events.
    """
    # --- event pools: a private copy of the root's events, with room to grow
    max_events = 16
    for k in range(3):
        max_events = max(max_events, in_count[k])
    capacity = (2 if split_once else 3) * max_events + 16
    if pool_capacity > 0:
        capacity = max(pool_capacity, max_events)
    pool_pos = np.empty((3, capacity), dtype=np.float32)
    pool_kind = np.empty((3, capacity), dtype=np.int8)
    pool_tri = np.empty((3, capacity), dtype=np.int32)
    for k in range(3):
        a = in_start[k]
        b = a + in_count[k]
        pool_pos[k, :in_count[k]] = in_pos[k, a:b]
        pool_kind[k, :in_count[k]] = in_kind[k, a:b]
        pool_tri[k, :in_count[k]] = in_tri[k, a:b]
    scratch_pos = np.empty((3, max_events), dtype=np.float32)
    scratch_kind = np.empty((3, max_events), dtype=np.int8)
    scratch_tri = np.empty((3, max_events), dtype=np.int32)

    # perfect-split buffers, one row per straddling triangle (one row when clip is off)
    n_clip = max(num_tris, 1) if clip else 1
    both_tris = np.empty(n_clip, dtype=np.int32)
    both_lo = np.empty((n_clip, 3), dtype=np.float32)
    both_hi = np.empty((n_clip, 3), dtype=np.float32)
    new_lo = np.empty((n_clip, 3), dtype=np.float32)
    new_hi = np.empty((n_clip, 3), dtype=np.float32)
    new_pos = np.empty(2 * n_clip, dtype=np.float32)
    new_kind = np.empty(2 * n_clip, dtype=np.int8)
    new_tri = np.empty(2 * n_clip, dtype=np.int32)

    # --- output, grown by doubling
    node_cap = 64 if split_once else 1024
    node_axis = np.empty(node_cap, dtype=np.int8)
    node_split = np.empty(node_cap, dtype=np.float32)
    node_child = np.empty(node_cap, dtype=np.int32)
    node_count = np.empty(node_cap, dtype=np.int32)
    num_nodes = 1
    leaf_cap = max(64, 2 * num_tris)
    leaf_tris = np.empty(leaf_cap, dtype=np.int32)
    num_refs = 0
    export_node = np.empty(2, dtype=np.int64)
    export_start = np.empty((2, 3), dtype=np.int64)
    export_count = np.empty((2, 3), dtype=np.int64)
    export_ntris = np.empty(2, dtype=np.int64)
    export_lo = np.empty((2, 3), dtype=np.float32)
    export_hi = np.empty((2, 3), dtype=np.float32)
    num_exports = 0

    # --- explicit depth-first stack
    stk_node = np.empty(_STACK_SIZE, dtype=np.int64)
    stk_depth = np.empty(_STACK_SIZE, dtype=np.int64)
    stk_ntris = np.empty(_STACK_SIZE, dtype=np.int64)
    stk_start = np.empty((_STACK_SIZE, 3), dtype=np.int64)
    stk_count = np.empty((_STACK_SIZE, 3), dtype=np.int64)
    stk_lo = np.empty((_STACK_SIZE, 3), dtype=np.float32)
    stk_hi = np.empty((_STACK_SIZE, 3), dtype=np.float32)
    stk_node[0] = 0
    stk_depth[0] = depth
    stk_ntris[0] = num_tris
    for k in range(3):
        stk_start[0, k] = 0
        stk_count[0, k] = in_count[k]
        stk_lo[0, k] = box_lo[k]
        stk_hi[0, k] = box_hi[k]
    top = 1

    seg_start = np.empty(3, dtype=np.int64)
    seg_count = np.empty(3, dtype=np.int64)
    node_lo = np.empty(3, dtype=np.float32)
    node_hi = np.empty(3, dtype=np.float32)
    left_count = np.empty(3, dtype=np.int64)
    right_count = np.empty(3, dtype=np.int64)
    used = np.empty(3, dtype=np.int64)
    kept_left = np.empty(3, dtype=np.int64)
    kept_right = np.empty(3, dtype=np.int64)
    child_lo = np.empty(3, dtype=np.float32)
    child_hi = np.empty(3, dtype=np.float32)

    while top > 0:
        top -= 1
        node = stk_node[top]
        node_depth = stk_depth[top]
        node_tris = stk_ntris[top]
        for k in range(3):
            seg_start[k] = stk_start[top, k]
            seg_count[k] = stk_count[top, k]
            node_lo[k] = stk_lo[top, k]
            node_hi[k] = stk_hi[top, k]

        if split_once and node != 0:
            # --- export a child of the root (node 1 or 2): its events stay where the split put them
            e = node - 1
            export_node[e] = node
            export_ntris[e] = node_tris
            for k in range(3):
                export_start[e, k] = seg_start[k]
                export_count[e, k] = seg_count[k]
                export_lo[e, k] = node_lo[k]
                export_hi[e, k] = node_hi[k]
            num_exports += 1
            node_axis[node] = enc.AXIS_LEAF
            node_split[node] = 0.0
            node_child[node] = num_refs
            node_count[node] = 0
            continue

        # --- R4: leaf tests before any split search, then R5-R8: best plane
        make_leaf = node_tris <= leaf_size or node_depth >= max_depth
        best_cost = np.inf
        best_axis = -1
        best_pos = np.float32(0.0)
        best_side = enc.SIDE_LEFT
        if not make_leaf:
            best_cost, best_axis, best_pos, best_side = find_best_plane(
                pool_pos, pool_kind, seg_start, seg_count, node_tris, node_lo, node_hi,
                k_traversal, k_intersect, empty_bonus, longest_only)
            make_leaf = best_axis < 0 or not (best_cost < leaf_cost(k_intersect, node_tris))

        if make_leaf:
            # --- emit the leaf: its triangles are the axis-0 START/PLANAR events
            if num_refs + node_tris > leaf_cap:
                leaf_cap = max(2 * leaf_cap, num_refs + node_tris)
                leaf_tris = grow_1d(leaf_tris, leaf_cap)
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
            node_axis = grow_1d(node_axis, node_cap)
            node_split = grow_1d(node_split, node_cap)
            node_child = grow_1d(node_child, node_cap)
            node_count = grow_1d(node_count, node_cap)
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
                        tri_slot[t] = num_both
                        num_both += 1
        split_events(pool_pos, pool_kind, pool_tri, seg_start, seg_count, tri_class, clip,
                     scratch_pos, scratch_kind, scratch_tri, tri_slot, both_lo, both_hi, kept_left,
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
            # left child first: its events stay where the node's were; then the
            # right child: kept events in scratch, merged in after the left child
            for side in range(2):
                for k in range(3):
                    child_lo[k] = node_lo[k]
                    child_hi[k] = node_hi[k]
                if side == 0:
                    child_hi[a] = best_pos
                else:
                    child_lo[a] = best_pos
                clip_straddling(vertices, faces, both, both_lo, both_hi, child_lo, child_hi,
                                new_lo, new_hi)
                for k in range(3):
                    m = make_events(both, new_lo, new_hi, k, new_pos, new_kind, new_tri)
                    sort_events(new_pos[:m], new_kind[:m], new_tri[:m])
                    if side == 0:
                        merge_events_backward(pool_pos[k], pool_kind[k], pool_tri[k],
                                              seg_start[k], kept_left[k],
                                              new_pos, new_kind, new_tri, m)
                        left_count[k] = kept_left[k] + m
                    else:
                        merge_events_into(pool_pos[k], pool_kind[k], pool_tri[k],
                                          seg_start[k] + left_count[k],
                                          scratch_pos[k], scratch_kind[k], scratch_tri[k],
                                          kept_right[k], new_pos, new_kind, new_tri, m)
                        right_count[k] = kept_right[k] + m

        # --- push left below right, so that the right child is on top of the pools
        for c in range(2):
            stk_node[top] = left + c
            stk_depth[top] = node_depth + 1
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
            leaf_tris[:num_refs].copy(),
            export_node[:num_exports].copy(), export_start[:num_exports].copy(),
            export_count[:num_exports].copy(), export_ntris[:num_exports].copy(),
            export_lo[:num_exports].copy(), export_hi[:num_exports].copy(),
            pool_pos, pool_kind, pool_tri)


@numba.njit(cache=True)
def grow_pools(pool_pos, pool_kind, pool_tri, used, capacity):
    """Copy the first ``used`` events of each axis into pools of ``capacity``.

    Parameters
    ----------
    pool_pos, pool_kind, pool_tri : (3, old_capacity) float32, int8, int32
    used : (3,) int64
    capacity : int

    Returns
    -------
    pool_pos, pool_kind, pool_tri : (3, capacity) float32, int8, int32
    """
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
def grow_1d(arr, capacity):
    """A copy of ``arr`` in a longer array of ``capacity`` entries."""
    out = np.empty(capacity, dtype=arr.dtype)
    out[:arr.shape[0]] = arr
    return out
