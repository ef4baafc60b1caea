"""``kdtree-gpu info`` (kdtree_gpu.cli.info)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kdtree_gpu


@pytest.fixture
def tiny_tree_file(run_cli, tiny_ply, tmp_path):
    path = tmp_path / "tiny.kdt"
    code, _, err = run_cli("build", tiny_ply, "-o", path, "--device", "cpu", "--clip")
    assert code == 0, err
    return path


def test_info_prints_statistics_settings_version_checksum(run_cli, tiny_tree_file):
    code, out, err = run_cli("info", tiny_tree_file)
    assert code == 0, err
    tree = kdtree_gpu.load_tree(tiny_tree_file)
    assert f"{tree.num_nodes} nodes" in out
    assert "format version" in out
    assert "checksum:       ok" in out
    assert "clip: True" in out
    assert f"({tiny_tree_file.stat().st_size} bytes)" in out


def test_info_json_has_the_file_size_beside_the_tree_bytes(run_cli, tiny_tree_file):
    code, out, err = run_cli("info", tiny_tree_file, "--json")
    assert code == 0, err
    record = json.loads(out)
    tree = kdtree_gpu.load_tree(tiny_tree_file)
    assert record["nodes"] == tree.num_nodes
    assert record["triangles"] == 32
    assert record["checksum"] == "ok"
    assert record["config"]["clip"] is True
    assert record["format_version"] is not None
    assert record["file_bytes"] == tiny_tree_file.stat().st_size
    assert record["bytes"] == tree.stats()["bytes"]  # the tree's arrays, not the file


@pytest.mark.parametrize("spoil", ["trailing bytes", "flipped byte", "truncated"])
def test_info_reports_what_load_tree_reports(run_cli, cli_helpers, tiny_tree_file, spoil):
    data = tiny_tree_file.read_bytes()
    spoiled = {"trailing bytes": data + b"abc",
               "flipped byte": data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF])
               + data[len(data) // 2 + 1:],
               "truncated": data[:-40]}[spoil]
    tiny_tree_file.write_bytes(spoiled)
    with pytest.raises(kdtree_gpu.TreeFileError) as raised:
        kdtree_gpu.load_tree(tiny_tree_file)
    problem = str(raised.value)
    code, out, err = run_cli("info", tiny_tree_file)
    assert code == 2
    cli_helpers.assert_one_line_error(err)
    assert err.strip() == f"kdtree-gpu: error: {problem}"
    assert f"error:          {problem}" in out
    assert "checksum:       ok" not in out and "mismatch" not in out.replace(problem, "")
    assert "settings:" in out  # the header still reads
    code, out, _ = run_cli("info", tiny_tree_file, "--json")
    record = json.loads(out)
    assert record["error"] == problem and record["file_bytes"] == len(spoiled)


def test_info_trailing_bytes_are_named_as_such(run_cli, tiny_tree_file):
    tiny_tree_file.write_bytes(tiny_tree_file.read_bytes() + b"abc")
    code, out, err = run_cli("info", tiny_tree_file)
    assert code == 2
    assert "3 unexpected bytes after the checksum" in err and "mismatch" not in err


def test_info_bad_files(run_cli, cli_helpers, tmp_path, tiny_ply):
    code, _, err = run_cli("info", tmp_path / "missing.kdt")
    assert code == 2
    cli_helpers.assert_one_line_error(err, "missing.kdt")
    code, _, err = run_cli("info", tiny_ply)
    assert code == 2
    cli_helpers.assert_one_line_error(err, "tiny.ply", "not a kdtree-gpu tree file")
    code, _, err = run_cli("info", tmp_path)
    assert code == 2
    cli_helpers.assert_one_line_error(err, "directory")


def test_info_check_reports_a_broken_invariant_as_a_failure(run_cli, cli_helpers, tmp_path):
    V, F = cli_helpers.grid_mesh(5)
    tree = kdtree_gpu.build(V, F, device="cpu")
    leaf = int(np.flatnonzero(tree.leaf_mask() & (tree.node_count > 0))[0])
    counts = np.array(tree.node_count)
    counts[leaf] += 1  # a leaf that claims one triangle more than it lists
    tree.node_count = counts
    tree.save(tmp_path / "broken.kdt")
    code, out, err = run_cli("info", tmp_path / "broken.kdt")
    assert code == 0, err  # it loads: the file is intact
    code, out, err = run_cli("info", tmp_path / "broken.kdt", "--check")
    assert code == 1
    cli_helpers.assert_one_line_error(err, "broken invariant")
    assert "invariants:" in out
