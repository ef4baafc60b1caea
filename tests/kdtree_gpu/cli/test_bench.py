"""``kdtree-gpu bench`` (kdtree_gpu.cli.bench). Timings are printed, never asserted."""

from __future__ import annotations

import json

import pytest

from kdtree_gpu.cli import bench
from kdtree_gpu.device import gpu_available


def test_bench_prints_a_table_row_per_builder(run_cli, boxes_ply):
    code, out, err = run_cli("bench", boxes_ply, "--no-scenes", "--builders", "numpy,reference",
                             "--repeat", "1", "--rays", "500", "--device", "cpu")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["mesh", "tris", "builder"]
    rows = [line.split() for line in lines[2:-1]]
    assert [(r[0], r[1], r[2]) for r in rows] == [("boxes", "24", "numpy"),
                                                  ("boxes", "24", "reference")]
    assert lines[-1].startswith("(one run after a warm-up build and trace; 500 random rays")
    assert "1 builds" not in out


def test_bench_footer_names_the_median(run_cli, boxes_ply):
    code, out, err = run_cli("bench", boxes_ply, "--no-scenes", "--builders", "reference",
                             "--repeat", "3", "--rays", "10")
    assert code == 0, err
    assert out.strip().splitlines()[-1].startswith("(median of 3 runs after a warm-up")


def test_bench_json(run_cli, boxes_ply):
    code, out, err = run_cli("bench", boxes_ply, "--no-scenes", "--builders", "reference",
                             "--repeat", "1", "--rays", "0", "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["builder"] == "reference" and record["triangles"] == 24
    assert record["device"] == "cpu"
    assert record["rays_per_s"] is None and record["build_ms"] > 0


def test_every_builder_builds_and_traces_once_before_the_clock(boxes_ply, monkeypatch):
    import kdtree_gpu

    events = []
    real_build, real_cast = bench.build_tree, bench.cast_rays

    def build_tree(*args, **kwargs):
        events.append("build")
        return real_build(*args, **kwargs)

    def cast_rays(*args, **kwargs):
        events.append("trace")
        return real_cast(*args, **kwargs)

    monkeypatch.setattr(bench, "build_tree", build_tree)
    monkeypatch.setattr(bench, "cast_rays", cast_rays)
    V, F = kdtree_gpu.load_mesh(boxes_ply)
    from kdtree_gpu.config import SAHConfig
    from kdtree_gpu.device import CPU

    for builder, (kernels, _) in bench.BUILDERS.items():
        if builder == "gpu":
            continue
        events.clear()
        row = bench.bench_case("boxes", V, F, builder, kernels, CPU, SAHConfig(), repeat=2,
                               num_rays=100)
        # warm-up build and trace first, then the timed ones
        assert events == ["build", "trace", "build", "build", "trace", "trace"], builder
        assert row["rays_per_s"] > 0 and row["build_ms"] > 0


@pytest.mark.skipif(gpu_available(), reason="needs a machine without a usable GPU")
def test_the_gpu_builder_without_a_gpu_is_a_usage_error(run_cli, cli_helpers, boxes_ply):
    code, _, err = run_cli("bench", boxes_ply, "--no-scenes", "--builders", "gpu")
    assert code == 2
    cli_helpers.assert_one_line_error(err, "--builders gpu")


def test_bench_default_builders_on_the_cpu(run_cli, boxes_ply):
    code, out, err = run_cli("bench", boxes_ply, "--no-scenes", "--repeat", "1", "--rays", "0",
                             "--device", "cpu", "--json")
    assert code == 0, err
    assert [json.loads(line)["builder"] for line in out.splitlines()] == ["numpy", "reference"]
