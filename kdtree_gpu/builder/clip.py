"""Perfect splits (``SAHConfig(clip=True)``) on ``xp`` arrays.

Rule R9 with clipping (:mod:`cpu_reference`): a triangle that straddles the
split plane ("both") gets, in each child, the box of the part of it inside
the child's box; its events there are made from that box and merged with the
other triangles' events, which keep their order (Wald & Havran 2006, §4.3).
This module is the level pipeline's form of :mod:`cpu_reference.clip` and of
the clipping steps of :mod:`cpu_reference.split`, on NumPy and CuPy alike:

1. :func:`reference_boxes`: every reference's box in its node, read off its
   events (lower bound from its START or PLANAR event, upper bound from its
   END or PLANAR event), as ``cpu_reference.split.split_events`` does;
2. :func:`clip_child_boxes`: the new box in a child, the float64
   Sutherland-Hodgman polygon of ``cpu_reference.clip`` in the same order of
   operations, one row per straddling copy, so the float32 boxes are the same
   bits;
3. :func:`make_clipped_events`: their events, sorted by (child segment,
   position, kind, reference);
4. :func:`merge_events`: those few sorted events and the kept ones (already
   sorted, never re-sorted) into one list in the order of rule R3.

:func:`clip_straddling` runs 2-4 for one level.
"""

from __future__ import annotations

import numpy as np

from .. import encoding as enc
from ..primitives import (compact_indices, float_to_ordered_uint, lower_bound, radix_sort,
                          segmented_lower_bound, upper_bound)
from .soa import EventSoA

MAX_POLY = enc.CLIP_MAX_POLY



def reference_boxes(xp, events, num_refs, num_nodes):
    """Box of every reference in its node, from its events.

    Parameters
    ----------
    events : EventSoA
        The level's events; per axis, a reference has a START and an END
        event, or one PLANAR event.
    num_refs, num_nodes : int

    Returns
    -------
    ref_lo, ref_hi : (num_refs, 3) float32
    """
    axis = events.event_seg.astype(np.int64) // num_nodes
    ref = events.event_ref.astype(np.int64)
    kind = events.event_kind
    ref_lo = xp.empty((num_refs, 3), dtype=np.float32)
    ref_hi = xp.empty((num_refs, 3), dtype=np.float32)
    lower = kind != enc.EVENT_END
    ref_lo[ref[lower], axis[lower]] = events.event_pos[lower]
    upper = kind != enc.EVENT_START
    ref_hi[ref[upper], axis[upper]] = events.event_pos[upper]
    return ref_lo, ref_hi


def _round_outward(xp, x, down):
    """float64 ``x`` to the nearest float32 not above (``down``) or not below it, never -0.0."""
    f = x.astype(np.float32)
    if down:
        f = xp.where(f.astype(np.float64) > x, xp.nextafter(f, np.float32(-np.inf)), f)
    else:
        f = xp.where(f.astype(np.float64) < x, xp.nextafter(f, np.float32(np.inf)), f)
    return f + np.float32(0.0)


def clip_triangle_boxes(xp, v0, v1, v2, box_lo, box_hi):
    """Boxes of triangles clipped to boxes, rounded outward (``clip_triangle_box``).

    Parameters
    ----------
    v0, v1, v2 : (m, 3) float32
        The triangles' vertices.
    box_lo, box_hi : (m, 3) float32
        The clipping boxes (inclusive).

    Returns
    -------
    inside : (m,) bool
        False where nothing of the triangle lies in its box.
    lo, hi : (m, 3) float32
        The clipped polygon's box, rounded outward (meaningless where not
        ``inside``).
    """
    m = v0.shape[0]
    rows = xp.arange(m)
    poly = xp.zeros((m, MAX_POLY, 3), dtype=np.float64)
    for i, v in enumerate((v0, v1, v2)):
        poly[:, i] = v.astype(np.float64)
    count = xp.full(m, 3, dtype=np.int64)
    for k in range(3):
        for upper in (False, True):
            c = (box_hi if upper else box_lo)[:, k].astype(np.float64)
            work = xp.zeros_like(poly)
            written = xp.zeros(m, dtype=np.int64)
            prev = poly[rows, xp.maximum(count - 1, 0)]
            prev_in = (prev[:, k] <= c) if upper else (prev[:, k] >= c)
            for i in range(MAX_POLY):
                present = i < count
                cur = poly[:, i]
                cur_in = (cur[:, k] <= c) if upper else (cur[:, k] >= c)
                # crossing point of the edge prev -> cur with the plane
                cross = present & (cur_in != prev_in)
                denom = xp.where(cross, cur[:, k] - prev[:, k], 1.0)
                t = (c - prev[:, k]) / denom
                q = prev + t[:, None] * (cur - prev)
                q[:, k] = c
                for emit, point in ((cross, q), (present & cur_in, cur)):
                    # a row writes at most MAX_POLY points; the others rewrite what is there
                    slot = xp.minimum(written, MAX_POLY - 1)
                    work[rows, slot] = xp.where(emit[:, None], point, work[rows, slot])
                    written += emit
                prev = xp.where(present[:, None], cur, prev)
                prev_in = xp.where(present, cur_in, prev_in)
            poly, count = work, written
    inside = count > 0
    present = (xp.arange(MAX_POLY)[None, :] < count[:, None])[:, :, None]
    lo = xp.where(present, poly, np.inf).min(axis=1)
    hi = xp.where(present, poly, -np.inf).max(axis=1)
    return inside, _round_outward(xp, lo, True), _round_outward(xp, hi, False)


def clip_child_boxes(xp, v0, v1, v2, prev_lo, prev_hi, child_lo, child_hi):
    """New boxes of straddling triangles in a child (rule R9, ``clip_child_box``).

    Parameters
    ----------
    v0, v1, v2 : (m, 3) float32
    prev_lo, prev_hi : (m, 3) float32
        Their boxes in the parent node.
    child_lo, child_hi : (m, 3) float32
        The child's box, per row.

    Returns
    -------
    new_lo, new_hi : (m, 3) float32
        The clipped polygon's outward-rounded box intersected with the
        previous box and the child's box; the previous box intersected with
        the child's box where the polygon is empty or that intersection is
        empty on some axis.
    """
    inside, clip_lo, clip_hi = clip_triangle_boxes(xp, v0, v1, v2, child_lo, child_hi)
    fall_lo = xp.maximum(prev_lo, child_lo)
    fall_hi = xp.minimum(prev_hi, child_hi)
    lo = xp.maximum(clip_lo, fall_lo)
    hi = xp.minimum(clip_hi, fall_hi)
    used = (inside & xp.all(lo <= hi, axis=1))[:, None]
    return xp.where(used, lo, fall_lo), xp.where(used, hi, fall_hi)


def _segment_key(xp, pos, kind, ref_local):
    """Events' order within a segment (position, kind, reference) as uint64."""
    return ((float_to_ordered_uint(pos).astype(np.uint64) << np.uint64(enc.CLIP_POS_SHIFT))
            | (kind.astype(np.uint64) << np.uint64(enc.CLIP_KIND_SHIFT))
            | ref_local.astype(np.uint64))


def make_clipped_events(xp, box_lo, box_hi, copy_ref, copy_seg):
    """Events of the clipped copies, sorted by (segment, position, kind, reference).

    Parameters
    ----------
    box_lo, box_hi : (c, 3) float32
        The copies' boxes in their children.
    copy_ref : (c,) int64
        Each copy's reference in the next level; copies of one child come in
        ascending reference order.
    copy_seg : (3, c) int64
        Each copy's child segment per axis.

    Returns
    -------
    EventSoA
        Per axis a PLANAR event where the box is flat, else END and START (R3).
    """
    pos, kind, ref, seg = [], [], [], []
    for k in range(3):
        lo, hi = box_lo[:, k], box_hi[:, k]
        planar = lo == hi
        for event_kind, value, present in ((enc.EVENT_END, hi, ~planar),
                                           (enc.EVENT_PLANAR, lo, planar),
                                           (enc.EVENT_START, lo, ~planar)):
            pos.append(value[present])
            kind.append(xp.full(value[present].shape[0], event_kind, dtype=enc.EVENT_KIND_DTYPE))
            ref.append(copy_ref[present])
            seg.append(copy_seg[k][present])
    pos, kind, ref, seg = (xp.concatenate(a) for a in (pos, kind, ref, seg))
    # Segment, position and kind in one key; a stable sort keeps equal keys in
    # reference order, as the parts above list every (axis, kind) in copy order.
    key = ((seg.astype(np.uint64) << np.uint64(enc.CLIP_SEG_SHIFT))
           | (float_to_ordered_uint(pos).astype(np.uint64) << np.uint64(enc.CLIP_NEW_POS_SHIFT))
           | kind.astype(np.uint64))
    _, order = radix_sort(key, xp.arange(key.shape[0], dtype=np.int64))
    return EventSoA(event_pos=pos[order], event_kind=kind[order],
                    event_ref=ref[order].astype(enc.EVENT_TRI_DTYPE),
                    event_seg=seg[order].astype(np.int32))


def merge_events(xp, kept, kept_offset, new, child_ref_offset, num_children):
    """Two sorted event lists of the same segments as one (R3 order).

    A new event goes after the kept events of its segment that come before
    it (a binary search within the segment) and after the new events before
    it; a kept event goes after the new events whose place is at or before
    its own.

    Parameters
    ----------
    kept : EventSoA
        Sorted by segment, then (position, kind, reference).
    kept_offset : (num_segments + 1,) int64
        Kept events of segment ``s`` are ``[kept_offset[s], kept_offset[s + 1])``.
    new : EventSoA
        Sorted the same way.
    child_ref_offset : (num_children + 1,) int64
        References of child ``c`` in the next level; segment ``s`` belongs to
        child ``s % num_children``.

    Returns
    -------
    events : EventSoA
    offset : (num_segments + 1,) int64
    """
    num_segments = kept_offset.shape[0] - 1
    num_kept, num_new = kept.size, new.size

    def local_key(ev):
        child = ev.event_seg.astype(np.int64) % num_children
        ref_local = ev.event_ref.astype(np.int64) - child_ref_offset[child]
        return _segment_key(xp, ev.event_pos, ev.event_kind, ref_local)

    new_seg = new.event_seg.astype(np.int64)
    place = segmented_lower_bound(local_key(kept), kept_offset, local_key(new), new_seg,
                                  max_length=num_kept)
    new_dst = place + xp.arange(num_new, dtype=np.int64)
    # `place` grows with the new events' order: how many lie at or before k
    kept_dst = xp.arange(num_kept, dtype=np.int64) + upper_bound(
        place, xp.arange(num_kept, dtype=np.int64))
    total = num_kept + num_new
    merged = EventSoA(event_pos=xp.empty(total, dtype=enc.EVENT_POS_DTYPE),
                      event_kind=xp.empty(total, dtype=enc.EVENT_KIND_DTYPE),
                      event_ref=xp.empty(total, dtype=enc.EVENT_TRI_DTYPE),
                      event_seg=xp.empty(total, dtype=np.int32))
    for src, dst in ((kept, kept_dst), (new, new_dst)):
        for name in ("event_pos", "event_kind", "event_ref", "event_seg"):
            getattr(merged, name)[dst] = getattr(src, name)
    new_offset = lower_bound(new_seg, xp.arange(num_segments + 1, dtype=np.int64))
    return merged, kept_offset + new_offset


def clip_straddling(xp, vertices, faces, refs, ref_lo, ref_hi, ref_class, ref_route, best,
                    nodes, split_rank, seg_child_left, child_lo, child_hi, kept, kept_offset,
                    num_split):
    """The next level's events with the straddling references clipped (R9).

    Parameters
    ----------
    vertices, faces : the prepared mesh (``xp`` arrays)
    refs : RefSoA
        This level's references; ``ref_lo``/``ref_hi`` their boxes.
    ref_class, ref_route, best, nodes, split_rank, seg_child_left
        This level's classification, reference routes, best splits, nodes,
        rank of each splitting node and first child segment of each segment.
    child_lo, child_hi : (2 * num_split, 3) float32
        The children's boxes.
    kept : EventSoA
        The children's events without the straddling references' events.
    kept_offset : (6 * num_split + 1,) int64

    Returns
    -------
    events : EventSoA
    seg_event_offset : (6 * num_split + 1,) int64
    """
    both = compact_indices(ref_class == enc.CLASS_BOTH)
    n = nodes.size
    node = refs.ref_node[both].astype(np.int64)
    left = 2 * split_rank[node]
    tri = faces[refs.ref_tri[both]]
    corners = [vertices[tri[:, j]] for j in range(3)]
    # left copies, then right copies
    child = xp.concatenate([left, left + 1])
    box_lo, box_hi = clip_child_boxes(
        xp, *(xp.concatenate([c, c]) for c in corners),
        xp.concatenate([ref_lo[both], ref_lo[both]]), xp.concatenate([ref_hi[both], ref_hi[both]]),
        child_lo[child], child_hi[child])
    copy_ref = xp.concatenate([ref_route.dst_left[both], ref_route.dst_right[both]])
    side = xp.concatenate([xp.zeros_like(left), xp.ones_like(left)])
    copy_seg = xp.stack([seg_child_left[k * n + xp.concatenate([node, node])] + side
                         for k in range(3)])
    new = make_clipped_events(xp, box_lo, box_hi, copy_ref, copy_seg)
    return merge_events(xp, kept, kept_offset, new, ref_route.child_offset[:2 * num_split + 1],
                        2 * num_split)
