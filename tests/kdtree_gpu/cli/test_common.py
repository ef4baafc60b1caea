"""What the commands share (kdtree_gpu.cli.common): the exit-code rule, device names,
one-line errors, inputs, the progress bar."""

from __future__ import annotations

import pytest

from kdtree_gpu.cli import common
from kdtree_gpu.device import gpu_available

BAD_MESH_KINDS = ["empty", "garbage", "nan", "inf", "degenerate", "overflow"]


def command_line(command, mesh, tmp_path):
    """``command`` run on ``mesh`` with the least work (``--device cpu``)."""
    extra = {"build": ["-o", tmp_path / "out.kdt"], "verify": ["--rays", "100"],
             "render": ["-o", tmp_path / "out.png", "--size", "4", "--spp", "1"],
             "bench": ["--no-scenes", "--repeat", "1", "--rays", "10"]}[command]
    return [command, mesh, *extra, "--device", "cpu"]


# --- the exit-code rule ------------------------------------------------------------

@pytest.mark.parametrize("kind", BAD_MESH_KINDS)
@pytest.mark.parametrize("command", ["build", "verify", "render", "bench"])
def test_one_bad_mesh_is_an_input_error_from_every_command(run_cli, cli_helpers, bad_meshes,
                                                           tmp_path, command, kind):
    path, words = bad_meshes[kind]
    code, out, err = run_cli(*command_line(command, path, tmp_path))
    assert code == 2, out + err
    cli_helpers.assert_one_line_error(err, words, path.name)
    assert len(err.splitlines()) == 1
    assert err.count(path.name) == 1, "the file is named once"
    assert "FAIL" not in out and "PASS" not in out
    assert not (tmp_path / "out.kdt").exists() and not (tmp_path / "out.png").exists()


def test_no_numpy_warning_reaches_the_user(tmp_path, bad_meshes):
    # in-process runs hand warnings to pytest; a real process shows what a user sees
    import subprocess
    import sys

    path, _ = bad_meshes["overflow"]
    proc = subprocess.run([sys.executable, "-m", "kdtree_gpu", "build", str(path), "-o",
                           str(tmp_path / "o.kdt")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kdtree-gpu: error: {path}: vertex "), lines
    assert "overflows float32" in lines[0]


def test_errors_name_their_subject_once():
    assert common.about("a.ply", "all 3 triangles are degenerate") == \
        "a.ply: all 3 triangles are degenerate"
    assert common.about("a.ply", "a.ply: cannot read as a mesh") == "a.ply: cannot read as a mesh"


def test_exit_status_follows_the_rule():
    from kdtree_gpu.mesh import MeshError
    from kdtree_gpu.tree import TreeFileError

    for exc in (common.CliError("x"), MeshError("x"), TreeFileError("x"),
                FileNotFoundError(2, "No such file", "x.ply")):
        assert common.exit_status(exc) == common.EXIT_USAGE
    for exc in (RuntimeError("kernel failed"), MemoryError(), ValueError("a bug")):
        assert common.exit_status(exc) == common.EXIT_FAILURE


# --- device names ---------------------------------------------------------------------

DEVICE_COMMANDS = {
    "build": lambda tmp, mesh: ["build", mesh, "-o", tmp / "t.kdt"],
    "verify": lambda tmp, mesh: ["verify", mesh, "--rays", "200"],
    "render": lambda tmp, mesh: ["render", mesh, "-o", tmp / "x.png", "--size", "4", "--spp",
                                 "1"],
    "bench": lambda tmp, mesh: ["bench", mesh, "--no-scenes", "--repeat", "1", "--rays", "10",
                                "--builders", "reference"],
    "demo": lambda tmp, mesh: ["demo", "-o", tmp / "d.png", "--size", "4", "--spp", "1"],
}


@pytest.mark.parametrize("command", DEVICE_COMMANDS)
@pytest.mark.parametrize("name", ["cpu", "CPU", "auto"])
def test_every_command_takes_the_device_names(run_cli, boxes_ply, tmp_path, command, name):
    if name == "auto" and gpu_available():
        pytest.skip("auto means the GPU here (the GPU tests cover it)")
    code, out, err = run_cli(*DEVICE_COMMANDS[command](tmp_path, boxes_ply), "--device", name)
    assert code == 0, out + err


@pytest.mark.skipif(gpu_available(), reason="needs a machine without a usable GPU")
@pytest.mark.parametrize("command", DEVICE_COMMANDS)
@pytest.mark.parametrize("name", ["gpu", "cuda", "cuda:0", "cuda:3"])
def test_a_gpu_name_without_a_gpu_is_the_same_one_line_error(run_cli, cli_helpers, boxes_ply,
                                                             tmp_path, command, name):
    code, _, err = run_cli(*DEVICE_COMMANDS[command](tmp_path, boxes_ply), "--device", name)
    assert code == 2
    cli_helpers.assert_one_line_error(err, f"--device {name}: no usable CUDA GPU",
                                      "use --device cpu or auto")
    assert not list(tmp_path.glob("*.kdt")) and not list(tmp_path.glob("*.png"))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")
def test_a_gpu_number_the_machine_lacks_is_a_one_line_error(run_cli, cli_helpers, boxes_ply,
                                                            tmp_path):
    code, _, err = run_cli("build", boxes_ply, "-o", tmp_path / "t.kdt", "--device", "cuda:99")
    assert code == 2
    cli_helpers.assert_one_line_error(err, "--device cuda:99", "no CUDA device 99")


# --- inputs ---------------------------------------------------------------------------------

def test_a_missing_name_lists_the_places_and_the_scenes(tmp_path, monkeypatch):
    monkeypatch.setenv("KDTREE_GPU_MESH_DIR", str(tmp_path))
    inputs, errors = common.resolve_mesh_inputs(["cornel"])
    assert inputs == [] and [spec for spec, _ in errors] == ["cornel"]
    assert str(tmp_path / "cornel.ply") in errors[0][1] and "cornell" in errors[0][1]
    inputs, errors = common.resolve_mesh_inputs(["cornell", str(tmp_path / "none.ply")])
    assert [i.scene for i in inputs] == ["cornell"]
    assert "none.ply" in errors[0][1] and "built-in scenes" not in errors[0][1]


# --- the progress bar -------------------------------------------------------------------------

def test_progress_bar_is_tqdm_on_stderr_and_draws_nothing_when_disabled(capsys):
    bar = common.progress_bar(4, enabled=True)
    bar.update(2)
    bar.set_postfix_str("mesh 50%")
    bar.close()
    out, err = capsys.readouterr()
    assert out == ""
    assert "2/4" in err and "mesh 50%" in err
    quiet = common.progress_bar(2, enabled=False)
    quiet.update(1)
    quiet.close()
    assert capsys.readouterr() == ("", "")


def test_lines_printed_under_a_bar_stay_whole(capsys):
    bar = common.progress_bar(2, enabled=True, leave=False)
    bar.update(1)
    common.print_line("result")
    common.print_error("problem")
    bar.close()
    out, err = capsys.readouterr()
    assert out == "result\n"
    assert "kdtree-gpu: error: problem\n" in err


def test_cpu_builds_time_without_the_first_compile_and_say_so(monkeypatch, capsys):
    import numpy as np

    import cpu_reference
    from kdtree_gpu.warmup import WarmUp
    from kdtree_gpu.device import CPU
    from kdtree_gpu.config import SAHConfig
    from kdtree_gpu.trace import api as trace_api

    calls = []
    real = cpu_reference.warm_up

    def first_use():  # as on a machine that compiles now
        calls.append(1)
        real()
        return WarmUp(27.5, True) if len(calls) == 1 else WarmUp(0.0, False)

    monkeypatch.setattr(cpu_reference, "warm_up", first_use)
    monkeypatch.setattr(trace_api, "warm_up_cpu", lambda: WarmUp(2.0, False))
    V = np.random.default_rng(0).random((30, 3)).astype(np.float32)
    F = np.arange(30).reshape(10, 3)
    tree, build_ms = common.build_tree(V, F, SAHConfig(), CPU)
    assert calls and build_ms == 1e3 * tree.build_info["seconds"]
    assert capsys.readouterr().err.strip() == \
        "kdtree-gpu: compiled in 29.5 s (not counted in the times below)"
    common.build_tree(V, F, SAHConfig(), CPU)  # warm: nothing said
    assert capsys.readouterr().err == ""
