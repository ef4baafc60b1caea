"""The parser (kdtree_gpu.cli.parser) and the option types (kdtree_gpu.cli.options): commands,
help with examples, usage errors."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

import kdtree_gpu
from kdtree_gpu.cli import options

REPO_ROOT = Path(__file__).resolve().parents[3]
COMMANDS = ("build", "info", "verify", "render", "bench", "demo")


def test_help_as_subprocess_lists_every_command_and_the_exit_codes():
    proc = subprocess.run([sys.executable, "-m", "kdtree_gpu", "--help"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for command in COMMANDS:
        assert command in proc.stdout
    assert "2 a usage or input error" in " ".join(proc.stdout.split())
    assert proc.stderr == ""


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_help_with_examples(run_cli, command):
    code, out, _ = run_cli(command, "--help")
    assert code == 0
    assert "examples:" in out
    assert f"kdtree-gpu {command}" in out


def test_version(run_cli):
    code, out, _ = run_cli("--version")
    assert code == 0
    assert kdtree_gpu.__version__ in out


def test_no_command_is_a_one_line_usage_error(run_cli, cli_helpers):
    code, out, err = run_cli()
    assert code == 2
    cli_helpers.assert_one_line_error(err, "COMMAND")


@pytest.mark.parametrize("argv, fragment", [
    (["build", "x.ply", "--empty-bonus", "2"], "--empty-bonus"),
    (["build", "x.ply", "--empty-bonus", "nan"], "--empty-bonus"),
    (["build", "x.ply", "--k-traversal", "0"], "--k-traversal"),
    (["build", "x.ply", "--leaf-size", "-1"], "--leaf-size"),
    (["build", "x.ply", "--max-depth", "65"], "--max-depth"),
    (["build", "x.ply", "--axes", "diagonal"], "--axes"),
    (["build", "x.ply", "--device", "tpu"], "--device"),
    (["build", "x.ply", "--device", "cpu:0"], "cuda:N"),
    (["render", "cornell", "-o", "x.png", "--size", "0x5"], "--size"),
    (["render", "cornell", "-o", "x.png", "--size", "big"], "--size"),
    (["render", "cornell", "-o", "x.png", "--spp", "0"], "--spp"),
    (["render", "cornell", "-o", "x.png", "--eye", "1,2"], "--eye"),
    (["render", "cornell", "-o", "x.png", "--target", "1,2,nan"], "--target"),
    (["render", "cornell", "-o", "x.png", "--fov", "180"], "--fov"),
    (["render", "cornell", "-o", "x.png", "--view", "above"], "--view"),
    (["verify", "cornell", "--rays", "many"], "--rays"),
    (["bench", "--builders", "magic"], "--builders"),
    (["build"], "MESH"),
    (["frobnicate"], "frobnicate"),
])
def test_bad_option_values_give_one_line_errors(run_cli, cli_helpers, tmp_path, monkeypatch,
                                                argv, fragment):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(*argv)
    assert code == 2
    cli_helpers.assert_one_line_error(err, fragment)
    assert not list(tmp_path.iterdir()), "nothing may be written on a usage error"


def test_parse_size_accepts_square_and_rectangles():
    assert options.parse_size("64") == (64, 64)
    assert options.parse_size("640x480") == (640, 480)
    assert options.parse_size("32X16") == (32, 16)


def test_parse_vector_and_fov():
    assert options.parse_vector("1,-2.5,3e2") == (1.0, -2.5, 300.0)
    for bad in ("1,2", "1,2,3,4", "a,b,c", "1,inf,2"):
        with pytest.raises(argparse.ArgumentTypeError):
            options.parse_vector(bad)
    assert options.parse_fov("60") == 60.0
    for bad in ("0", "180", "-5", "wide"):
        with pytest.raises(argparse.ArgumentTypeError):
            options.parse_fov(bad)


@pytest.mark.parametrize("name", ["auto", "cpu", "gpu", "cuda", "cuda:0", "CUDA:3", " GPU "])
def test_device_choice_reads_every_name_of_the_device_module(name):
    assert options.device_choice(name) == name.strip().lower()
