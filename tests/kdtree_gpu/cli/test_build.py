"""``kdtree-gpu build`` (kdtree_gpu.cli.build)."""

from __future__ import annotations

import json

import pytest

import kdtree_gpu
from kdtree_gpu.cli import build as cli_build
from kdtree_gpu.cli import common
from kdtree_gpu.device import gpu_available


def test_build_one_mesh_writes_a_tree_and_prints_statistics(run_cli, tiny_ply, tmp_path):
    out_path = tmp_path / "trees" / "tiny_tree.kdt"
    out_path.parent.mkdir()
    code, out, err = run_cli("build", tiny_ply, "-o", out_path, "--device", "cpu")
    assert code == 0, err
    assert out_path.is_file()
    line = out.strip()
    for fragment in ("tiny: 32 tris", "nodes", "leaves", "refs/tri", "SAH", "ms", str(out_path)):
        assert fragment in line
    tree = kdtree_gpu.load_tree(out_path)
    assert tree.num_triangles == 32
    tree.check()
    assert f"{tree.num_nodes} nodes" in line


def test_build_default_output_is_stem_in_current_directory(run_cli, tiny_ply, tmp_path,
                                                           monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code, _, err = run_cli("build", tiny_ply, "--device", "cpu")
    assert code == 0, err
    assert (work / "tiny.kdt").is_file()


def test_build_settings_reach_the_tree(run_cli, tiny_ply, tmp_path):
    out_path = tmp_path / "t.kdt"
    code, _, err = run_cli("build", tiny_ply, "-o", out_path, "--device", "cpu",
                           "--axes", "longest", "--k-traversal", "10", "--k-intersect", "30",
                           "--empty-bonus", "1", "--leaf-size", "2", "--max-depth", "5")
    assert code == 0, err
    config = kdtree_gpu.load_tree(out_path).config
    assert config == kdtree_gpu.SAHConfig(k_traversal=10, k_intersect=30, empty_bonus=1,
                                          leaf_size=2, max_depth=5, axes="longest")


def test_build_batch_skips_bad_files_and_fails_at_the_end(run_cli, cli_helpers, tiny_ply,
                                                          boxes_ply, bad_ply, tmp_path):
    out_dir = tmp_path / "out"
    code, out, err = run_cli("build", tiny_ply, bad_ply, boxes_ply, "-o", out_dir,
                             "--device", "cpu", "--json")
    assert code == 1  # a batch in which a mesh did not build
    assert sorted(p.name for p in out_dir.iterdir()) == ["boxes.kdt", "tiny.kdt"]
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["ok"] for r in records] == [True, False, True]
    assert records[0]["triangles"] == 32 and records[2]["triangles"] == 24
    for r in (records[0], records[2]):
        assert {"nodes", "leaves", "refs_per_tri", "sah_cost", "build_ms", "output"} <= set(r)
        assert r["nodes"] == kdtree_gpu.load_tree(r["output"]).num_nodes
        assert r["device"] == "cpu"
    assert "broken.ply" in records[1]["error"]
    cli_helpers.assert_one_line_error(err, "broken.ply", "1 of 3 meshes failed")


def test_a_bad_mesh_in_a_batch_is_named_once(run_cli, tiny_ply, bad_meshes, tmp_path):
    path, _ = bad_meshes["empty"]
    code, _, err = run_cli("build", tiny_ply, path, "-o", tmp_path / "out", "--device", "cpu")
    assert code == 1
    assert err.splitlines()[0] == (f"kdtree-gpu: error: {path}: cannot read as a mesh: "
                                   "ValueError: Not a ply file!")


def test_a_missing_mesh_in_a_batch_is_a_json_record_named_by_its_argument(run_cli, tiny_ply,
                                                                          tmp_path):
    missing = tmp_path / "absent.ply"
    code, out, err = run_cli("build", tiny_ply, missing, "-o", tmp_path / "out", "--device",
                             "cpu", "--json")
    assert code == 1
    records = [json.loads(line) for line in out.splitlines()]
    assert records[0] == {"mesh": str(missing), "ok": False, "error": records[0]["error"]}
    assert str(missing) in records[0]["error"] and records[1]["ok"]


def test_build_glob_and_bare_names_from_the_mesh_dir(run_cli, cli_helpers, tmp_path,
                                                     monkeypatch):
    meshes = tmp_path / "meshes"
    meshes.mkdir()
    cli_helpers.write_ply(meshes / "alpha.ply", *cli_helpers.grid_mesh(3, seed=1))
    cli_helpers.write_ply(meshes / "beta.ply", *cli_helpers.grid_mesh(4, seed=2))
    monkeypatch.setenv("KDTREE_GPU_MESH_DIR", str(meshes))
    code, out, err = run_cli("build", "alpha", "-o", tmp_path / "a.kdt", "--device", "cpu")
    assert code == 0, err
    assert out.startswith("alpha: 8 tris")
    code, out, err = run_cli("build", str(meshes / "*.ply"), "-o", tmp_path / "all",
                             "--device", "cpu")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == ["alpha.kdt", "beta.kdt"]


def test_build_does_not_overwrite_without_force(run_cli, cli_helpers, tiny_ply, tmp_path):
    out_path = tmp_path / "t.kdt"
    out_path.write_bytes(b"keep me")
    code, _, err = run_cli("build", tiny_ply, "-o", out_path, "--device", "cpu")
    assert code == 2
    cli_helpers.assert_one_line_error(err, "exists", "--force")
    assert out_path.read_bytes() == b"keep me"
    code, _, err = run_cli("build", tiny_ply, "-o", out_path, "--device", "cpu", "--force")
    assert code == 0, err
    assert kdtree_gpu.load_tree(out_path).num_triangles == 32


def test_build_progress_bar_goes_to_stderr(run_cli, tiny_ply, boxes_ply, tmp_path):
    code, out, err = run_cli("build", tiny_ply, boxes_ply, "-o", tmp_path / "o", "--device",
                             "cpu", "--progress")
    assert code == 0
    assert "2/2" in err and "[" in err
    assert "[" not in out


def test_the_builders_progress_reaches_the_bar_on_a_terminal(run_cli, tiny_ply, tmp_path,
                                                             monkeypatch):
    # a stand-in for kd.build with the progress= a CPU build reports through
    import kdtree_gpu.builder as builder

    real_build = builder.build
    calls = []

    def build_with_progress(vertices, faces, config=None, device="auto", profile=False,
                            kernels=None, progress=None):
        calls.append(progress)
        progress(0.0)
        progress(0.5)
        tree = real_build(vertices, faces, config=config, device=device, kernels=kernels)
        progress(1.0)
        return tree

    monkeypatch.setattr(builder, "build", build_with_progress)
    for module in (common, cli_build):
        monkeypatch.setattr(module, "isatty", lambda stream: True)
    code, _, err = run_cli("build", tiny_ply, "-o", tmp_path / "t.kdt", "--device", "cpu")
    assert code == 0, err
    assert calls and callable(calls[0])
    assert "0/1" in err and "tiny 50%" in err
    # and the bar of a single mesh is erased at the end
    assert err.endswith("\r")


@pytest.mark.parametrize("case", ["missing", "unparsable", "nan", "directory"])
def test_build_bad_inputs_give_one_line_errors(run_cli, cli_helpers, tmp_path, bad_ply, nan_ply,
                                               case):
    target = {"missing": tmp_path / "nowhere.ply", "unparsable": bad_ply, "nan": nan_ply,
              "directory": tmp_path}[case]
    code, out, err = run_cli("build", target, "-o", tmp_path / "x.kdt", "--device", "cpu")
    assert code == 2
    expected = {"missing": "nowhere.ply", "unparsable": "broken.ply", "nan": "NaN",
                "directory": "directory"}[case]
    cli_helpers.assert_one_line_error(err, expected)
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "x.kdt").exists()


def test_build_unwritable_output_is_an_error(run_cli, cli_helpers, tiny_ply, tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("a file, not a directory")
    code, _, err = run_cli("build", tiny_ply, "-o", blocker / "t.kdt", "--device", "cpu")
    assert code == 2
    cli_helpers.assert_one_line_error(err, "file.txt")


@pytest.mark.parametrize("output", ["one.kdt", "existing_file"])
def test_several_meshes_into_one_file_is_a_usage_error(run_cli, cli_helpers, tiny_ply,
                                                       boxes_ply, tmp_path, monkeypatch, output):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing_file").write_text("not a directory")
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = run_cli("build", tmp_path / "*.ply", "-o", output, "--device", "cpu")
    assert code == 2
    cli_helpers.assert_one_line_error(err, f"-o {output}", "2 meshes", "directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no directory one.kdt/


def test_an_output_directory_appears_only_with_a_tree(run_cli, bad_ply, tiny_ply, tmp_path):
    code, _, _ = run_cli("build", bad_ply, "-o", f"{tmp_path / 'newout'}/", "--device", "cpu")
    assert code == 2
    assert not (tmp_path / "newout").exists()
    code, _, _ = run_cli("build", bad_ply, bad_ply.with_name("nothing.ply"), "-o",
                         tmp_path / "batch", "--device", "cpu")
    assert code == 1
    assert not (tmp_path / "batch").exists()
    code, _, err = run_cli("build", tiny_ply, "-o", f"{tmp_path / 'newout'}/", "--device", "cpu")
    assert code == 0, err
    assert [p.name for p in (tmp_path / "newout").iterdir()] == ["tiny.kdt"]


def test_debug_shows_the_traceback(bad_ply, tmp_path):
    from kdtree_gpu import cli

    with pytest.raises(Exception):
        cli.main(["--debug", "build", str(bad_ply), "-o", str(tmp_path / "x.kdt")])
    with pytest.raises(Exception):
        cli.main(["build", str(bad_ply), "-o", str(tmp_path / "x.kdt"), "--debug"])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")
@pytest.mark.parametrize("name", ["gpu", "cuda", "cuda:0"])
def test_build_on_the_gpu(run_cli, boxes_ply, tmp_path, name):
    code, out, err = run_cli("build", boxes_ply, "-o", tmp_path / "b.kdt", "--device", name,
                             "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["device"] == "cuda:0"
    reference = kdtree_gpu.build(*kdtree_gpu.load_mesh(boxes_ply), device="cpu")
    assert kdtree_gpu.load_tree(tmp_path / "b.kdt").compare(reference) is None
