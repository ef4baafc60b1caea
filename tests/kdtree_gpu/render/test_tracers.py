"""Ray casting back ends of the path tracer (kdtree_gpu.render.tracers)."""

import numpy as np

from kdtree_gpu.render import Renderer
from kdtree_gpu.render.tracers import BruteForceTracer, KdTreeTracer


def test_brute_force_tracer_hits_and_misses():
    V = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], np.float32)
    F = np.array([[0, 1, 2]], np.int32)
    tracer = BruteForceTracer(np, V, F)
    O = np.array([[0.25, 0.25, 1], [2, 2, 1], [0.25, 0.25, 1]], np.float32)
    D = np.array([[0, 0, -1], [0, 0, -1], [0, 0, -1]], np.float32)
    hit = tracer.intersect(O, D, np.zeros(3, np.float32), np.array([np.inf, np.inf, 0.5], np.float32))
    np.testing.assert_array_equal(hit.hit_tri, [0, -1, -1])
    np.testing.assert_allclose(hit.hit_t[0], 1.0)
    np.testing.assert_allclose([hit.hit_u[0], hit.hit_v[0]], [0.25, 0.25])


def test_kdtree_tracer_on_cpu_matches_brute_force_and_skips_dead_rays(render_helpers):
    # the rays of a render: from inside the room in all directions; every
    # third ray dead (empty interval, as the stages mark them) with a zero
    # direction the CPU entry point would reject
    renderer = Renderer(render_helpers.box_room(), 4, 4, device="cpu")
    scene = renderer.scene
    kd = KdTreeTracer(renderer.tree, "cpu")
    brute = BruteForceTracer(np, scene.vertices, scene.faces)
    rng = np.random.default_rng(1)
    n = 600
    origin = rng.uniform(0.05, 0.95, (n, 3)).astype(np.float32)
    direction = rng.normal(size=(n, 3)).astype(np.float32)
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    tmax = np.full(n, np.inf, np.float32)
    tmax[::3] = -1
    direction[::3] = 0
    tmin = np.zeros(n, np.float32)
    a, b = kd.intersect(origin, direction, tmin, tmax), brute.intersect(origin, direction, tmin, tmax)
    dead = tmax < tmin
    assert np.all(a.hit_tri[dead] == -1) and np.all(np.isinf(a.hit_t[dead]))
    assert np.all(a.hit_tri[~dead] >= 0)  # a closed room
    assert np.mean(a.hit_tri == b.hit_tri) > 0.99
    np.testing.assert_allclose(a.hit_t[~dead], b.hit_t[~dead], rtol=1e-4)
    short = np.where(dead, -1, 0.5 * a.hit_t).astype(np.float32)
    assert not kd.occluded(origin, direction, tmin, short).any()
    far = np.where(dead, -1, 2 * a.hit_t).astype(np.float32)
    np.testing.assert_array_equal(kd.occluded(origin, direction, tmin, far), ~dead)
    np.testing.assert_array_equal(brute.occluded(origin, direction, tmin, far), ~dead)
