"""Events: made, sorted and merged (Wald & Havran 2006, §4.2-4.3).

An event is ``(pos, kind, tri)``: a triangle box's bound on one axis (rule
R3). The root's events are made and sorted once per axis
(:func:`build_root_events`); below the root only the new events of clipped
triangles are sorted, and merged into the kept ones
(:func:`merge_events_backward`, :func:`merge_events_into`).

Sorting uses one sortable 64-bit integer key per event::

    key = (sortable_bits(pos) << 32) | (kind << 28) | tri

``sortable_bits`` maps a float32 to a uint32 that orders like the float
(negative values have all bits flipped, non-negative ones get the sign bit
set), so sorting the keys as unsigned integers orders events by position,
then kind (``EVENT_END < EVENT_PLANAR < EVENT_START``), then triangle: the
order of rule R3 (:func:`event_less` is the same order, one pair at a
time). Triangle indices fit in 28 bits because
``kdtree_gpu.mesh.validate_mesh`` limits a mesh to ``2**31 // 8``
triangles. Positions must not be ``-0.0`` (the mesh validation and the
clipping code never produce one) so that equal positions have equal bits.
"""

from __future__ import annotations

import numba
import numpy as np

from kdtree_gpu import encoding as enc

_SIGN = np.uint32(0x80000000)
_TRI_BITS = 28
_TRI_MASK = np.uint64((1 << _TRI_BITS) - 1)


@numba.njit(cache=True)
def encode_event_keys(event_pos, event_kind, event_tri):
    """Sortable keys of events.

    Parameters
    ----------
    event_pos : (num_events,) float32
    event_kind : (num_events,) int8
    event_tri : (num_events,) int32

    Returns
    -------
    event_key : (num_events,) uint64
    """
    n = event_pos.shape[0]
    bits = np.ascontiguousarray(event_pos).view(np.uint32)
    event_key = np.empty(n, dtype=np.uint64)
    for i in range(n):
        b = bits[i]
        if b & _SIGN:
            b = ~b
        else:
            b = b | _SIGN
        event_key[i] = ((np.uint64(b) << np.uint64(32))
                        | (np.uint64(event_kind[i]) << np.uint64(_TRI_BITS))
                        | np.uint64(event_tri[i]))
    return event_key


@numba.njit(cache=True)
def decode_event_keys(event_key, event_pos, event_kind, event_tri):
    """Inverse of :func:`encode_event_keys`, written into the given arrays.

    Parameters
    ----------
    event_key : (num_events,) uint64
    event_pos : (>= num_events,) float32
    event_kind : (>= num_events,) int8
    event_tri : (>= num_events,) int32
        Output; the first ``num_events`` entries are written.
    """
    n = event_key.shape[0]
    bits = np.empty(n, dtype=np.uint32)
    for i in range(n):
        key = event_key[i]
        b = np.uint32(key >> np.uint64(32))
        if b & _SIGN:
            b = b & ~_SIGN
        else:
            b = ~b
        bits[i] = b
        event_kind[i] = np.int8((key >> np.uint64(_TRI_BITS)) & np.uint64(3))
        event_tri[i] = np.int32(key & _TRI_MASK)
    pos = bits.view(np.float32)
    for i in range(n):
        event_pos[i] = pos[i]


@numba.njit(cache=True)
def make_events(tri_ids, box_lo, box_hi, axis, event_pos, event_kind, event_tri):
    """Unsorted events of triangles on one axis (rule R3).

    Parameters
    ----------
    tri_ids : (num_tris,) int32
        Triangles to make events for.
    box_lo, box_hi : (num_tris, 3) float32
        Their boxes, row ``i`` for ``tri_ids[i]``.
    axis : int
    event_pos, event_kind, event_tri : (>= 2 * num_tris,) float32, int8, int32
        Output buffers.

    Returns
    -------
    int
        Number of events written: one PLANAR per flat box, else END and START.
    """
    m = 0
    for i in range(tri_ids.shape[0]):
        a = box_lo[i, axis]
        b = box_hi[i, axis]
        t = tri_ids[i]
        if a == b:
            event_pos[m] = a
            event_kind[m] = enc.EVENT_PLANAR
            event_tri[m] = t
            m += 1
        else:
            event_pos[m] = b
            event_kind[m] = enc.EVENT_END
            event_tri[m] = t
            event_pos[m + 1] = a
            event_kind[m + 1] = enc.EVENT_START
            event_tri[m + 1] = t
            m += 2
    return m


@numba.njit(cache=True)
def sort_events(event_pos, event_kind, event_tri):
    """Sort events in place by (position, kind, triangle) (rule R3).

    Same parameters as :func:`encode_event_keys`.
    """
    keys = np.sort(encode_event_keys(event_pos, event_kind, event_tri))
    decode_event_keys(keys, event_pos, event_kind, event_tri)


@numba.njit(cache=True)
def event_less(pos_a, kind_a, tri_a, pos_b, kind_b, tri_b):
    """Whether event a comes before event b in the order of rule R3."""
    if pos_a != pos_b:
        return pos_a < pos_b
    if kind_a != kind_b:
        return kind_a < kind_b
    return tri_a < tri_b


@numba.njit(cache=True, nogil=True)
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
def merge_events_backward(pos, kind, tri, start, num_kept, new_pos, new_kind, new_tri, num_new):
    """Merge sorted new events into kept events that sit at ``start``, in place.

    Writing from the back never overwrites a kept event not yet moved.

    Parameters
    ----------
    pos, kind, tri : (capacity,) float32, int8, int32
        One axis of an event pool; ``[start, start + num_kept)`` holds the
        kept events, and there is room for ``num_new`` more after them.
    start, num_kept : int
    new_pos, new_kind, new_tri : (>= num_new,) float32, int8, int32
        Sorted new events.
    num_new : int
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
    """Merge two sorted event lists into ``pos/kind/tri[start:]``.

    Parameters
    ----------
    pos, kind, tri : (capacity,) float32, int8, int32
        Output: ``[start, start + num_a + num_b)`` is written.
    start : int
    a_pos, a_kind, a_tri : (>= num_a,) float32, int8, int32
    num_a : int
    b_pos, b_kind, b_tri : (>= num_b,) float32, int8, int32
    num_b : int
    """
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
