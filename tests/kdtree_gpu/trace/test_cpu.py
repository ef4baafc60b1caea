"""Tests of the CPU ray queries (kdtree_gpu.trace.cpu through kdtree_gpu.trace)."""

import numpy as np
import pytest
import trimesh

from kdtree_gpu import testing
from kdtree_gpu import trace as raycast
from kdtree_gpu.config import SAHConfig
from kdtree_gpu.trace.brute import brute_cpu
from kdtree_gpu.tree import KdTree

NUM_RAYS = 100_000


def load_ply(path):
    mesh = trimesh.load(path, process=False, force="mesh")
    return np.asarray(mesh.vertices, np.float32), np.asarray(mesh.faces, np.int32)


def random_rays(bounds, n, rng):
    """Rays in and around the box with directions of varying length, a third with a finite interval."""
    return testing.random_rays(bounds, n, rng, unit=False, intervals=1 / 3)


def assert_same_hits(result, expected):
    """Equal answers; the same triangle bit for bit, another only at a tie (kdtree_gpu.testing)."""
    testing.assert_same_hits(result, expected, exact=True)


@pytest.mark.parametrize("name", ["suzanne.ply", "stanford_bunny.ply", "sponza_dabrovic.ply"])
def test_traversal_equals_brute_force(name, make_tree, mesh_file, rng):
    V, F = load_ply(mesh_file(name))
    tree = make_tree(V, F)
    O, D, tmin, tmax = random_rays(tree.bounds, NUM_RAYS, rng)
    result = tree.intersect(O, D, tmin, tmax)
    expected = raycast.intersect_brute(tree, O, D, tmin=tmin, tmax=tmax)
    assert 0.2 < np.mean(expected[1] >= 0) < 1.0  # a mix of hits and misses
    assert_same_hits(result, expected)
    hit_any = tree.occluded(O, D, tmin, tmax)
    np.testing.assert_array_equal(hit_any, raycast.occluded_brute(tree, O, D, tmin=tmin, tmax=tmax))
    np.testing.assert_array_equal(hit_any, expected[1] >= 0)


@pytest.mark.parametrize("name, num_rays", [("suzanne.ply", 20_000), ("stanford_bunny.ply", 400)])
def test_brute_force_culling_changes_nothing(name, num_rays, mesh_file, rng):
    V, F = load_ply(mesh_file(name))
    lo, hi = V.min(axis=0), V.max(axis=0)
    O, D, tmin, tmax = random_rays(np.stack([lo, hi]), num_rays, rng)
    culled = brute_cpu(V, F, O, D, tmin, tmax, cull=True)
    exhaustive = brute_cpu(V, F, O, D, tmin, tmax, cull=False)
    for a, b in zip(culled, exhaustive):
        np.testing.assert_array_equal(a, b)


def test_traversal_equals_brute_force_on_random_soup(make_tree, rng):
    # long thin and overlapping triangles: many references per triangle
    V = rng.normal(size=(3000, 3)).astype(np.float32)
    F = rng.integers(0, 3000, (1000, 3)).astype(np.int32)
    tree = make_tree(V, F)
    O, D, tmin, tmax = random_rays(tree.bounds, 20_000, rng)
    assert_same_hits(tree.intersect(O, D, tmin, tmax),
                     raycast.intersect_brute(V, F, O, D, tmin=tmin, tmax=tmax))


def icosphere_rays(subdivisions):
    mesh = trimesh.creation.icosphere(subdivisions=subdivisions)
    V = np.asarray(mesh.vertices, np.float32)
    F = np.asarray(mesh.faces, np.int32)
    edges = np.asarray(mesh.edges_unique)
    targets = np.concatenate([V.astype(np.float64),
                              0.5 * (V[edges[:, 0]].astype(np.float64) + V[edges[:, 1]])])
    return V, F, targets


@pytest.mark.parametrize("origin", [(0.0, 0.0, 0.0), (0.1, -0.2, 0.05)])
def test_rays_through_vertices_and_edges_never_escape(origin, make_tree):
    V, F, targets = icosphere_rays(subdivisions=3)
    tree = make_tree(V, F)
    O = np.tile(np.float32(origin), (targets.shape[0], 1))
    D = (targets - O).astype(np.float32)
    t, tri, _, _ = tree.intersect(O, D)
    assert np.all(tri >= 0), f"{int(np.sum(tri < 0))} rays escaped"
    assert np.all(tree.occluded(O, D))
    t_ref, tri_ref, _, _ = raycast.intersect_brute(tree, O, D)
    assert np.all(tri_ref >= 0)
    # the hit lies on the sphere (radius 1 up to the mesh's flattening)
    points = O + t[:, None] * D
    assert np.all(np.abs(np.linalg.norm(points, axis=1) - 1) < 0.02)


def test_rays_from_outside_through_vertices_hit(make_tree):
    V, F, targets = icosphere_rays(subdivisions=2)
    tree = make_tree(V, F)
    O = (targets * 3.0).astype(np.float32)
    D = (targets - O).astype(np.float32)
    _, tri, _, _ = tree.intersect(O, D)
    assert np.all(tri >= 0)


def one_triangle_tree():
    V = np.array([[-1, -1, 1], [1, -1, 1], [-1, 1, 1]], np.float32)
    F = np.array([[0, 1, 2]], np.int32)
    return KdTree(np.array([3], np.int8), np.zeros(1, np.float32), np.zeros(1, np.int32),
                  np.ones(1, np.int32), np.zeros(1, np.int32),
                  np.array([[-1, -1, 1], [1, 1, 1]], np.float32), V, F, SAHConfig())


def test_tmin_tmax_are_inclusive_and_respected():
    tree = one_triangle_tree()
    O = np.zeros((6, 3), np.float32)
    D = np.tile(np.float32([0, 0, 1]), (6, 1))
    tmin = np.float32([0, 0, 1, 1.001, 0, -5])
    tmax = np.float32([np.inf, 1, 1, 2, 0.999, -1])
    t, tri, _, _ = tree.intersect(O, D, tmin, tmax)
    np.testing.assert_array_equal(tri, [0, 0, 0, -1, -1, -1])
    np.testing.assert_array_equal(t[:3], [1, 1, 1])
    np.testing.assert_array_equal(tree.occluded(O, D, tmin, tmax), tri >= 0)


def test_direction_length_scales_t_and_backfaces_count():
    tree = one_triangle_tree()
    t, tri, u, v = tree.intersect([0, 0, 0], [0, 0, 2])
    assert t.shape == (1,) and tri[0] == 0 and t[0] == 0.5
    # from behind (two-sided), with tmin below 0: the hit at t = -0.5 counts
    t, tri, _, _ = tree.intersect([0, 0, 3], [0, 0, -4], tmin=-10.0)
    assert tri[0] == 0 and t[0] == 0.5
    t, tri, _, _ = tree.intersect([0, 0, 0], [0, 0, -1], tmin=-10.0)
    assert tri[0] == 0 and t[0] == -1.0


def test_barycentrics_are_weights_of_v1_and_v2(rng):
    tree = one_triangle_tree()
    V = tree.vertices.astype(np.float64)
    w = rng.dirichlet([1, 1, 1], size=500)
    points = w @ V
    O = (points + rng.normal(size=(500, 3)) * 0.5 + [0, 0, 2]).astype(np.float32)
    D = (points - O).astype(np.float32)
    t, tri, u, v = tree.intersect(O, D)
    assert np.all(tri == 0)
    rebuilt = (1 - u - v)[:, None] * V[0] + u[:, None] * V[1] + v[:, None] * V[2]
    np.testing.assert_allclose(rebuilt, O + t[:, None] * D, atol=1e-5)
    np.testing.assert_allclose(u, w[:, 1], atol=1e-5)
    np.testing.assert_allclose(v, w[:, 2], atol=1e-5)


def test_misses_and_equal_t_ties(make_tree):
    # two copies of one square (four triangles); a ray hits a copy of each
    V = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], np.float32)
    F = np.array([[0, 1, 2], [0, 2, 3], [0, 1, 2], [0, 2, 3]], np.int32)
    tree = make_tree(V, F)
    O = np.float32([[0.7, 0.2, 1], [0.2, 0.7, 1], [5, 5, 1]])
    D = np.float32([[0, 0, -1]] * 3)
    t, tri, u, v = tree.intersect(O, D)
    np.testing.assert_array_equal(tri, [0, 1, -1])
    assert t[2] == np.inf and u[2] == 0 and v[2] == 0
    np.testing.assert_array_equal(raycast.intersect_brute(V, F, O, D)[1], [0, 1, -1])


@pytest.mark.parametrize("origins, directions, kwargs, message", [
    ([[0, 0, np.nan]], [[0, 0, 1]], {}, "ray 0 has a NaN or infinite value in its origin"),
    ([[0, 0, 0], [0, 0, 0]], [[0, 0, 1], [np.inf, 0, 1]], {}, "ray 1 .* direction"),
    ([[0, 0, 0], [0, 0, 0]], [[0, 0, 1], [0, 0, 0]], {}, "ray 1 has a zero-length direction"),
    ([[0, 0, 0]], [[0, 0, 1]], {"tmin": 2.0, "tmax": 1.0}, "tmin > tmax"),
    ([[0, 0, 0]], [[0, 0, 1]], {"tmin": np.nan}, "NaN tmin"),
    ([[0, 0, 0]], [[0, 0, 1]], {"tmax": np.zeros(3)}, "tmax must be a scalar or have shape"),
    ([[0, 0, 0, 0]], [[0, 0, 1, 0]], {}, r"origins must have shape \(num_rays, 3\)"),
    ([[0, 0, 0]] * 2, [[0, 0, 1]], {}, "origins has 2 rays but directions has 1"),
    ([[0, 0, 0]], [[0, 0, 1]], {"device": "tpu"}, "device must be one of"),
])
def test_bad_rays_raise(origins, directions, kwargs, message):
    tree = one_triangle_tree()
    with pytest.raises(ValueError, match=message):
        tree.intersect(np.array(origins, np.float64), np.array(directions, np.float64), **kwargs)
    with pytest.raises(ValueError, match=message):
        tree.occluded(np.array(origins, np.float64), np.array(directions, np.float64), **kwargs)


def test_cuda_without_gpu_is_a_clear_error(has_gpu):
    if has_gpu:
        pytest.skip("checks the error without a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        one_triangle_tree().intersect([[0, 0, 0]], [[0, 0, 1]], device="cuda")


def test_empty_ray_batch():
    t, tri, u, v = one_triangle_tree().intersect(np.zeros((0, 3)), np.zeros((0, 3)))
    assert t.shape == tri.shape == (0,)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["suzanne.ply", "stanford_bunny.ply", "sponza_dabrovic.ply"])
def test_gpu_equals_cpu(name, make_tree, mesh_file, rng):
    import cupy

    V, F = load_ply(mesh_file(name))
    tree = make_tree(V, F)
    O, D, tmin, tmax = random_rays(tree.bounds, NUM_RAYS, rng)
    cpu = tree.intersect(O, D, tmin, tmax, device="cpu")
    gpu_numpy = tree.intersect(O, D, tmin, tmax, device="cuda")
    assert all(isinstance(a, np.ndarray) for a in gpu_numpy)
    assert_same_hits(gpu_numpy, cpu)
    gpu = tree.intersect(cupy.asarray(O), cupy.asarray(D), cupy.asarray(tmin), cupy.asarray(tmax))
    assert all(isinstance(a, cupy.ndarray) for a in gpu)
    assert_same_hits(tuple(a.get() for a in gpu), cpu)
    hit_any = tree.occluded(cupy.asarray(O), cupy.asarray(D), tmin, tmax)
    assert isinstance(hit_any, cupy.ndarray)
    np.testing.assert_array_equal(hit_any.get(), tree.occluded(O, D, tmin, tmax))
    brute = raycast.intersect_brute(tree, O, D, tmin=tmin, tmax=tmax, device="cuda")
    assert_same_hits(brute, cpu)


@pytest.mark.gpu
def test_gpu_rays_never_escape_and_bad_rays_raise(make_tree):
    import cupy

    V, F, targets = icosphere_rays(subdivisions=3)
    tree = make_tree(V, F)
    O = cupy.zeros((targets.shape[0], 3), cupy.float32)
    D = cupy.asarray(targets, dtype=cupy.float32)
    _, tri, _, _ = tree.intersect(O, D)
    assert bool((tri >= 0).all())
    D[3] = 0
    with pytest.raises(ValueError, match="ray 3 has a zero-length direction"):
        tree.intersect(O, D)


@pytest.mark.gpu
def test_torch_cuda_tensors_come_back_as_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA")
    tree = one_triangle_tree()
    O = torch.zeros((2, 3), device="cuda")
    D = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, -1.0]], device="cuda")
    t, tri, u, v = tree.intersect(O, D)
    assert isinstance(t, torch.Tensor) and t.is_cuda
    assert tri.cpu().tolist() == [0, -1]


def axis_aligned_rays(bounds, n, rng):
    """Rays along +-x, +-y, +-z whose origins lie on the scene's grid planes.

    Origins use coordinates that are multiples of 0.25 (the planes of the
    quad grid and the Cornell box), so many rays run inside split planes and
    through shared edges and vertices.
    """
    lo, hi = bounds.astype(np.float64)
    steps = np.round((hi - lo) / 0.25).astype(int)
    O = lo + rng.integers(-1, steps + 2, (n, 3)) * 0.25
    D = np.zeros((n, 3))
    axis = rng.integers(0, 3, n)
    D[np.arange(n), axis] = rng.choice([-1.0, 1.0], n) * rng.uniform(0.5, 2, n)
    return O.astype(np.float32), D.astype(np.float32)


@pytest.mark.parametrize("name, kwargs", [("quads", {"n": 8, "layers": 3, "spacing": 0.5}),
                                          ("cornell", {})])
def test_axis_aligned_rays_in_split_planes(name, kwargs, make_tree, rng):
    from kdtree_gpu.scenes import scene_by_name

    scene = scene_by_name(name, **kwargs)
    tree = make_tree(*scene.arrays())
    O, D = axis_aligned_rays(tree.bounds, 20_000, rng)
    expected = raycast.intersect_brute(tree, O, D)
    assert np.mean(expected[1] >= 0) > 0.05
    assert_same_hits(tree.intersect(O, D), expected)
    np.testing.assert_array_equal(tree.occluded(O, D), expected[1] >= 0)
    # and random rays through the same scene
    O, D, tmin, tmax = random_rays(tree.bounds, 20_000, rng)
    assert_same_hits(tree.intersect(O, D, tmin, tmax),
                     raycast.intersect_brute(tree, O, D, tmin=tmin, tmax=tmax))
