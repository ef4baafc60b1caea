"""Events: key order, root events (rule R3), merging sorted events."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_reference.events import (build_root_events, decode_event_keys, encode_event_keys,
                                  event_less, merge_events_backward, merge_events_into,
                                  sort_events)
from kdtree_gpu import encoding as enc
from kdtree_gpu.mesh import prepare_mesh
from kdtree_gpu.testing.meshes import quad_x, triangles, wedge

END, PLANAR, START = enc.EVENT_END, enc.EVENT_PLANAR, enc.EVENT_START


def root_events(V, F, axis):
    _, _, tri_lo, tri_hi, valid, _ = prepare_mesh(V, F)
    return build_root_events(tri_lo, tri_hi, valid, axis)


def random_events(rng, n):
    """Distinct events on a coarse grid of positions (many ties in position and kind)."""
    pos = rng.integers(-4, 5, size=n).astype(np.float32) * np.float32(0.5)
    kind = rng.integers(0, 3, size=n).astype(np.int8)
    tri = rng.permutation(4 * n)[:n].astype(np.int32)
    return pos, kind, tri


def lexsorted(pos, kind, tri):
    order = np.lexsort((tri, kind, pos))
    return pos[order], kind[order], tri[order]


def test_event_keys_order_like_position_kind_triangle():
    rng = np.random.default_rng(7)
    n = 3000
    pos = rng.choice(np.array([-2.5, -1e-30, 0.0, 1e-30, 0.75, 3.0, -np.inf, np.inf],
                              np.float32), size=n)
    pos[:1000] = rng.normal(size=1000).astype(np.float32)
    kind = rng.integers(0, 3, size=n).astype(np.int8)
    tri = rng.integers(0, (1 << 28) - 1, size=n).astype(np.int32)
    keys = encode_event_keys(pos, kind, tri)
    order = np.argsort(keys, kind="stable")
    expected = np.lexsort((tri, kind, pos))
    np.testing.assert_array_equal(pos[order], pos[expected])
    np.testing.assert_array_equal(kind[order], kind[expected])
    np.testing.assert_array_equal(tri[order], tri[expected])
    out_pos = np.empty(n, np.float32)
    out_kind = np.empty(n, np.int8)
    out_tri = np.empty(n, np.int32)
    decode_event_keys(keys, out_pos, out_kind, out_tri)
    np.testing.assert_array_equal(out_pos, pos)
    np.testing.assert_array_equal(out_kind, kind)
    np.testing.assert_array_equal(out_tri, tri)
    sort_events(pos, kind, tri)
    np.testing.assert_array_equal(tri, out_tri[expected])


def test_root_events_of_coincident_triangles_follow_triangle_index():
    V, F = triangles(wedge(0, 1), wedge(0, 1))
    pos, kind, tri = root_events(V, F, 0)
    np.testing.assert_array_equal(pos, [0, 0, 1, 1])
    np.testing.assert_array_equal(kind, [START, START, END, END])
    np.testing.assert_array_equal(tri, [0, 1, 0, 1])


def test_root_events_end_before_planar_before_start():
    # triangle 0 ends at x=1, triangle 1 lies in x=1, triangle 2 starts at x=1
    V, F = triangles(wedge(0, 1), quad_x(1.0)[0], wedge(1, 2))
    pos, kind, tri = root_events(V, F, 0)
    np.testing.assert_array_equal(pos, [0, 1, 1, 1, 2])
    np.testing.assert_array_equal(kind, [START, END, PLANAR, START, END])
    np.testing.assert_array_equal(tri, [0, 0, 1, 2, 2])


def test_degenerate_triangles_make_no_events():
    V, F = triangles(wedge(0, 1), [[0, 0, 0], [1, 1, 1], [2, 2, 2]], wedge(2, 3))
    for axis in range(3):
        _, _, tri = root_events(V, F, axis)
        assert 1 not in tri.tolist()


def test_event_less_is_the_key_order():
    rng = np.random.default_rng(4)
    pos, kind, tri = random_events(rng, 200)
    keys = encode_event_keys(pos, kind, tri)
    for i, j in rng.integers(0, 200, size=(500, 2)):
        assert event_less(pos[i], kind[i], tri[i], pos[j], kind[j], tri[j]) == (keys[i] < keys[j])


@pytest.mark.parametrize("num_kept, num_new", [(0, 0), (0, 5), (7, 0), (30, 12), (3, 40)])
def test_merge_backward_in_place_gives_the_sorted_union(num_kept, num_new):
    rng = np.random.default_rng(num_kept * 100 + num_new)
    kept = lexsorted(*random_events(rng, num_kept))
    new = lexsorted(*random_events(rng, num_new))
    new = tuple(a + (4 * num_kept if a.dtype == np.int32 else 0) for a in new)  # distinct tris
    start = 5
    pool = [np.full(start + num_kept + num_new + 3, fill, dtype=d)
            for fill, d in ((-9.0, np.float32), (9, np.int8), (-1, np.int32))]
    for buf, part in zip(pool, kept):
        buf[start:start + num_kept] = part
    merge_events_backward(*pool, start, num_kept, *new, num_new)
    expected = lexsorted(*(np.concatenate([a, b]) for a, b in zip(kept, new)))
    for buf, exp, fill in zip(pool, expected, (-9.0, 9, -1)):
        np.testing.assert_array_equal(buf[start:start + num_kept + num_new], exp)
        assert np.all(buf[:start] == fill) and np.all(buf[start + num_kept + num_new:] == fill)


@pytest.mark.parametrize("num_a, num_b", [(0, 0), (0, 6), (9, 0), (25, 17)])
def test_merge_into_gives_the_sorted_union(num_a, num_b):
    rng = np.random.default_rng(num_a * 100 + num_b + 1)
    a = lexsorted(*random_events(rng, num_a))
    b = lexsorted(*random_events(rng, num_b))
    b = tuple(x + (4 * num_a if x.dtype == np.int32 else 0) for x in b)
    start = 2
    out = [np.zeros(start + num_a + num_b, dtype=d) for d in (np.float32, np.int8, np.int32)]
    merge_events_into(*out, start, *a, num_a, *b, num_b)
    expected = lexsorted(*(np.concatenate([x, y]) for x, y in zip(a, b)))
    for buf, exp in zip(out, expected):
        np.testing.assert_array_equal(buf[start:], exp)
