"""KdTree's constructors."""

import numpy as np

import kdtree_gpu as kd
from kdtree_gpu.testing.meshes import soup
from kdtree_gpu.tree.kdtree import ARRAY_DTYPES


def test_a_tree_from_builder_arrays_is_the_checked_constructors_tree():
    # _from_builder takes a builder's arrays as they are (the GPU builder's
    # tree; tests/kdtree_gpu/builder/test_builder.py holds its CuPy arrays to
    # the checked constructor's); the rest of the tree's state is the same.
    V, F = soup(np.random.default_rng(3), 200)
    checked = kd.build(V, F, device="cpu")
    arrays = {name: checked.device_array(name) for name in ARRAY_DTYPES}
    info = {"builder": "levels"}
    tree = kd.KdTree._from_builder(arrays, "cpu", checked.config, checked.num_degenerate, info,
                                   host_bounds=checked.bounds.astype(np.float64))
    assert tree.device == "cpu" and tree.build_info is info
    assert tree.config == checked.config and tree.num_degenerate == checked.num_degenerate
    assert tree.compare(checked) is None
    kept = tree._host["bounds"]
    assert kept.dtype == np.float32 and kept.shape == (2, 3) and not kept.flags.writeable
    np.testing.assert_array_equal(kept, checked.bounds)
    assert tree._device_cache == {}
    t, tri, _, _ = tree.intersect(np.zeros((1, 3)) + V.mean(axis=0), np.array([[0.0, 0.0, 1.0]]))
    t0, tri0, _, _ = checked.intersect(np.zeros((1, 3)) + V.mean(axis=0),
                                       np.array([[0.0, 0.0, 1.0]]))
    np.testing.assert_array_equal(tri, tri0)
    np.testing.assert_array_equal(t, t0)
