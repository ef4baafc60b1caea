"""Random numbers and sampling arithmetic (kdtree_gpu.render.sampling)."""

import numpy as np

from kdtree_gpu.render import sampling as S


def test_pcg_hash_array_matches_scalar():
    x = np.array([0, 1, 2, 12345, 0xFFFFFFFF, 0x80000000], dtype=np.uint32)
    expected = [S.pcg_hash_scalar(int(v)) for v in x]
    np.testing.assert_array_equal(S.pcg_hash(np, x), np.array(expected, dtype=np.uint32))
    u = S.uniform_from_key(np, np.arange(100000, dtype=np.uint32), S.stream_salt(3, 2))
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01


def test_path_keys_chain_the_seed_sample_and_pixel_hashes():
    sample = np.array([0, 0, 5], np.uint32)
    pixel = np.array([0, 7, 7], np.int32)
    keys = S.path_keys(np, 42, sample, pixel)
    seed = S.pcg_hash_scalar(42)
    expected = [S.pcg_hash_scalar((S.pcg_hash_scalar((int(s) + seed) & 0xFFFFFFFF) + int(p))
                                  & 0xFFFFFFFF) for s, p in zip(sample, pixel)]
    np.testing.assert_array_equal(keys, np.array(expected, np.uint32))
    assert S.seed_hash(42) == np.uint32(seed)


def test_orthonormal_basis_is_orthonormal():
    rng = np.random.default_rng(0)
    n = rng.normal(size=(1000, 3))
    n = (n / np.linalg.norm(n, axis=1, keepdims=True)).astype(np.float32)
    n[0] = [0, 0, -1]
    n[1] = [0, 0, 1]
    t, b = S.orthonormal_basis(np, n)
    for a, c in ((t, b), (t, n), (b, n)):
        assert np.abs(np.sum(a * c, axis=1)).max() < 1e-5
    assert np.abs(np.linalg.norm(t, axis=1) - 1).max() < 1e-5


def test_power_heuristic_weights_sum_to_one():
    a = np.array([1.0, 2.0, 0.0, 0.0], np.float32)
    b = np.array([1.0, 1.0, 3.0, 0.0], np.float32)
    wa, wb = S.power_heuristic(np, a, b), S.power_heuristic(np, b, a)
    np.testing.assert_allclose(wa, [0.5, 0.8, 0.0, 0.0])
    np.testing.assert_allclose((wa + wb)[:3], 1.0)
    assert wa.dtype == np.float32 and wb[3] == 0
