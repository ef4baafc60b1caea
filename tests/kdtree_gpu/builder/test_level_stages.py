"""The host-side rules of the levels run by stages (kdtree_gpu/builder/gpu/level_stages.py)."""

import numpy as np
import pytest

from kdtree_gpu.builder.gpu.level_stages import (CHILD_ROOM_MARGIN, child_arrays, child_room,
                                                 split_refs_and_events_gpu)


def test_child_room_needs_the_last_levels_growth():
    assert child_room({}, 0, 100, 600) is None
    assert child_room({0: (1.0, 1.0)}, 2, 100, 600) is None  # (level 1 ran in the loop)


def test_child_room_follows_a_rising_growth_and_keeps_a_margin():
    refs, events = 10_000, 60_000
    steady = child_room({3: (1.01, 1.02)}, 4, refs, events)
    assert steady == (int((1.01 + CHILD_ROOM_MARGIN) * refs) + 64,
                      int((1.02 + CHILD_ROOM_MARGIN) * events) + 64)
    rising = child_room({2: (1.00, 1.00), 3: (1.01, 1.02)}, 4, refs, events)
    assert rising == (int((1.02 + CHILD_ROOM_MARGIN) * refs) + 64,
                      int((1.04 + CHILD_ROOM_MARGIN) * events) + 64)
    # a shrinking growth is not extrapolated down: the guess stays at the last one's
    falling = child_room({2: (1.2, 1.2), 3: (1.01, 1.02)}, 4, refs, events)
    assert falling == steady


def test_child_room_never_passes_twice_the_items():
    # (every reference and event goes to at most both children)
    assert child_room({0: (1.9, 1.95), 1: (2.0, 2.0)}, 2, 10, 60) == (20, 120)


def test_child_arrays_store_segments_when_asked():
    refs, events = child_arrays(np, 5, 12, segments=True)
    assert refs.size == 5 and events.size == 12 and events.event_seg.shape == (12,)
    assert child_arrays(np, 5, 12, segments=False)[1].event_seg is None


def test_clipping_scatter_needs_children_with_segments():
    # (checked before anything is launched: the clipping kernels read the segments)
    children = child_arrays(np, 4, 8, segments=False)
    with pytest.raises(ValueError, match="must store their segments"):
        split_refs_and_events_gpu(np, *[None] * 9, 0, np.zeros(1, np.int32), children,
                                  clip=True)
