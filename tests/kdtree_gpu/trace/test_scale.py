"""Tests of the trace scale (kdtree_gpu.trace.scale): correct hits at every scale.

Rays meet triangles in scaled space, where the root box's largest coordinate
is about 1 (the contract is the docstring of :mod:`kdtree_gpu.trace.scale`).
Every check here is a function of ``device`` and runs on the CPU and, under
the ``gpu`` mark, on a GPU, which follows the same contract.

Embree (through embreex, an optional test dependency) is the independent
reference. Its own float32 ray-triangle test fails far from 1 (no hits at
all for a mesh at 1e15, ``t = 0`` at 1e-15), so a mesh scaled by ``S`` is
compared with Embree's answer for the unscaled mesh and the unscaled rays
(``t`` times ``S``); a mesh moved far from the origin is compared with
Embree's answer for that same mesh, whose coordinates it handles.
"""

import math

import numpy as np
import pytest
import trimesh

import kdtree_gpu as kd
from kdtree_gpu import testing
from kdtree_gpu import trace as raycast
from kdtree_gpu.mesh import (MeshError, check_trace_range, load_mesh, prepare_mesh,
                             smallest_triangle)
from kdtree_gpu.trace.scale import largest_abs, scale_exponent, trace_scale

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SCALES = [1e-15, 1e-9, 1e-3, 1.0, 1e3, 1e9, 1e15]
NUM_RAYS = 6000
# shares of rays that may differ from Embree's answer: rays through an edge
# or a vertex, where two float32 tests may round to different sides
MAX_HIT_MISMATCH = 2e-3
MAX_TRIANGLE_MISMATCH = 2e-3
T_RTOL = 1e-4


# --- meshes and rays --------------------------------------------------------------
def shapes_mesh():
    """A torus with a sphere in its hole and a bar through both: holes, concave parts."""
    torus = trimesh.creation.torus(major_radius=1.0, minor_radius=0.35, major_sections=48,
                                   minor_sections=24)
    sphere = trimesh.creation.icosphere(subdivisions=3, radius=0.45)
    sphere.apply_translation([0.1, -0.05, 0.2])
    bar = trimesh.creation.box(extents=(2.8, 0.2, 0.3))
    bar.apply_translation([0.3, 0.0, -0.1])
    mesh = trimesh.util.concatenate([torus, sphere, bar])
    return np.asarray(mesh.vertices, np.float32), np.asarray(mesh.faces, np.int32)


def mesh_arrays(name, mesh_file):
    if name == "shapes":
        return shapes_mesh()
    return load_mesh(mesh_file(name))


def surface_rays(V, F, n, rng):
    """Rays leaving surface points (area-weighted) to both sides, as a path tracer's."""
    P = V.astype(np.float64)[F]
    normal = np.cross(P[:, 1] - P[:, 0], P[:, 2] - P[:, 0])
    area = np.linalg.norm(normal, axis=1)
    tri = rng.choice(len(F), size=n, p=area / area.sum())
    w = rng.dirichlet([1, 1, 1], size=n)
    points = np.einsum("ij,ijk->ik", w, P[tri])
    side = normal[tri] / area[tri, None] * rng.choice([-1.0, 1.0], size=(n, 1))
    direction = rng.normal(size=(n, 3))
    direction += side * (np.abs(np.sum(direction * side, axis=1, keepdims=True)) + 0.1)
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    diag = np.linalg.norm(P.reshape(-1, 3).max(axis=0) - P.reshape(-1, 3).min(axis=0))
    return points + side * (1e-4 * diag), direction


def unit_rays(V, F, seed=0):
    """Rays (float64) for the mesh: half random (kdtree_gpu.testing), half from the surface.

    Directions have unit length: the rays of a renderer.
    """
    rng = np.random.default_rng(seed)
    lo, hi = V.min(axis=0), V.max(axis=0)
    rays = testing.random_rays(np.stack([lo, hi]), NUM_RAYS // 2, rng, unit=True)
    O2, D2 = surface_rays(V, F, NUM_RAYS - NUM_RAYS // 2, rng)
    return (np.concatenate([rays.origins.astype(np.float64), O2]),
            np.concatenate([rays.directions.astype(np.float64), D2]))


def embree_hits(V, F, O, D):
    """Closest hit of float32 rays by Embree: (t, tri), misses as t = inf, tri = -1."""
    embreex = pytest.importorskip("embreex")  # noqa: F841
    from embreex import rtcore_scene
    from embreex.mesh_construction import TriangleMesh

    scene = rtcore_scene.EmbreeScene()
    TriangleMesh(scene, V[F])
    result = scene.run(np.ascontiguousarray(O, np.float32), np.ascontiguousarray(D, np.float32),
                       output=1)
    tri = result["primID"].astype(np.int32)
    t = np.where(tri >= 0, result["tfar"], np.inf).astype(np.float32)
    return t, tri


# --- checks -----------------------------------------------------------------------
def assert_valid_answers(t, tri, u, v):
    """A hit has a finite t and barycentrics in [0, 1]; a miss is t = inf, tri = -1, u = v = 0."""
    hit = tri >= 0
    assert np.all(np.isfinite(t[hit])), "a hit with a non-finite t"
    assert np.all(np.isinf(t[~hit]) & (t[~hit] > 0)) and np.all(tri[~hit] == -1)
    assert np.all(u[~hit] == 0) and np.all(v[~hit] == 0)
    assert np.all((u[hit] >= 0) & (v[hit] >= 0) & (u[hit] + v[hit] <= 1 + 1e-6))


def assert_agrees_with(t, tri, t_ref, tri_ref, atol, what):
    """Same hit or miss and the same triangle (or an equal t: a tie) on nearly every ray.

    ``t`` agrees within ``T_RTOL`` relative or ``atol`` absolute (a share of the
    mesh's size: the rounding of float32 coordinates for short rays).
    """
    hit, hit_ref = tri >= 0, tri_ref >= 0
    mismatch = np.mean(hit != hit_ref)
    assert mismatch <= MAX_HIT_MISMATCH, \
        f"{what}: {np.sum(hit != hit_ref)} of {len(tri)} rays differ in hit or miss " \
        f"({np.sum(hit & ~hit_ref)} hits Embree misses, {np.sum(~hit & hit_ref)} misses)"
    both = hit & hit_ref
    close = np.abs(t[both].astype(np.float64) - t_ref[both]) <= \
        T_RTOL * np.abs(t_ref[both]) + atol
    other = (tri[both] != tri_ref[both]) & ~close
    assert np.mean(other) <= MAX_TRIANGLE_MISMATCH, \
        f"{what}: {np.sum(other)} of {np.sum(both)} hits on another triangle at another t"
    same = tri[both] == tri_ref[both]
    np.testing.assert_allclose(t[both][same], t_ref[both][same], rtol=T_RTOL, atol=atol,
                               err_msg=what)


def check_scaled_mesh(device, V, F, scale, reference):
    """The mesh and ray origins times ``scale`` (in float64, then rounded); unit directions."""
    O, D, t_ref, tri_ref = reference
    Vs = (V.astype(np.float64) * scale).astype(np.float32)
    Os = (O * scale).astype(np.float32)
    Ds = D.astype(np.float32)
    tree = kd.build(Vs, F, device=device)
    t, tri, u, v = tree.intersect(Os, Ds, device=device)
    assert_valid_answers(t, tri, u, v)
    what = f"mesh x {scale:g} on {device}"
    atol = 1e-5 * scale * np.ptp(V, axis=0).max()
    assert_agrees_with(t, tri, t_ref.astype(np.float64) * scale, tri_ref, atol, what)
    # the traversal and the brute force decide alike in scaled space
    testing.assert_same_hits((t, tri, u, v),
                             raycast.intersect_brute(tree, Os, Ds, device=device), exact=True)
    # any hit: all of them, none before just short of the closest, all up to just beyond it
    hit = tri >= 0
    np.testing.assert_array_equal(tree.occluded(Os, Ds, device=device), hit)
    t_hit = np.where(hit, t, np.float32(1.0))
    short = tree.occluded(Os, Ds, tmax=t_hit * np.float32(1 - 1e-3), device=device)
    beyond = tree.occluded(Os, Ds, tmax=t_hit * np.float32(1 + 1e-3), device=device)
    assert np.mean(short[hit]) <= MAX_TRIANGLE_MISMATCH, what
    assert np.all(beyond[hit]), what
    np.testing.assert_array_equal(
        raycast.occluded_brute(tree, Os, Ds, tmax=t_hit * np.float32(1 + 1e-3), device=device)[hit],
        beyond[hit])


# --- tests ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def unit_references():
    """Per mesh name: the unscaled mesh, rays and Embree's answer for them (computed once)."""
    cache = {}

    def get(name, mesh_file):
        if name not in cache:
            V, F = mesh_arrays(name, mesh_file)
            O, D = unit_rays(V, F)
            t_ref, tri_ref = embree_hits(V, F, O, D)
            assert 0.3 < np.mean(tri_ref >= 0) < 0.95  # a mix of hits and misses
            cache[name] = (V, F, (O, D, t_ref, tri_ref))
        return cache[name]

    return get


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("name", ["shapes", "teapot.ply"])
def test_hits_agree_with_embree_at_every_scale(device, scale, name, unit_references,
                                               mesh_file):
    V, F, reference = unit_references(name, mesh_file)
    check_scaled_mesh(device, V, F, scale, reference)


def check_moved_mesh(device, V, F, size, offset):
    """The mesh scaled to about ``size``, moved by ``offset``, rounded to float32 (as in a file)."""
    c = offset * np.array([1.0, -0.5, 0.25])
    V64 = V.astype(np.float64) * (size / np.ptp(V, axis=0).max())
    O, D = unit_rays(V64, F, seed=3)
    Vm = (V64 + c).astype(np.float32)
    Om = (O + c).astype(np.float32)
    Dm = D.astype(np.float32)
    t_ref, tri_ref = embree_hits(Vm, F, Om, Dm)
    tree = kd.build(Vm, F, device=device)
    t, tri, u, v = tree.intersect(Om, Dm, device=device)
    assert_valid_answers(t, tri, u, v)
    assert_agrees_with(t, tri, t_ref, tri_ref, 1e-5 * size,
                       f"mesh of size {size:g} at {offset:g} on {device}")
    testing.assert_same_hits((t, tri, u, v),
                             raycast.intersect_brute(tree, Om, Dm, device=device), exact=True)
    np.testing.assert_array_equal(tree.occluded(Om, Dm, device=device), tri >= 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("size, offset", [(1e3, 1e6), (1e9, 1e12), (1e-3, -1.0)])
def test_hits_agree_with_embree_far_from_the_origin(device, size, offset):
    V, F = shapes_mesh()
    check_moved_mesh(device, V, F, size, offset)


def check_power_of_two_scales(device, V, F, O, D):
    """Scaling mesh and rays by 2**k changes no bit of t, tri, u, v (t by 2**k with unscaled d)."""
    base = kd.build(V, F, device=device).intersect(O, D, device=device)
    assert np.mean(base[1] >= 0) > 0.3
    for k in (-90, -60, -33, -1, 1, 20, 60, 90):
        s = np.float32(2.0 ** k)
        tree = kd.build(V * s, F, device=device)
        assert trace_scale(tree.bounds) == trace_scale(base_bounds(V, F)) / s
        scaled = tree.intersect(O * s, D * s, device=device)
        for a, b, name in zip(scaled, base, ("t", "tri", "u", "v")):
            np.testing.assert_array_equal(a, b, err_msg=f"{name} at 2^{k} on {device}")
        t, tri, u, v = tree.intersect(O * s, D, device=device)
        np.testing.assert_array_equal(t, base[0] * s, err_msg=f"t at 2^{k}, unscaled d")
        np.testing.assert_array_equal(tri, base[1])
        np.testing.assert_array_equal(u, base[2])
        np.testing.assert_array_equal(v, base[3])


def base_bounds(V, F):
    return prepare_mesh(V, F)[5]


@pytest.mark.parametrize("device", DEVICES)
def test_power_of_two_scales_change_no_bit(device):
    V, F = shapes_mesh()
    O, D = unit_rays(V, F, seed=5)
    check_power_of_two_scales(device, V, F, O.astype(np.float32), D.astype(np.float32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [1e-30, 1e-15, 1.0, 1e13, 1e29])
def test_one_triangle_straight_down(device, scale):
    # at 1e13 the unscaled test overflowed (t = inf, tri = 0), at 1e-15 it
    # underflowed (t = 0)
    s = np.float32(scale)
    V = np.array([[-1, -1, 0], [1, -1, 0], [0, 1, 0]], np.float32) * s
    F = np.array([[0, 1, 2]], np.int32)
    tree = kd.build(V, F, device=device)
    O = np.array([[0, 0, 1], [0.25, -0.5, 2], [5, 5, 1], [0, 0, -3]], np.float32) * s
    D = np.array([[0, 0, -1], [0, 0, -1], [0, 0, -1], [0, 0, 1]], np.float32)
    t, tri, u, v = tree.intersect(O, D, device=device)
    np.testing.assert_array_equal(tri, [0, 0, -1, 0])
    np.testing.assert_allclose(t[[0, 1, 3]], np.array([1, 2, 3]) * np.float64(s), rtol=1e-6)
    assert t[2] == np.inf and u[2] == 0 and v[2] == 0
    # (0, 0) = 1/4 v0 + 1/4 v1 + 1/2 v2
    np.testing.assert_allclose([u[0], v[0]], [0.25, 0.5], rtol=1e-6)
    np.testing.assert_array_equal(tree.occluded(O, D, device=device), [True, True, False, True])
    np.testing.assert_array_equal(raycast.intersect_brute(tree, O, D, device=device)[1], tri)


@pytest.mark.parametrize("device", DEVICES)
def test_unreachable_t_is_a_miss_not_a_hit_at_infinity(device):
    # a direction so short that the hit lies beyond float32's range
    V = np.array([[-1, -1, 0], [1, -1, 0], [0, 1, 0]], np.float32)
    F = np.array([[0, 1, 2]], np.int32)
    tree = kd.build(V, F, device=device)
    O = np.array([[0, 0, 1e30]], np.float32)
    D = np.array([[0, 0, -1e-20]], np.float32)
    t, tri, u, v = tree.intersect(O, D, device=device)
    assert tri[0] == -1 and t[0] == np.inf
    assert not tree.occluded(O, D, device=device)[0]


# --- the scale and the refused meshes ---------------------------------------------
@pytest.mark.parametrize("largest, exponent", [(1.0, -1), (0.75, 0), (0.5, 0), (3.0, -2),
                                               (1e13, -44), (1e-15, 49), (2.0 ** -126, 125),
                                               (3e38, -126), (1e-40, 127), (0.0, 0)])
def test_trace_scale_brings_the_largest_coordinate_into_half_one(largest, exponent):
    bounds = np.array([[-largest / 2, 0, 0], [0, largest, 0]], np.float32)
    assert scale_exponent(bounds) == exponent
    s = trace_scale(bounds)
    assert s.dtype == np.float32 and s == np.float32(2.0 ** exponent)
    m = float(np.max(np.abs(bounds)))
    if 2.0 ** -125 < m < 2.0 ** 126:
        assert 0.5 <= m * float(s) < 1.0


@pytest.mark.parametrize("at", range(6))
def test_largest_coordinate_agrees_with_numpy_and_keeps_nan_anywhere(at):
    rng = np.random.default_rng(at)
    box = (rng.standard_normal((2, 3)) * 10.0 ** rng.integers(-30, 30, (2, 3))).astype(np.float32)
    assert largest_abs(box) == float(np.max(np.abs(box)))
    box.reshape(-1)[at] = np.nan  # a NaN in any of the six places, as np.max would
    assert math.isnan(largest_abs(box)) and scale_exponent(box) == 0
    with pytest.raises(MeshError, match="nan"):
        check_trace_range(box, 1.0)
    box.reshape(-1)[at] = -np.inf
    assert largest_abs(box) == math.inf and scale_exponent(box) == 0


def tiny_triangle_mesh(size):
    # a unit triangle and a tiny one near the origin, where float32 resolves it
    V = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0],
                  [0, 0, 0.5], [size, 0, 0.5], [0, size, 0.5]], np.float32)
    return V, np.array([[0, 1, 2], [3, 4, 5]], np.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case, message", [
    ("huge", r"largest absolute coordinate is 1e\+31, outside .* \[2\^-100, 2\^100\)"),
    ("tiny", r"largest absolute coordinate is 1e-31, outside .* \[2\^-100, 2\^100\)"),
    ("small triangle", r"triangle 1 is too small .* largest side of its box is 1e-13; "
                       r"usable triangle sizes at this scale are >= 1\.8\d*e-12"),
])
def test_meshes_float32_cannot_trace_are_refused(device, case, message):
    if case == "small triangle":
        V, F = tiny_triangle_mesh(1e-13)
    else:
        V, F = tiny_triangle_mesh(0.5)
        V = V * np.float32(1e31 if case == "huge" else 1e-31)
    with pytest.raises(MeshError, match=message):
        kd.build(V, F, device=device)


def test_range_check_takes_the_root_box():
    # the GPU builder calls it with the box and the smallest triangle it reduced
    bounds = np.array([[-1, 0, 0], [0.75, 0.5, 0.5]], np.float32)  # scale 1/2
    check_trace_range(bounds, 2.0 ** -39)
    with pytest.raises(MeshError, match="triangle 7 is too small"):
        check_trace_range(bounds, 2.0 ** -40, triangle=7)
    with pytest.raises(MeshError, match="a triangle is too small"):
        check_trace_range(bounds, 1e-30)
    check_trace_range(bounds * np.float32(2.0 ** 99), 2.0 ** 60)
    with pytest.raises(MeshError, match="outside"):
        check_trace_range(bounds * np.float32(2.0 ** 100), 2.0 ** 60)
    smallest = np.array([[0, 0, 0], [2.0 ** -100, 0, 0]], np.float32)
    check_trace_range(smallest, 2.0 ** -139)
    with pytest.raises(MeshError, match="outside"):
        check_trace_range(smallest * np.float32(0.5), 2.0 ** -139)


def test_smallest_triangle_skips_degenerate_ones():
    V, F = tiny_triangle_mesh(1e-3)
    V = np.concatenate([V, np.zeros((1, 3), np.float32)])
    F = np.concatenate([F, [[6, 6, 6]]]).astype(np.int32)
    _, _, tri_lo, tri_hi, valid, _ = prepare_mesh(V, F)
    size, index = smallest_triangle(tri_lo, tri_hi, valid)
    assert index == 1 and size == np.float32(1e-3)
    assert smallest_triangle(tri_lo, tri_hi, np.zeros(3, bool)) == (math.inf, -1)
