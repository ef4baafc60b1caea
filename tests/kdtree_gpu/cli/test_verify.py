"""``kdtree-gpu verify`` (kdtree_gpu.cli.verify)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import kdtree_gpu
from kdtree_gpu import testing
from kdtree_gpu.cli import verify
from kdtree_gpu.device import gpu_available


def test_verify_passes_on_a_good_builder(run_cli, boxes_ply):
    code, out, err = run_cli("verify", boxes_ply, "--rays", "3000", "--device", "cpu")
    assert code == 0, out + err
    assert out.rstrip().endswith("PASS")
    assert "NumPy pipeline on cpu vs CPU reference" in out
    assert "trees: identical" in out
    assert "3000 agree with brute force" in out


def test_verify_fails_with_reasons_on_a_wrong_tree(run_cli, boxes_ply, monkeypatch):
    real_build_tree = verify.build_tree

    def build_with_other_settings(vertices, faces, config, device, kernels=None):
        if kernels == "reference":
            return real_build_tree(vertices, faces, config, device, kernels=kernels)
        # a different cost model makes a different tree than the reference
        return real_build_tree(vertices, faces, kdtree_gpu.SAHConfig(leaf_size=1000), device,
                               kernels=kernels)

    monkeypatch.setattr(verify, "build_tree", build_with_other_settings)
    code, out, err = run_cli("verify", boxes_ply, "--rays", "500", "--device", "cpu", "--json")
    assert code == 1
    record = json.loads(out)
    assert record["verdict"] == "FAIL"
    assert any("trees differ" in r for r in record["reasons"])


@pytest.mark.parametrize("kind", ["nan", "degenerate"])
def test_verify_bad_mesh_is_an_input_error_not_a_fail(run_cli, cli_helpers, bad_meshes, kind):
    path, words = bad_meshes[kind]
    code, out, err = run_cli("verify", path, "--device", "cpu")
    assert code == 2
    assert out == ""
    cli_helpers.assert_one_line_error(err, words)


def test_verify_missing_mesh(run_cli, cli_helpers, tmp_path):
    code, _, err = run_cli("verify", tmp_path / "none.ply", "--device", "cpu")
    assert code == 2
    cli_helpers.assert_one_line_error(err, "none.ply")


def test_verify_with_perfect_splits_compares_the_clipping_pipeline(run_cli, boxes_ply):
    code, out, err = run_cli("verify", boxes_ply, "--clip", "--device", "cpu", "--rays", "200")
    assert code == 0, out + err
    assert "NumPy pipeline" in out and "trees: identical" in out and "PASS" in out


def hits_of(out: str) -> int:
    return int(re.search(r"\((\d+) hits", out).group(1))


@pytest.mark.parametrize("scale", [1e-9, 1.0, 1e9])
def test_verify_rays_scale_with_the_mesh(run_cli, cli_helpers, tmp_path, scale):
    V, F = cli_helpers.two_boxes_mesh()
    path = cli_helpers.write_ply(tmp_path / "scaled.ply", V.astype(np.float64) * scale, F)
    code, out, err = run_cli("verify", path, "--rays", "2000", "--device", "cpu")
    assert code == 0, out + err
    assert out.rstrip().endswith("PASS")
    assert hits_of(out) > 1000  # most rays aim at the boxes, whatever their size


@pytest.mark.parametrize("scale", [1e-20, 1e15])
def test_verify_never_passes_without_hits(run_cli, cli_helpers, tmp_path, scale):
    # at extreme scales the float32 ray-triangle test may overflow or
    # underflow: verify then FAILs; it never says PASS on rays that hit nothing
    V, F = cli_helpers.two_boxes_mesh()
    path = cli_helpers.write_ply(tmp_path / "scaled.ply", V.astype(np.float64) * scale, F)
    code, out, err = run_cli("verify", path, "--rays", "2000", "--device", "cpu")
    assert code in (0, 1), out + err
    if code == 0:
        assert hits_of(out) > 1000


def test_verify_fails_when_no_ray_hits(run_cli, boxes_ply, monkeypatch):
    real = testing.random_rays

    def rays_pointing_away(bounds, num_rays, seed=0, **options):
        rays = real(bounds, num_rays, seed, **options)
        far = np.asarray(bounds, np.float32)[1] + 10.0
        return rays._replace(origins=np.broadcast_to(far, rays.origins.shape).copy(),
                             directions=np.broadcast_to(np.float32([1, 1, 1]),
                                                        rays.directions.shape).copy())

    monkeypatch.setattr(testing, "random_rays", rays_pointing_away)
    code, out, err = run_cli("verify", boxes_ply, "--rays", "300", "--device", "cpu")
    assert code == 1
    assert "FAIL" in out and "none of the 300 rays hit the mesh" in out


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")
@pytest.mark.parametrize("name", ["gpu", "cuda:0"])
def test_verify_cornell_on_the_gpu(run_cli, name):
    code, out, err = run_cli("verify", "cornell", "--rays", "20000", "--device", name)
    assert code == 0, out + err
    assert "GPU pipeline on cuda:0" in out
    assert out.rstrip().endswith("PASS")
