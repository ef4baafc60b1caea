"""Parallel builds: any thread count and any cut into tasks give the same tree.

The tasks (:mod:`cpu_reference.tasks`) cut the tree into subtrees at nodes
above ``split_above`` triangles. Small values make many tasks on small
scenes, so that every stitch (a task's root in its parent's place, leaves
appended, children adjacent) is exercised; the trees must equal the
single-task build array for array, and the naive builder's from the root.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import cpu_reference
from cpu_reference import naive, tasks, wald_havran
from kdtree_gpu import KdTree, SAHConfig
from kdtree_gpu.mesh import prepare_mesh

ARRAYS = ("node_axis", "node_split", "node_child", "node_count", "leaf_tris")


# --- scene generators: (rng, n) -> (vertices, faces) ---------------------------
def make_soup(rng, n):
    """Random triangles of mixed sizes in a box."""
    centre = rng.uniform(-1, 1, size=(n, 1, 3))
    size = rng.choice([0.02, 0.2, 0.8], size=(n, 1, 1))
    V = (centre + size * rng.normal(size=(n, 3, 3))).reshape(-1, 3).astype(np.float32)
    return V, np.arange(3 * n, dtype=np.int32).reshape(n, 3)


def make_planar_grid(rng, n):
    """Axis-aligned quads on an integer grid: planar triangles and tied positions."""
    tris = []
    while len(tris) < n:
        axis = int(rng.integers(3))
        u, v = [k for k in range(3) if k != axis]
        lo = rng.integers(0, 6, size=3)
        hi = lo + rng.integers(1, 3, size=3)
        c = np.zeros((4, 3))
        for corner, (su, sv) in enumerate(((0, 0), (1, 0), (1, 1), (0, 1))):
            c[corner, axis] = lo[axis]
            c[corner, u] = hi[u] if su else lo[u]
            c[corner, v] = hi[v] if sv else lo[v]
        tris += [c[[0, 1, 2]], c[[0, 2, 3]]]
    V = np.array(tris[:n], dtype=np.float32).reshape(-1, 3)
    return V, np.arange(V.shape[0], dtype=np.int32).reshape(-1, 3)


def make_duplicates(rng, n):
    """A coarse soup with triangles repeated by index and by value."""
    V, F = make_soup(rng, max(1, n // 2))
    V = np.round(V * 4) / 4
    pick = rng.integers(0, F.shape[0], size=n - F.shape[0])
    by_index = F[pick[: len(pick) // 2]]
    extra = V[F[pick[len(pick) // 2:]]].reshape(-1, 3)
    by_value = np.arange(V.shape[0], V.shape[0] + extra.shape[0], dtype=np.int32).reshape(-1, 3)
    V = np.concatenate([V, extra]).astype(np.float32)
    F = np.concatenate([F, by_index, by_value])
    return V, F[rng.permutation(F.shape[0])]


def make_needles(rng, n):
    """Long thin triangles across the scene, among small ones: many straddle every plane."""
    V, F = make_soup(rng, n)
    tris = V[F]
    long = rng.random(n) < 0.3
    axis = rng.integers(0, 3, size=n)
    for i in np.flatnonzero(long):
        tris[i, 1] = tris[i, 0] + 1e-3 * rng.normal(size=3)
        tris[i, 2, axis[i]] = tris[i, 0, axis[i]] + rng.choice([-3.0, 3.0])
    V = tris.reshape(-1, 3).astype(np.float32)
    return V, np.arange(3 * n, dtype=np.int32).reshape(n, 3)


GENERATORS = {"soup": make_soup, "planar_grid": make_planar_grid,
              "duplicates": make_duplicates, "needles": make_needles}

# settings cycled over the seeds: depth and leaf limits cut subtrees short
CONFIG_VARIANTS = [{}, {"leaf_size": 2}, {"max_depth": 4}, {"leaf_size": 1, "max_depth": 7},
                   {"k_traversal": 1.0, "k_intersect": 1.5, "empty_bonus": 1.0}]


def arrays_of(V, F, config, threads, split_above, pool_capacity=0, progress=None):
    V32, F32, tri_lo, tri_hi, valid, bounds = prepare_mesh(V, F)
    max_depth = config.resolved_max_depth(int(valid.sum()))
    return wald_havran._build_arrays(
        V32, F32, tri_lo, tri_hi, valid, bounds, config.k_traversal, config.k_intersect,
        config.empty_bonus, config.leaf_size, max_depth, config.axes == "longest", config.clip,
        pool_capacity, threads=threads, split_above=split_above, progress=progress)


def root_and_builder(V, F, config, split_above):
    """The first task and the task runner of a build, as ``_build_arrays`` makes them."""
    V32, F32, tri_lo, tri_hi, valid, bounds = prepare_mesh(V, F)
    max_depth = config.resolved_max_depth(int(valid.sum()))
    pos, kind, tri, count = wald_havran.sorted_root_events(tri_lo, tri_hi, valid)
    root = tasks.Subtree(key=(), event_pos=pos, event_kind=kind, event_tri=tri,
                         event_start=np.zeros(3, np.int64), event_count=count,
                         num_tris=int(valid.sum()), depth=0, box_lo=bounds[0].copy(),
                         box_hi=bounds[1].copy())
    builder = tasks.SubtreeBuilder(V32, F32, config.k_traversal, config.k_intersect,
                                   config.empty_bonus, config.leaf_size, max_depth,
                                   config.axes == "longest", config.clip, split_above)
    return root, builder


def tree_of(arrays, V, F, config):
    V32, F32, _, _, valid, bounds = prepare_mesh(V, F)
    return KdTree(**dict(zip(ARRAYS, arrays)), bounds=bounds, vertices=V32, faces=F32,
                  config=config, num_degenerate=int((~valid).sum()))


def assert_arrays_equal(a, b, label):
    for name, x, y in zip(ARRAYS, a, b):
        np.testing.assert_array_equal(x, y, err_msg=f"{label}: {name}")


@pytest.mark.parametrize("axes", ["all", "longest"])
@pytest.mark.parametrize("clip", [False, True], ids=["noclip", "clip"])
@pytest.mark.parametrize("generator", list(GENERATORS))
def test_tasks_and_threads_give_the_single_task_tree(generator, clip, axes):
    many_tasks = 0
    for seed in range(6):
        rng = np.random.default_rng([seed, list(GENERATORS).index(generator), 11])
        V, F = GENERATORS[generator](rng, int(rng.integers(20, 160)))
        config = SAHConfig(clip=clip, axes=axes, **CONFIG_VARIANTS[seed % len(CONFIG_VARIANTS)])
        label = f"{generator} seed={seed} {config}"
        whole, one = arrays_of(V, F, config, threads=1, split_above=10**9)
        assert one == 1
        whole_tree = tree_of(whole, V, F, config)
        for split_above in (0, 8, 40):
            cut, num_tasks = arrays_of(V, F, config, 1, split_above)
            # another cut lays the nodes out in another order: the same tree from the root
            tree = tree_of(cut, V, F, config)
            tree.check()
            diff = tree.compare(whole_tree)
            assert diff is None, f"{label} split_above={split_above}: {diff}"
            # the cut does not depend on the threads: equal arrays
            for threads in (2, 3):
                again, _ = arrays_of(V, F, config, threads, split_above)
                assert_arrays_equal(again, cut, f"{label} threads={threads} {split_above=}")
            many_tasks += num_tasks > 3
    assert many_tasks > 0


@pytest.mark.parametrize("clip", [False, True], ids=["noclip", "clip"])
def test_many_tasks_match_the_naive_builder(clip):
    rng = np.random.default_rng(21)
    for generator in GENERATORS.values():
        V, F = generator(rng, 60)
        config = SAHConfig(clip=clip)
        arrays, num_tasks = arrays_of(V, F, config, threads=2, split_above=4)
        slow = naive.build(V, F, config)
        tree = tree_of(arrays, V, F, config)
        tree.check()
        assert tree.compare(slow) is None
        assert num_tasks > 3


@pytest.mark.parametrize("clip", [False, True], ids=["noclip", "clip"])
def test_public_build_is_the_same_for_every_thread_count(clip):
    # big enough for the default cut (SPLIT_ABOVE_MIN triangles) to make tasks
    rng = np.random.default_rng(4)
    V, F = make_needles(rng, 6000)
    config = SAHConfig(clip=clip, leaf_size=2)
    one = cpu_reference.build(V, F, config, threads=1)
    assert one.build_info["threads"] == 1
    assert one.build_info["subtrees"] > 1
    one.check()
    for threads in (2, 3, None):
        tree = cpu_reference.build(V, F, config, threads=threads)
        assert tree.compare(one) is None
        assert_arrays_equal([getattr(tree, a) for a in ARRAYS],
                            [getattr(one, a) for a in ARRAYS], f"threads={threads}")
        assert tree.build_info["threads"] == (threads or wald_havran.resolve_threads(None))
    # leaves ascending
    for node in np.flatnonzero(one.leaf_mask()):
        start = one.node_child[node]
        assert np.all(np.diff(one.leaf_tris[start:start + one.node_count[node]]) > 0)


def test_small_pools_grow_inside_tasks():
    rng = np.random.default_rng(8)
    V, F = make_soup(rng, 300)
    config = SAHConfig(clip=True)
    large, _ = arrays_of(V, F, config, threads=1, split_above=30)
    small, _ = arrays_of(V, F, config, threads=2, split_above=30, pool_capacity=1)
    assert_arrays_equal(small, large, "pool_capacity=1")


def test_build_info_records_threads_and_times():
    rng = np.random.default_rng(2)
    V, F = make_soup(rng, 50)
    tree = cpu_reference.build(V, F, threads=2)
    info = tree.build_info
    assert info["builder"] == "cpu_reference"
    assert info["threads"] == 2
    assert info["seconds"] >= info["build_seconds"] > 0
    assert info["compile_seconds"] >= 0 and isinstance(info["compiled"], bool)
    assert info["subtrees"] >= 1


@pytest.mark.parametrize("threads, error", [(0, ValueError), (-2, ValueError), (1.5, TypeError),
                                            ("2", TypeError), (True, TypeError)])
def test_bad_thread_counts_raise(threads, error):
    V, F = make_soup(np.random.default_rng(1), 4)
    with pytest.raises(error, match="threads"):
        cpu_reference.build(V, F, threads=threads)


# --- progress ---------------------------------------------------------------------
@pytest.mark.parametrize("threads", [1, 2])
def test_progress_is_monotone_from_0_to_1(threads):
    rng = np.random.default_rng(9)
    V, F = make_soup(rng, 400)
    seen = []
    arrays_of(V, F, SAHConfig(), threads, split_above=8, progress=seen.append)
    assert seen[0] == 0.0 and seen[-1] == 1.0
    assert all(0.0 <= f <= 1.0 for f in seen)
    assert all(a <= b for a, b in zip(seen, seen[1:]))


def test_public_build_reports_progress_in_the_calling_thread():
    rng = np.random.default_rng(10)
    V, F = make_soup(rng, 5000)
    seen = []
    caller = threading.get_ident()

    def record(fraction):
        assert threading.get_ident() == caller
        seen.append(fraction)

    cpu_reference.build(V, F, threads=2, progress=record)
    assert seen[0] == 0.0 and seen[-1] == 1.0
    assert all(a <= b for a, b in zip(seen, seen[1:]))


def test_progress_reporter_adds_weights_and_limits_its_rate():
    seen = []
    reporter = tasks.ProgressReporter(seen.append, interval=0.0)
    reporter.start()
    for w in (0.25, 0.25, 0.5, 0.1):  # rounding may pass 1: held below it until the end
        reporter.add(w)
    reporter.finish()
    assert seen == [0.0, 0.25, 0.5, 0.999, 0.999, 1.0]
    slow = []
    reporter = tasks.ProgressReporter(slow.append, interval=3600.0)
    reporter.start()
    for _ in range(100):
        reporter.add(0.01)
    reporter.finish()
    assert slow == [0.0, 1.0]


def test_finished_weights_sum_to_one():
    rng = np.random.default_rng(12)
    V, F = make_soup(rng, 200)
    root, builder = root_and_builder(V, F, SAHConfig(clip=True), split_above=6)
    finished = []

    def build(task):
        built = builder(task)
        if not built.children:
            finished.append(task.weight)
        return built

    tasks.run_subtrees(root, build, 2)
    assert len(finished) > 3
    assert sum(finished) == pytest.approx(1.0)


# --- the scheduler ------------------------------------------------------------------
def fake_task(key, num_tris):
    zeros = np.zeros((3, 1))
    return tasks.Subtree(key=key, event_pos=zeros, event_kind=zeros, event_tri=zeros,
                         event_start=np.zeros(3, np.int64), event_count=np.zeros(3, np.int64),
                         num_tris=num_tris, depth=len(key), box_lo=np.zeros(3),
                         box_hi=np.ones(3))


@pytest.mark.parametrize("threads", [1, 3])
def test_a_failing_task_raises_in_the_caller(threads):
    def build(task):
        if len(task.key) == 2:
            raise MemoryError("no room")
        children = [(i + 1, fake_task(task.key + (i,), task.num_tris // 2)) for i in range(2)]
        empty = np.zeros(0)
        return tasks.BuiltSubtree(empty, empty, empty, empty, empty, children)

    with pytest.raises(MemoryError, match="no room"):
        tasks.run_subtrees(fake_task((), 100), build, threads)


def test_a_failing_progress_callback_stops_the_build():
    built = []

    def build(task):
        time.sleep(0.001)
        built.append(task.key)
        children = ([(i + 1, fake_task(task.key + (i,), task.num_tris // 2)) for i in range(2)]
                    if len(task.key) < 8 else [])
        empty = np.zeros(0)
        return tasks.BuiltSubtree(empty, empty, empty, empty, empty, children)

    def progress(fraction):
        if fraction > 0:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tasks.run_subtrees(fake_task((), 100), build, 2, progress, progress_interval=0.0)
    time.sleep(0.05)  # tasks already running end on their own, and no new ones start
    assert len(built) < 2 ** 9 - 1


def test_largest_tasks_run_first():
    order = []

    def build(task):
        order.append(task.num_tris)
        children = []
        if task.key == ():
            children = [(1, fake_task((0,), 10)), (2, fake_task((1,), 50))]
        elif task.key == (0,):
            children = [(1, fake_task((0, 0), 5)), (2, fake_task((0, 1), 4))]
        empty = np.zeros(0)
        return tasks.BuiltSubtree(empty, empty, empty, empty, empty, children)

    tasks.run_subtrees(fake_task((), 100), build, 1)
    assert order == [100, 50, 10, 5, 4]
