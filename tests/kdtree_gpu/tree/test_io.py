"""Tests of kdtree_gpu.tree.io: tree files."""

import contextlib
import os
import stat

import numpy as np
import pytest

import kdtree_gpu as kd
from kdtree_gpu import atomic
from kdtree_gpu.config import SAHConfig
from kdtree_gpu.tree import TreeFileError, load_tree
from kdtree_gpu.tree import io as tree_io
from kdtree_gpu.tree.io import save_tree


@pytest.fixture
def tree(rng, make_median_tree):
    V = rng.random((200, 3)).astype(np.float32)
    F = rng.integers(0, 200, (300, 3)).astype(np.int32)
    F[5] = [3, 3, 4]  # a degenerate triangle
    t = make_median_tree(V, F)
    t.config = SAHConfig(k_traversal=10.0, axes="longest", max_depth=20)
    t.build_info = {"builder": "test", "seconds": np.float64(0.25), "levels": np.arange(3)}
    return t


def assert_trees_equal(a, b):
    for name in tree_io.ARRAY_NAMES:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        np.testing.assert_array_equal(x, y, err_msg=name)
    assert a.config == b.config
    assert a.num_degenerate == b.num_degenerate
    assert a.compare(b) is None


def test_round_trip(tree, tmp_path):
    path = tmp_path / "tree.kdt"
    save_tree(tree, path)
    loaded = load_tree(path, check=True)
    assert_trees_equal(tree, loaded)
    assert loaded.build_info == {"builder": "test", "seconds": 0.25, "levels": [0, 1, 2]}
    assert loaded.num_degenerate == tree.num_degenerate >= 1
    # the public spellings
    tree.save(tmp_path / "again.kdt")
    assert_trees_equal(tree, kd.load_tree(tmp_path / "again.kdt"))
    assert kd.TreeFileError is TreeFileError and issubclass(TreeFileError, ValueError)


def test_file_layout(tree, tmp_path):
    path = tmp_path / "tree.kdt"
    save_tree(tree, path)
    data = path.read_bytes()
    assert data[:8] == tree_io.MAGIC
    header = tree_io.read_header(path)
    assert [e["name"] for e in header["arrays"]] == list(tree_io.ARRAY_NAMES)
    assert all(e["offset"] % tree_io.ALIGN == 0 for e in header["arrays"])
    assert header["num_degenerate"] == tree.num_degenerate and header["config"]["axes"] == "longest"
    leaf_tris = next(e for e in header["arrays"] if e["name"] == "leaf_tris")
    assert leaf_tris["dtype"] == "<i4" and leaf_tris["shape"] == [tree.num_refs]


def test_overwrite_replaces_file(tree, tmp_path):
    path = tmp_path / "tree.kdt"
    path.write_bytes(b"old content")
    save_tree(tree, path)
    assert_trees_equal(tree, load_tree(path))
    assert sorted(os.listdir(tmp_path)) == ["tree.kdt"]


def test_corrupted_byte_is_a_checksum_mismatch(tree, tmp_path):
    path = tmp_path / "tree.kdt"
    save_tree(tree, path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(TreeFileError, match="checksum mismatch"):
        load_tree(path)


@pytest.mark.parametrize("keep", [4, 15, 40, 0.5, -1])
def test_truncated_file(tree, tmp_path, keep):
    path = tmp_path / "tree.kdt"
    save_tree(tree, path)
    data = path.read_bytes()
    if isinstance(keep, float):
        n = int(len(data) * keep)
    else:
        n = keep if keep >= 0 else len(data) + keep
    path.write_bytes(data[:n])
    message = "not a kdtree-gpu tree file" if n < 8 else "truncated file"
    with pytest.raises(TreeFileError, match=message):
        load_tree(path)


def test_trailing_bytes(tree, tmp_path):
    path = tmp_path / "tree.kdt"
    save_tree(tree, path)
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(TreeFileError, match="unexpected bytes"):
        load_tree(path)


def test_wrong_magic_and_version(tree, tmp_path):
    path = tmp_path / "mesh.ply"
    path.write_bytes(b"ply\nformat binary_little_endian 1.0\n")
    with pytest.raises(TreeFileError, match="not a kdtree-gpu tree file"):
        load_tree(path)
    path = tmp_path / "tree.kdt"
    save_tree(tree, path)
    data = bytearray(path.read_bytes())
    data[8:12] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(TreeFileError, match="unsupported tree file version 99"):
        load_tree(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tree(tmp_path / "nothing.kdt")


def test_failed_write_leaves_no_temp_file_and_old_file_intact(tree, tmp_path, monkeypatch):
    path = tmp_path / "tree.kdt"
    save_tree(tree, path)
    before = path.read_bytes()
    real_atomic_write = tree_io.atomic_write

    class DiskFullAtFourthWrite:
        def __init__(self, f):
            self.f, self.calls = f, 0

        def write(self, data):
            self.calls += 1
            if self.calls == 4:
                raise OSError("disk full")
            return self.f.write(data)

    @contextlib.contextmanager
    def failing_atomic_write(target):
        with real_atomic_write(target) as f:
            yield DiskFullAtFourthWrite(f)

    monkeypatch.setattr(tree_io, "atomic_write", failing_atomic_write)
    with pytest.raises(OSError, match="disk full"):
        save_tree(tree, path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["tree.kdt"]


def test_failed_rename_leaves_no_temp_file(tree, tmp_path, monkeypatch):
    path = tmp_path / "new.kdt"

    def failing_replace(src, dst):
        raise OSError("rename refused")

    monkeypatch.setattr(atomic.os, "replace", failing_replace)
    with pytest.raises(OSError, match="rename refused"):
        save_tree(tree, path)
    assert os.listdir(tmp_path) == []


def test_save_into_missing_folder(tree, tmp_path):
    with pytest.raises(OSError):
        save_tree(tree, tmp_path / "no" / "such" / "tree.kdt")


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_saved_file_has_the_umask_mode(tree, tmp_path, umask):
    # mkstemp alone would leave the file at 0600 whatever the umask
    path = tmp_path / "tree.kdt"
    old_umask = os.umask(umask)
    try:
        assert atomic.default_file_mode() == 0o666 & ~umask
        save_tree(tree, path)
        path.chmod(0o600)  # an existing file's mode is replaced, not kept
        save_tree(tree, path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert_trees_equal(tree, load_tree(path))


def test_free_form_build_info_becomes_plain_json(tree, tmp_path):
    path = tmp_path / "tree.kdt"
    tree.build_info = {"config": SAHConfig(max_depth=7), "axes": {2}, "mesh": tmp_path / "m.ply",
                       "count": np.int64(3), "ratio": np.float32(0.5)}
    save_tree(tree, path)
    info = load_tree(path).build_info
    assert SAHConfig.from_dict(info["config"]) == SAHConfig(max_depth=7)
    assert info["axes"] == [2] and info["mesh"] == str(tmp_path / "m.ply")
    assert info["count"] == 3 and info["ratio"] == 0.5
