"""Tests of the ``kdtree-gpu`` command line, run in-process through ``main``.

Every command runs on tiny meshes written to ``tmp_path`` or on the built-in
Cornell box, so the whole file stays fast on two CPU cores. The bad inputs a
user can give (missing file, unparsable mesh, NaN coordinates, unwritable
output, no GPU, bad option values) must each end in one line
``kdtree-gpu: error: ...`` and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kdtree_gpu
from kdtree_gpu import cli
from kdtree_gpu.device import gpu_available

REPO_ROOT = Path(__file__).resolve().parents[2]


# --- helpers -------------------------------------------------------------------

def write_ply(path: Path, vertices, faces) -> Path:
    """Write a binary little-endian PLY (the layout of the shared meshes)."""
    vertices = np.asarray(vertices, dtype="<f4").reshape(-1, 3)
    faces = np.asarray(faces, dtype="<i4").reshape(-1, 3)
    header = ("ply\nformat binary_little_endian 1.0\n"
              f"element vertex {len(vertices)}\nproperty float x\nproperty float y\n"
              f"property float z\nelement face {len(faces)}\n"
              "property list uchar int vertex_indices\nend_header\n").encode("ascii")
    records = np.empty(len(faces), dtype=[("n", "u1"), ("i", "<i4", 3)])
    records["n"] = 3
    records["i"] = faces
    path.write_bytes(header + vertices.tobytes() + records.tobytes())
    return path


def grid_mesh(n=4, z=0.0, seed=0):
    """A bumpy n x n grid of 2 (n-1)^2 triangles (non-degenerate, not planar)."""
    rng = np.random.default_rng(seed)
    ii, jj = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    heights = z + 0.2 * rng.random((n, n))
    vertices = np.stack([ii.ravel(), jj.ravel(), heights.ravel()], axis=1).astype(np.float32)
    faces = []
    for i in range(n - 1):
        for j in range(n - 1):
            a, b, c, d = i * n + j, (i + 1) * n + j, i * n + j + 1, (i + 1) * n + j + 1
            faces += [(a, b, c), (b, d, c)]
    return vertices, np.array(faces, dtype=np.int32)


def two_boxes_mesh():
    """Two closed unit cubes side by side (24 triangles)."""
    import trimesh

    a = trimesh.creation.box(extents=(1, 1, 1))
    b = trimesh.creation.box(extents=(1, 1, 1))
    b.apply_translation((2.0, 0.5, 0.0))
    both = trimesh.util.concatenate([a, b])
    return np.asarray(both.vertices, np.float32), np.asarray(both.faces, np.int32)


def png_size(path: Path):
    """(width, height) from a PNG's IHDR chunk; fails if it is not a PNG."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def assert_one_line_error(err: str, *fragments: str):
    """stderr is ``kdtree-gpu: error: ...`` lines only, and no traceback."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    assert all(line.startswith("kdtree-gpu: error: ") for line in lines), err
    for fragment in fragments:
        assert fragment.lower() in err.lower(), f"{fragment!r} not in {err!r}"


@pytest.fixture
def run_cli(capsys):
    """Run ``main(argv)`` and return ``(exit status, stdout, stderr)``."""

    def run(*argv):
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def tiny_ply(tmp_path):
    """A 32-triangle bumpy grid as a PLY file."""
    return write_ply(tmp_path / "tiny.ply", *grid_mesh(5))


@pytest.fixture
def boxes_ply(tmp_path):
    """Two cubes as a PLY file."""
    return write_ply(tmp_path / "boxes.ply", *two_boxes_mesh())


@pytest.fixture
def bad_ply(tmp_path):
    """A file with a .ply name that is not a mesh."""
    path = tmp_path / "broken.ply"
    path.write_bytes(b"this is not a ply file\x00\x01\x02")
    return path


@pytest.fixture
def nan_ply(tmp_path):
    """A mesh with a NaN coordinate."""
    vertices, faces = grid_mesh(3)
    vertices[4, 1] = np.nan
    return write_ply(tmp_path / "nan.ply", vertices, faces)


# --- the parser ------------------------------------------------------------------

def test_help_as_subprocess_lists_every_command():
    proc = subprocess.run([sys.executable, "-m", "kdtree_gpu", "--help"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for command in ("build", "info", "verify", "render", "bench", "demo"):
        assert command in proc.stdout
    assert proc.stderr == ""


@pytest.mark.parametrize("command", ["build", "info", "verify", "render", "bench", "demo"])
def test_each_command_has_help_with_examples(run_cli, command):
    code, out, _ = run_cli(command, "--help")
    assert code == 0
    assert "examples:" in out
    assert f"kdtree-gpu {command}" in out


def test_version(run_cli):
    code, out, _ = run_cli("--version")
    assert code == 0
    assert kdtree_gpu.__version__ in out


def test_no_command_is_a_one_line_usage_error(run_cli):
    code, out, err = run_cli()
    assert code == 2
    assert_one_line_error(err, "COMMAND")


@pytest.mark.parametrize("argv, fragment", [
    (["build", "x.ply", "--empty-bonus", "2"], "--empty-bonus"),
    (["build", "x.ply", "--empty-bonus", "nan"], "--empty-bonus"),
    (["build", "x.ply", "--k-traversal", "0"], "--k-traversal"),
    (["build", "x.ply", "--leaf-size", "-1"], "--leaf-size"),
    (["build", "x.ply", "--max-depth", "65"], "--max-depth"),
    (["build", "x.ply", "--axes", "diagonal"], "--axes"),
    (["build", "x.ply", "--device", "tpu"], "--device"),
    (["render", "cornell", "-o", "x.png", "--size", "0x5"], "--size"),
    (["render", "cornell", "-o", "x.png", "--size", "big"], "--size"),
    (["render", "cornell", "-o", "x.png", "--spp", "0"], "--spp"),
    (["verify", "cornell", "--rays", "many"], "--rays"),
    (["bench", "--builders", "magic"], "--builders"),
    (["build"], "MESH"),
    (["frobnicate"], "frobnicate"),
])
def test_bad_option_values_give_one_line_errors(run_cli, tmp_path, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(*argv)
    assert code == 2
    assert_one_line_error(err, fragment)
    assert not list(tmp_path.iterdir()), "nothing may be written on a usage error"


def test_parse_size_accepts_square_and_rectangles():
    assert cli.parse_size("64") == (64, 64)
    assert cli.parse_size("640x480") == (640, 480)
    assert cli.parse_size("32X16") == (32, 16)


def test_random_rays_are_unit_and_seeded():
    bounds = np.array([[0, 0, 0], [1, 2, 3]], np.float32)
    origins, directions = cli.make_random_rays(bounds, 101, seed=3)
    assert origins.shape == directions.shape == (101, 3)
    assert origins.dtype == directions.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(directions, axis=1), 1.0, rtol=1e-5)
    again = cli.make_random_rays(bounds, 101, seed=3)
    np.testing.assert_array_equal(origins, again[0])


def test_compare_hits_finds_each_kind_of_disagreement():
    t = np.array([1.0, np.inf, 2.0, 3.0, 4.0], np.float32)
    tri = np.array([0, -1, 1, 2, 3], np.int32)
    assert cli.compare_hits(t, tri, t.copy(), tri.copy(), scale=1.0) is None
    # ray 4: same distance, other triangle (a shared edge): not a disagreement
    tri_tie = tri.copy()
    tri_tie[4] = 9
    assert cli.compare_hits(t, tri, t, tri_tie, scale=1.0) is None
    # ray 1 hit/miss, ray 2 distance, ray 3 another triangle slightly farther away
    t_other = np.array([1.0, 5.0, 2.5, np.nextafter(np.float32(3), np.float32(4)), 4.0],
                       np.float32)
    tri_other = np.array([0, 4, 1, 7, 3], np.int32)
    problem = cli.compare_hits(t, tri, t_other, tri_other, scale=1.0)
    assert "3 of 5 rays" in problem
    assert "1 hit/miss, 1 distance, 1 triangle" in problem
    assert "first: ray 1, tree t=inf tri=-1, brute force t=5.0 tri=4" in problem


# --- build -------------------------------------------------------------------------

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


def test_build_batch_skips_bad_files_and_fails_at_the_end(run_cli, tiny_ply, boxes_ply, bad_ply,
                                                          tmp_path):
    out_dir = tmp_path / "out"
    code, out, err = run_cli("build", tiny_ply, bad_ply, boxes_ply, "-o", out_dir,
                             "--device", "cpu", "--json")
    assert code == 1
    assert sorted(p.name for p in out_dir.iterdir()) == ["boxes.kdt", "tiny.kdt"]
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["ok"] for r in records] == [True, False, True]
    assert records[0]["triangles"] == 32 and records[2]["triangles"] == 24
    for r in (records[0], records[2]):
        assert {"nodes", "leaves", "refs_per_tri", "sah_cost", "build_ms", "output"} <= set(r)
        assert r["nodes"] == kdtree_gpu.load_tree(r["output"]).num_nodes
    assert "broken.ply" in records[1]["error"]
    assert_one_line_error(err, "broken.ply", "1 of 3 meshes failed")


def test_build_glob_and_bare_names_from_the_mesh_dir(run_cli, tmp_path, monkeypatch):
    meshes = tmp_path / "meshes"
    meshes.mkdir()
    write_ply(meshes / "alpha.ply", *grid_mesh(3, seed=1))
    write_ply(meshes / "beta.ply", *grid_mesh(4, seed=2))
    monkeypatch.setenv("KDTREE_GPU_MESH_DIR", str(meshes))
    code, out, err = run_cli("build", "alpha", "-o", tmp_path / "a.kdt", "--device", "cpu")
    assert code == 0, err
    assert out.startswith("alpha: 8 tris")
    code, out, err = run_cli("build", str(meshes / "*.ply"), "-o", tmp_path / "all",
                             "--device", "cpu")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == ["alpha.kdt", "beta.kdt"]


def test_build_does_not_overwrite_without_force(run_cli, tiny_ply, tmp_path):
    out_path = tmp_path / "t.kdt"
    out_path.write_bytes(b"keep me")
    code, _, err = run_cli("build", tiny_ply, "-o", out_path, "--device", "cpu")
    assert code == 1
    assert_one_line_error(err, "exists", "--force")
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


@pytest.mark.parametrize("case", ["missing", "unparsable", "nan", "directory"])
def test_build_bad_inputs_give_one_line_errors(run_cli, tmp_path, bad_ply, nan_ply, case):
    target = {"missing": tmp_path / "nowhere.ply", "unparsable": bad_ply, "nan": nan_ply,
              "directory": tmp_path}[case]
    code, out, err = run_cli("build", target, "-o", tmp_path / "x.kdt", "--device", "cpu")
    assert code != 0
    expected = {"missing": "nowhere.ply", "unparsable": "broken.ply", "nan": "NaN",
                "directory": "directory"}[case]
    assert_one_line_error(err, expected)
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "x.kdt").exists()


def test_build_unwritable_output_is_an_error(run_cli, tiny_ply, tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("a file, not a directory")
    code, _, err = run_cli("build", tiny_ply, "-o", blocker / "t.kdt", "--device", "cpu")
    assert code != 0
    assert_one_line_error(err, "file.txt")


@pytest.mark.skipif(gpu_available(), reason="needs a machine without a usable GPU")
def test_device_gpu_without_gpu_is_an_error(run_cli, tiny_ply, tmp_path):
    for argv in (["build", tiny_ply, "-o", tmp_path / "t.kdt"], ["verify", tiny_ply],
                 ["render", "cornell", "-o", tmp_path / "x.png"], ["demo", "-o", tmp_path / "d.png"]):
        code, _, err = run_cli(*argv, "--device", "gpu")
        assert code == 2
        assert_one_line_error(err, "--device gpu", "no usable CUDA GPU")
    assert list(tmp_path.glob("*.kdt")) == [] and list(tmp_path.glob("*.png")) == []


def test_debug_shows_the_traceback(tiny_ply, bad_ply, tmp_path):
    with pytest.raises(Exception):
        cli.main(["--debug", "build", str(bad_ply), "-o", str(tmp_path / "x.kdt")])
    with pytest.raises(Exception):
        cli.main(["build", str(bad_ply), "-o", str(tmp_path / "x.kdt"), "--debug"])


# --- info ----------------------------------------------------------------------------

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
    code, out, err = run_cli("info", tiny_tree_file, "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["nodes"] == tree.num_nodes
    assert record["triangles"] == 32
    assert record["checksum"] == "ok"
    assert record["config"]["clip"] is True
    assert record["format_version"] is not None


def test_info_bad_files(run_cli, tiny_tree_file, tmp_path):
    code, _, err = run_cli("info", tmp_path / "missing.kdt")
    assert code == 2
    assert_one_line_error(err, "missing.kdt")
    corrupt = tmp_path / "corrupt.kdt"
    data = bytearray(tiny_tree_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    code, _, err = run_cli("info", corrupt)
    assert code != 0
    assert_one_line_error(err, "corrupt.kdt")
    code, _, err = run_cli("info", tmp_path / "tiny.ply")
    assert code != 0
    assert_one_line_error(err, "tiny.ply")


# --- verify ----------------------------------------------------------------------------

def test_verify_passes_on_a_good_builder(run_cli, boxes_ply):
    code, out, err = run_cli("verify", boxes_ply, "--rays", "3000", "--device", "cpu")
    assert code == 0, out + err
    assert out.rstrip().endswith("PASS")
    assert "trees: identical" in out
    assert "3000 agree with brute force" in out


def test_verify_fails_with_reasons_on_a_wrong_tree(run_cli, boxes_ply, monkeypatch):
    real_build_tree = cli.build_tree

    def build_with_other_settings(vertices, faces, config, device, **options):
        # a different cost model makes a different tree than the reference
        return real_build_tree(vertices, faces, kdtree_gpu.SAHConfig(leaf_size=1000), device,
                               **options)

    monkeypatch.setattr(cli, "build_tree", build_with_other_settings)
    code, out, err = run_cli("verify", boxes_ply, "--rays", "500", "--device", "cpu", "--json")
    assert code == 1
    record = json.loads(out)
    assert record["verdict"] == "FAIL"
    assert any("trees differ" in r for r in record["reasons"])


def test_verify_bad_mesh(run_cli, nan_ply, tmp_path):
    code, _, err = run_cli("verify", nan_ply, "--device", "cpu")
    assert code == 2
    assert_one_line_error(err, "NaN")
    code, _, err = run_cli("verify", tmp_path / "none.ply", "--device", "cpu")
    assert code == 2
    assert_one_line_error(err, "none.ply")


# --- render, bench, demo ------------------------------------------------------------------

def test_render_cornell_writes_a_png_of_the_given_size(run_cli, tmp_path):
    out_path = tmp_path / "cornell.png"
    code, out, err = run_cli("render", "cornell", "-o", out_path, "--size", "12x8", "--spp", "1",
                             "--max-depth", "2", "--device", "cpu")
    assert code == 0, err
    assert png_size(out_path) == (12, 8)
    assert str(out_path) in out


def test_render_a_mesh_file(run_cli, boxes_ply, tmp_path):
    out_path = tmp_path / "boxes.png"
    code, _, err = run_cli("render", boxes_ply, "-o", out_path, "--size", "9", "--spp", "1",
                           "--device", "cpu")
    assert code == 0, err
    assert png_size(out_path) == (9, 9)


def test_render_unwritable_output_and_missing_mesh(run_cli, tmp_path):
    code, _, err = run_cli("render", "cornell", "-o", tmp_path / "no" / "dir" / "x.png",
                           "--size", "4", "--spp", "1", "--device", "cpu")
    assert code == 2
    assert_one_line_error(err, "does not exist")
    code, _, err = run_cli("render", tmp_path / "absent.ply", "-o", tmp_path / "x.png",
                           "--device", "cpu")
    assert code == 2
    assert_one_line_error(err, "absent.ply")


def test_bench_prints_a_table_row_per_builder(run_cli, boxes_ply):
    code, out, err = run_cli("bench", boxes_ply, "--no-scenes", "--builders", "numpy,reference",
                             "--repeat", "1", "--rays", "500")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["mesh", "tris", "builder"]
    rows = [line.split() for line in lines[2:-1]]
    assert lines[-1].startswith("(median of 1 builds")
    assert [(r[0], r[1], r[2]) for r in rows] == [("boxes", "24", "numpy"),
                                                  ("boxes", "24", "reference")]
    code, out, err = run_cli("bench", boxes_ply, "--no-scenes", "--builders", "reference",
                             "--repeat", "1", "--rays", "0", "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["builder"] == "reference" and record["triangles"] == 24
    assert record["rays_per_s"] is None and record["build_ms"] > 0


def test_demo_builds_traces_and_renders(run_cli, tmp_path):
    out_path = tmp_path / "demo.png"
    code, out, err = run_cli("demo", "-o", out_path, "--size", "16", "--spp", "1",
                             "--device", "cpu")
    assert code == 0, out + err
    assert png_size(out_path) == (16, 16)
    assert "agree with brute force" in out


def test_demo_unwritable_output(run_cli, tmp_path):
    code, _, err = run_cli("demo", "-o", tmp_path / "missing" / "demo.png", "--device", "cpu")
    assert code == 2
    assert_one_line_error(err, "does not exist")


# --- on a GPU -------------------------------------------------------------------------------

# the gpu marker skips these through the shared conftest; the skipif keeps this
# file correct on its own
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")


@pytest.mark.gpu
@needs_gpu
def test_verify_cornell_on_the_gpu(run_cli):
    code, out, err = run_cli("verify", "cornell", "--rays", "20000", "--device", "gpu")
    assert code == 0, out + err
    assert out.rstrip().endswith("PASS")


@pytest.mark.gpu
@needs_gpu
def test_build_and_demo_on_the_gpu(run_cli, boxes_ply, tmp_path):
    code, out, err = run_cli("build", boxes_ply, "-o", tmp_path / "b.kdt", "--device", "gpu",
                             "--json")
    assert code == 0, err
    assert json.loads(out)["device"] == "cuda"
    code, out, err = run_cli("demo", "-o", tmp_path / "d.png", "--size", "32", "--spp", "2",
                             "--device", "gpu")
    assert code == 0, out + err
    assert png_size(tmp_path / "d.png") == (32, 32)


class _FakeTerminal:
    def __init__(self, tty):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_progress_bar_redraws_on_a_terminal_and_writes_lines_elsewhere():
    terminal = _FakeTerminal(tty=True)
    bar = cli.ProgressBar(4, enabled=True, stream=terminal, width=8)
    bar.show(2, "mesh")
    assert terminal.text == "[####....] 2/4 mesh"
    bar.clear()
    assert terminal.text.endswith("\r" + " " * len("[####....] 2/4 mesh") + "\r")
    log = _FakeTerminal(tty=False)
    bar = cli.ProgressBar(2, enabled=True, stream=log, width=4)
    bar.show(1, "a")
    bar.clear()
    bar.show(2, "done")
    assert log.text == "[##..] 1/2 a\n[####] 2/2 done\n"
    quiet = _FakeTerminal(tty=True)
    cli.ProgressBar(2, enabled=False, stream=quiet).show(1, "x")
    assert quiet.text == ""
