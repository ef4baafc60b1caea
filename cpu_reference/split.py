"""Splitting a node: its triangles and events go to two children (rule R9).

Wald & Havran §4.4: one pass over the split axis's events classifies every
triangle left, right or both, and one pass per axis splices the events into
the two children in order, so that the children never sort again. With
perfect splits (§4.3) the straddling triangles are clipped to each child's
box and only their new events are sorted and merged in.

The node's events are a segment of the event pools (see
:mod:`cpu_reference.subtree`, whose loop calls these functions in turn):
:func:`split_events` writes the left child's events over them and keeps the
right child's aside, and :func:`clip_straddling` makes the new boxes of the
straddling triangles in one child.
"""

from __future__ import annotations

import numba
import numpy as np

from kdtree_gpu import encoding as enc

from .clip import POLY_BUFFER_SHAPE, clip_child_box_into


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
                 scratch_pos, scratch_kind, scratch_tri, tri_slot, both_lo, both_hi, kept_left,
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
        ones) and record their current boxes in ``both_lo``/``both_hi``.
    scratch_pos, scratch_kind, scratch_tri : (3, max_events)
        Receive the right child's kept events.
    tri_slot : (num_triangles,) int32
        With ``skip_both``: the row of each straddling triangle in ``both_lo``
        and ``both_hi`` (its place in the list of straddling triangles).
    both_lo, both_hi : (>= num_both, 3) float32
        Output with ``skip_both``: the straddling triangles' boxes.
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
                    both_lo[tri_slot[t], k] = p
                if e != enc.EVENT_START:
                    both_hi[tri_slot[t], k] = p
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
def clip_straddling(vertices, faces, both_tris, both_lo, both_hi, child_lo, child_hi, new_lo,
                    new_hi):
    """New boxes of the straddling triangles in one child (rule R9).

    Parameters
    ----------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
    both_tris : (num_both,) int32
    both_lo, both_hi : (>= num_both, 3) float32
        Their boxes in the parent node, row ``i`` for ``both_tris[i]``.
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
                            both_lo[i], both_hi[i], child_lo, child_hi, new_lo[i],
                            new_hi[i], poly, work, clip_lo, clip_hi)
