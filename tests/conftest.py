"""Shared fixtures: the mesh folder, the ``gpu`` marker, a seeded RNG, test trees."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kdtree_gpu import encoding as enc
from kdtree_gpu.config import SAHConfig
from kdtree_gpu.mesh import prepare_mesh
from kdtree_gpu.tree import KdTree

# the mesh folder that sits beside the checkout, where there is one
SHARED_MESH_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "meshes"

# Point KDTREE_GPU_MESH_DIR at the shared folder when nobody chose one, so that
# tests using real meshes run wherever that folder exists and skip elsewhere.
if not os.environ.get("KDTREE_GPU_MESH_DIR") and SHARED_MESH_DIR.is_dir():
    os.environ["KDTREE_GPU_MESH_DIR"] = str(SHARED_MESH_DIR)


def gpu_usable() -> bool:
    """True when CuPy imports and sees a usable CUDA device."""
    try:
        import cupy

        return bool(cupy.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_usable():
        return
    skip_gpu = pytest.mark.skip(reason="no usable CUDA GPU for CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def mesh_path():
    """Path of a real mesh by name (skips the test when the mesh folder lacks it)."""

    def find(name):
        folder = os.environ.get("KDTREE_GPU_MESH_DIR")
        path = os.path.join(folder or "", name + ".ply")
        if not folder or not os.path.isfile(path):
            pytest.skip(f"mesh {name} not found (set KDTREE_GPU_MESH_DIR)")
        return path

    return find


@pytest.fixture
def rng():
    """A NumPy generator with a fixed seed (same numbers on every run)."""
    return np.random.default_rng(12345)


@pytest.fixture(scope="session")
def mesh_dir():
    """The real-mesh folder, or skip the test when it is not there."""
    value = os.environ.get("KDTREE_GPU_MESH_DIR")
    if not value or not Path(value).is_dir():
        pytest.skip("no mesh folder (set KDTREE_GPU_MESH_DIR)")
    return Path(value)


def require_mesh(name: str) -> Path:
    """Path of a real mesh in the mesh folder, or skip the calling test."""
    value = os.environ.get("KDTREE_GPU_MESH_DIR")
    if not value:
        pytest.skip("no mesh folder (set KDTREE_GPU_MESH_DIR)")
    path = Path(value) / name
    if not path.is_file():
        pytest.skip(f"mesh {name} not found in {value}")
    return path


def build_median_tree(vertices, faces, leaf_size=4, max_depth=24) -> KdTree:
    """A simple kd-tree for tests: split the longest axis at the median centroid.

    Independent of the SAH builders, so that tree checks, files and ray
    queries can be tested on their own. Triangles are classified by their
    float32 boxes as in build rule R9 (``hi <= p`` left, ``lo >= p`` right,
    else both).
    """
    V, F, tri_lo, tri_hi, valid, bounds = prepare_mesh(vertices, faces)
    node_axis, node_split, node_child, node_count = [enc.AXIS_LEAF], [0.0], [0], [0]
    leaf_lists = []
    stack = [(0, np.flatnonzero(valid), bounds[0].copy(), bounds[1].copy(), 0)]
    while stack:
        node, tris, lo, hi, depth = stack.pop()
        axis = int(np.argmax(hi - lo))
        split = None
        if tris.size > leaf_size and depth < max_depth:
            centre = 0.5 * (tri_lo[tris, axis] + tri_hi[tris, axis])
            split = np.float32(np.median(centre))
            if not lo[axis] < split < hi[axis]:
                split = np.float32(0.5 * (float(lo[axis]) + float(hi[axis])))
            if not lo[axis] < split < hi[axis]:
                split = None
        if split is not None:
            left_only = tri_hi[tris, axis] <= split
            right_only = (tri_lo[tris, axis] >= split) & ~left_only
            go_left, go_right = ~right_only, ~left_only
            left, right = tris[go_left], tris[go_right]
            if left.size == tris.size or right.size == tris.size:
                split = None
        if split is None:
            node_count[node] = tris.size
            leaf_lists.append((node, np.sort(tris)))
            continue
        child = len(node_axis)
        node_axis[node], node_split[node], node_child[node] = axis, split, child
        node_axis += [enc.AXIS_LEAF] * 2
        node_split += [0.0, 0.0]
        node_child += [0, 0]
        node_count += [0, 0]
        left_hi = hi.copy()
        left_hi[axis] = split
        right_lo = lo.copy()
        right_lo[axis] = split
        stack.append((child + 1, right, right_lo, hi, depth + 1))
        stack.append((child, left, lo, left_hi, depth + 1))
    offset = 0
    parts = []
    for node, tris in sorted(leaf_lists, key=lambda x: x[0]):
        node_child[node] = offset
        offset += tris.size
        parts.append(tris)
    leaf_tris = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return KdTree(np.array(node_axis, np.int8), np.array(node_split, np.float32),
                  np.array(node_child, np.int32), np.array(node_count, np.int32),
                  leaf_tris, bounds, V, F, SAHConfig(),
                  num_degenerate=int((~valid).sum()), build_info={"builder": "test-median"})


def build_test_tree(vertices, faces) -> KdTree:
    """A full-SAH tree from the CPU reference builder (``cpu_reference.build``)."""
    from cpu_reference import build

    return build(vertices, faces)


@pytest.fixture(scope="session")
def make_tree():
    """Fixture form of :func:`build_test_tree`: ``make_tree(vertices, faces)``."""
    return build_test_tree


@pytest.fixture(scope="session")
def mesh_file():
    """Fixture form of :func:`require_mesh`: ``mesh_file("suzanne.ply")`` or skip."""
    return require_mesh


@pytest.fixture(scope="session")
def has_gpu():
    """Whether CuPy sees a usable CUDA GPU."""
    return gpu_usable()


@pytest.fixture(scope="session")
def make_median_tree():
    """Fixture form of :func:`build_median_tree`."""
    return build_median_tree
