"""The CPU traversal answers each ray alone: packets and the ray order change no bit.

kdtree_gpu.trace.cpu traces rays in packets of eight and puts incoherent
rays in a cache-friendly order first; every lane must still decide as a lone
ray would, so an answer cannot depend on the batch a ray comes in.
"""

import numpy as np
import pytest
import trimesh

from kdtree_gpu import testing
from kdtree_gpu.trace import cpu
from kdtree_gpu.trace.ray_order import ray_order


def torus_tree(make_tree):
    mesh = trimesh.creation.torus(major_radius=1.0, minor_radius=0.3, major_sections=64,
                                  minor_sections=32)
    return make_tree(np.asarray(mesh.vertices, np.float32), np.asarray(mesh.faces, np.int32))


def camera_rays(bounds, width, height):
    """A pinhole camera's rays, row by row (a coherent order)."""
    lo, hi = bounds.astype(np.float64)
    centre, radius = 0.5 * (lo + hi), 0.5 * np.linalg.norm(hi - lo)
    eye = centre + np.array([0.3, 0.5, 1.0]) * 2 * radius
    x, y = np.meshgrid(np.linspace(-1, 1, width), np.linspace(-1, 1, height))
    target = centre + radius * np.stack([x, y, np.zeros_like(x)], axis=-1).reshape(-1, 3)
    directions = target - eye
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    origins = np.broadcast_to(eye, directions.shape)
    return origins.astype(np.float32), directions.astype(np.float32)


def trace(tree, O, D, t0=None, t1=None, any_hit=False):
    n = O.shape[0]
    t0 = np.zeros(n, np.float32) if t0 is None else t0
    t1 = np.full(n, np.inf, np.float32) if t1 is None else t1
    O, D = np.ascontiguousarray(O), np.ascontiguousarray(D)
    if any_hit:
        return (cpu.occluded_cpu(tree, O, D, t0, t1),)
    return cpu.intersect_cpu(tree, O, D, t0, t1)


def assert_identical(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("any_hit", [False, True])
def test_any_order_gives_the_same_answers(make_tree, rng, any_hit):
    tree = torus_tree(make_tree)
    O, D, t0, t1 = testing.random_rays(tree.bounds, 30_000, rng, unit=False, intervals=0.3)
    base = trace(tree, O, D, t0, t1, any_hit)
    assert 0.2 < np.mean(base[0] if any_hit else base[1] >= 0) < 0.9
    perm = rng.permutation(len(O))
    shuffled = trace(tree, O[perm], D[perm], t0[perm], t1[perm], any_hit)
    assert_identical(shuffled, tuple(a[perm] for a in base))


def test_coherent_rays_keep_their_order_and_agree_with_a_shuffle(make_tree, rng):
    tree = torus_tree(make_tree)
    O, D = camera_rays(tree.bounds, 160, 120)
    assert ray_order(tree.bounds, O, D) is None  # row by row: traced as given
    perm = rng.permutation(len(O))
    assert ray_order(tree.bounds, O[perm], D[perm]) is not None
    base = trace(tree, O, D)
    assert 0.1 < np.mean(base[1] >= 0) < 0.9
    assert_identical(trace(tree, O[perm], D[perm]), tuple(a[perm] for a in base))


@pytest.mark.parametrize("any_hit", [False, True])
def test_branch_free_descent_changes_no_bit(make_tree, rng, any_hit):
    # sorted (incoherent) rays choose children with selects, others with
    # branches: the same rays through both, in both orders, answer alike
    from kdtree_gpu.trace.layout import cpu_layout

    tree = torus_tree(make_tree)
    lay = cpu_layout(tree)
    O, D, t0, t1 = testing.random_rays(tree.bounds, 20_000, rng, unit=False, intervals=0.3,
                                       special=0.1)
    n = len(O)
    answers = []
    for branch_free in (False, True):
        out = (np.empty(n, np.float32), np.empty(n, np.int32), np.empty(n, np.float32),
               np.empty(n, np.float32))
        bad = np.empty(((n + cpu.RAY_CHUNK - 1) // cpu.RAY_CHUNK, 2), np.int64)
        cpu._trace_rays(lay.nodes, lay.splits, lay.tris, lay.tri_ids, lay.box, lay.scale, O, D,
                        t0, t1, any_hit, lay.stack_size, *out, np.empty(0, np.int32),
                        branch_free, bad)
        answers.append(out)
    assert 0.1 < np.mean(answers[0][1] >= 0 if not any_hit else answers[0][1] > 0) < 0.9
    assert_identical(answers[0], answers[1])


def test_a_ray_alone_gets_its_answer_in_a_batch(make_tree, rng):
    # packets of one lane, and small batches that are not sorted
    tree = torus_tree(make_tree)
    O, D, t0, t1 = testing.random_rays(tree.bounds, 20_000, rng, unit=False, intervals=0.3,
                                       special=0.2)
    batch = trace(tree, O, D, t0, t1)
    for i in rng.choice(len(O), 200, replace=False):
        alone = trace(tree, O[i:i + 1], D[i:i + 1], t0[i:i + 1], t1[i:i + 1])
        assert_identical(alone, tuple(a[i:i + 1] for a in batch))


def test_ray_order_is_a_permutation_sorted_by_key(rng):
    bounds = np.array([[-1, -1, -1], [1, 1, 1]], np.float32)
    O, D, _, _ = testing.random_rays(bounds, 50_000, rng)
    order = ray_order(bounds, O, D)
    np.testing.assert_array_equal(np.sort(order), np.arange(len(O)))
    # neighbours in the order share the octant far more often than at random
    octant = (D < 0) @ np.array([1, 2, 4])
    assert np.mean(octant[order][1:] == octant[order][:-1]) > 0.99
    assert ray_order(bounds, O[:100], D[:100]) is None  # too few to sort


@pytest.mark.parametrize("intervals", ["scalar", "arrays"])
def test_compiled_ray_checks_equal_the_numpy_ones(rng, intervals):
    from kdtree_gpu.trace.api import ray_problems

    n = 5000
    O = rng.normal(size=(n, 3)).astype(np.float32)
    D = rng.normal(size=(n, 3)).astype(np.float32)
    specials = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0])
    for a in (O, D):
        rows = rng.choice(n, 600, replace=False)
        a[rows, rng.integers(0, 3, 600)] = rng.choice(specials, 600)
    D[rng.choice(n, 300, replace=False)] = rng.choice([0.0, -0.0], (300, 3))
    if intervals == "scalar":
        t0, t1 = 0.0, np.inf
    else:
        t0 = rng.choice(np.float32([0, 1, np.nan, -np.inf]), n)
        t1 = rng.choice(np.float32([0.5, 2, np.nan, np.inf]), n)
    expected = ray_problems(O, D, t0, t1)
    assert len(np.unique(expected)) >= (4 if intervals == "scalar" else 7)
    np.testing.assert_array_equal(cpu.ray_problems_cpu(O, D, t0, t1), expected)


@pytest.mark.parametrize("any_hit", [False, True])
def test_bad_rays_are_counted_in_the_traversal(make_tree, rng, any_hit):
    # the public call checks the rays inside the traversal: bad rays are
    # misses, the error names the first and counts them as the NumPy checks
    import re

    from kdtree_gpu.trace.api import bad_ray_message, ray_problems

    tree = torus_tree(make_tree)
    O, D, t0, t1 = testing.random_rays(tree.bounds, 30_000, rng, unit=False, intervals=0.3)
    bad = rng.choice(len(O), 300, replace=False)
    for k, i in enumerate(bad):
        which = k % 6
        if which == 0:
            O[i, k % 3] = np.nan
        elif which == 1:
            D[i, k % 3] = -np.inf
        elif which == 2:
            D[i] = 0.0
        elif which == 3:
            t0[i] = np.nan
        elif which == 4:
            t1[i] = np.nan
        else:
            t0[i], t1[i] = 2.0, 1.0
    query = tree.occluded if any_hit else tree.intersect
    result = query(O, D, t0, t1, check=False)
    result = (result,) if any_hit else result
    good = np.ones(len(O), bool)
    good[bad] = False
    expected = trace(tree, O[good], D[good], t0[good], t1[good], any_hit)
    assert_identical(tuple(a[good] for a in result), expected)
    if any_hit:
        assert not result[0][bad].any()
    else:
        assert (result[1][bad] == -1).all() and np.isinf(result[0][bad]).all()
        assert (result[2][bad] == 0).all() and (result[3][bad] == 0).all()
    problem = ray_problems(O, D, t0, t1)
    first = int(np.flatnonzero(problem)[0])
    message = bad_ray_message(first, int(problem[first]), 300, O, D, t0, t1)
    with pytest.raises(ValueError, match=re.escape(message)):
        query(O, D, t0, t1)


def test_clustered_node_order_keeps_the_tree(make_tree):
    # the layout's node order moves nodes, never changes what is below a node
    from kdtree_gpu.trace.layout import reorder_nodes

    tree = torus_tree(make_tree)
    axis, split, child, count = reorder_nodes(tree.node_axis, tree.node_split, tree.node_child,
                                              tree.node_count)
    assert axis[1] == 3 and count[1] == 0  # the empty slot before the first pair

    def walk(axis, split, child, count):
        out, stack = [], [0]
        while stack:
            node = stack.pop()
            out.append((int(axis[node]), float(split[node]), int(count[node]),
                        int(child[node]) if axis[node] == 3 else -1))
            if axis[node] != 3:
                stack += [int(child[node]) + 1, int(child[node])]
        return out

    assert walk(axis, split, child, count) == walk(tree.node_axis, tree.node_split,
                                                   tree.node_child, tree.node_count)
    assert len(axis) == tree.num_nodes + 1
