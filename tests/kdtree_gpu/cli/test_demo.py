"""``kdtree-gpu demo`` (kdtree_gpu.cli.demo)."""

from __future__ import annotations

import pytest

from kdtree_gpu.device import gpu_available


def test_demo_builds_traces_and_renders(run_cli, cli_helpers, tmp_path):
    out_path = tmp_path / "demo.png"
    code, out, err = run_cli("demo", "-o", out_path, "--size", "16", "--spp", "1",
                             "--device", "cpu")
    assert code == 0, out + err
    assert cli_helpers.png_pixels(out_path).shape == (16, 16, 3)
    assert "demo on cpu" in out
    assert "agree with brute force" in out


def test_demo_unwritable_output(run_cli, cli_helpers, tmp_path):
    code, _, err = run_cli("demo", "-o", tmp_path / "missing" / "demo.png", "--device", "cpu")
    assert code == 2
    cli_helpers.assert_one_line_error(err, "does not exist")


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")
def test_demo_on_the_gpu(run_cli, cli_helpers, tmp_path):
    code, out, err = run_cli("demo", "-o", tmp_path / "d.png", "--size", "32", "--spp", "2",
                             "--device", "gpu")
    assert code == 0, out + err
    assert "demo on cuda:0" in out and "agree with brute force" in out
    assert cli_helpers.png_pixels(tmp_path / "d.png").shape == (32, 32, 3)
