"""Random test rays and hit comparison (kdtree_gpu.testing.rays)."""

from __future__ import annotations

import numpy as np
import pytest

from kdtree_gpu.testing import rays as testing

BOUNDS = np.array([[0, 0, 0], [1, 2, 3]], np.float32)


# --- random_rays -------------------------------------------------------------------

def test_rays_are_float32_unit_and_seeded():
    rays = testing.random_rays(BOUNDS, 101, seed=3)
    origins, directions, tmin, tmax = rays
    assert origins.shape == directions.shape == (101, 3)
    assert tmin.shape == tmax.shape == (101,)
    assert all(a.dtype == np.float32 for a in rays)
    np.testing.assert_allclose(np.linalg.norm(directions, axis=1), 1.0, rtol=1e-5)
    assert np.all(tmin == 0) and np.all(np.isinf(tmax))
    again = testing.random_rays(BOUNDS, 101, seed=3)
    for a, b in zip(rays, again):
        np.testing.assert_array_equal(a, b)
    from_rng = testing.random_rays(BOUNDS, 101, np.random.default_rng(3))
    np.testing.assert_array_equal(from_rng.origins, origins)


def test_half_start_in_the_box_and_half_aim_at_it_from_outside():
    rays = testing.random_rays(BOUNDS, 1000, seed=0)
    lo, hi = BOUNDS.astype(np.float64)
    inside = np.all((rays.origins >= lo) & (rays.origins <= hi), axis=1)
    assert inside[:500].all() and not inside[500:].any()
    # an aimed ray passes through the box: its closest approach to the box is 0
    o, d = rays.origins[500:].astype(np.float64), rays.directions[500:].astype(np.float64)
    t_near = np.max(np.minimum((lo - o) / d, (hi - o) / d), axis=1)
    t_far = np.min(np.maximum((lo - o) / d, (hi - o) / d), axis=1)
    assert np.all(t_near <= t_far + 1e-9) and np.all(t_far > 0)


@pytest.mark.parametrize("scale", [1e-9, 1e-3, 1e6, 1e15])
def test_rays_scale_with_the_box(scale):
    # the same seed on a scaled box gives the same rays, scaled: every length
    # in the generator is a fraction of the box
    base = testing.random_rays(BOUNDS, 500, seed=7, intervals=0.5, unit=False)
    scaled = testing.random_rays(BOUNDS.astype(np.float64) * scale, 500, seed=7, intervals=0.5,
                                 unit=False)
    np.testing.assert_allclose(scaled.origins, base.origins * np.float32(scale), rtol=1e-5)
    np.testing.assert_allclose(scaled.directions, base.directions, rtol=1e-6)
    finite = np.isfinite(base.tmax)
    np.testing.assert_allclose(scaled.tmax[finite], base.tmax[finite] * np.float32(scale),
                               rtol=1e-5)


def test_a_flat_box_is_widened():
    flat = np.array([[0, 0, 5], [1, 1, 5]], np.float32)
    rays = testing.random_rays(flat, 400, seed=0)
    z = rays.origins[:200, 2]
    assert z.min() < 5 < z.max()
    assert np.ptp(z) <= testing.MIN_EXTENT_SHARE * np.sqrt(2) * 1.0001


def test_special_directions_and_intervals():
    n = 3000
    rays = testing.random_rays(BOUNDS, n, seed=1, special=0.3, intervals=0.25, unit=False)
    d = rays.directions
    zeros = d == 0
    axis_aligned = zeros.sum(axis=1) == 2  # also -0.0 rows with two zeros
    assert axis_aligned.sum() >= n * 0.09
    assert zeros.any(axis=1).sum() >= n * 0.2
    assert np.signbit(d[zeros]).any()  # -0.0 components
    assert np.all(np.abs(d).max(axis=1) > 0)
    lengths = np.linalg.norm(d, axis=1)
    assert lengths.min() >= 0.5 * 0.999 and lengths.max() <= 2.0 * 1.001
    unit = testing.random_rays(BOUNDS, n, seed=1, special=0.3).directions
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-5)
    with_interval = np.isfinite(rays.tmax)
    assert with_interval.sum() == round(0.25 * n)
    assert np.all(rays.tmin <= rays.tmax)
    assert np.all(rays.tmin[~with_interval] == 0)


@pytest.mark.parametrize("bounds", [[[0, 0, 0], [0, 0, 0]], [[0, 0, 0], [1, np.nan, 1]],
                                    [[1, 1, 1], [0, 0, 0]]])
def test_bad_bounds_are_named(bounds):
    with pytest.raises(ValueError, match="bounds must be a finite box"):
        testing.random_rays(bounds, 10)


def test_bad_shares_are_named():
    with pytest.raises(ValueError, match="special must be a share"):
        testing.random_rays(BOUNDS, 10, special=1.5)


# --- compare_hits -------------------------------------------------------------------

def answers():
    t = np.array([1.0, np.inf, 2.0, 3.0, 4.0], np.float32)
    tri = np.array([0, -1, 1, 2, 3], np.int32)
    return t, tri


def test_identical_answers_agree():
    t, tri = answers()
    comparison = testing.compare_hits((t, tri), (t.copy(), tri.copy()))
    assert comparison.ok and comparison.describe() is None
    assert comparison.num_rays == 5 and comparison.num_hits == 4 and comparison.num_ties == 0


def test_a_tie_on_a_shared_edge_agrees():
    t, tri = answers()
    other_t = t.copy()
    other_t[3] = np.nextafter(np.float32(3), np.float32(4))
    other_tri = tri.copy()
    other_tri[[3, 4]] = [7, 9]
    comparison = testing.compare_hits((t, tri), (other_t, other_tri))
    assert comparison.ok and comparison.num_ties == 2
    assert testing.compare_hits((t, tri), (other_t, tri)).ok  # same triangle, t within rtol
    assert not testing.compare_hits((t, tri), (other_t, tri), exact=True).ok


def test_each_kind_of_disagreement_is_counted_and_described():
    t, tri = answers()
    other_t = np.array([1.0, 5.0, 2.5, 3.0, np.inf], np.float32)
    other_tri = np.array([0, 4, 1, 2, 3], np.int32)  # ray 4: a hit at t = inf
    comparison = testing.compare_hits((t, tri), (other_t, other_tri))
    assert comparison.hit_miss.tolist() == [False, True, False, False, False]
    assert comparison.distance.tolist() == [False, False, True, False, False]
    assert comparison.malformed.tolist() == [False, False, False, False, True]
    assert comparison.bad.sum() == 3 and not comparison.ok
    text = comparison.describe()
    assert text.startswith("3 of 5 rays disagree with brute force")
    assert "1 malformed, 1 hit/miss, 1 distance, 0 surface point" in text
    assert "first: ray 1, tree t=inf tri=-1, brute force t=5.0 tri=4" in text


def test_barycentrics_and_misses_follow_the_conventions():
    t, tri = answers()
    u = np.array([0.1, 0.0, 0.2, 0.3, 0.4], np.float32)
    v = np.array([0.5, 0.0, 0.1, 0.1, 0.1], np.float32)
    assert testing.compare_hits((t, tri, u, v), (t, tri, u, v), exact=True).ok
    other_u = u.copy()
    other_u[2] += 0.01
    comparison = testing.compare_hits((t, tri, u, v), (t, tri, other_u, v))
    assert comparison.surface.tolist() == [False, False, True, False, False]
    bad_miss_u = u.copy()
    bad_miss_u[1] = 0.5  # a miss with a barycentric
    assert testing.compare_hits((t, tri, bad_miss_u, v), (t, tri, u, v)).malformed[1]


def test_assert_same_hits_raises_with_the_description():
    t, tri = answers()
    other = tri.copy()
    other[0] = -1
    other_t = t.copy()
    other_t[0] = np.inf
    with pytest.raises(AssertionError, match="1 of 5 rays disagree with expected"):
        testing.assert_same_hits((t, tri), (other_t, other))
    assert testing.assert_same_hits((t, tri), (t, tri)).num_hits == 4


def test_mismatched_shapes_are_named():
    t, tri = answers()
    with pytest.raises(ValueError, match="one length"):
        testing.compare_hits((t, tri), (t[:3], tri[:3]))


def test_rays_through_a_tree_agree_with_brute_force(make_tree):
    import trimesh

    from kdtree_gpu.trace import intersect_brute

    mesh = trimesh.creation.icosphere(subdivisions=2)
    tree = make_tree(mesh.vertices.astype(np.float32), mesh.faces.astype(np.int32))
    rays = testing.random_rays(tree.bounds, 4000, seed=0, special=0.2, intervals=0.2)
    comparison = testing.assert_same_hits(tree.intersect(*rays), intersect_brute(tree, *rays[:2],
                                          tmin=rays.tmin, tmax=rays.tmax), exact=True)
    assert 0.3 < comparison.num_hits / comparison.num_rays < 1.0
