"""Which CUDA modules a GPU build compiles (``builder/gpu.build_modules``), and the
first build's compilations side by side (``compile_ahead.compile_modules``)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kdtree_gpu as kd
from kdtree_gpu import SAHConfig, compile_ahead, kernels
from kdtree_gpu import encoding as enc
from kdtree_gpu.builder import GpuSettings
from kdtree_gpu.builder.gpu import build_modules
from kdtree_gpu.device import gpu_available
from kdtree_gpu.testing.meshes import soup

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")
DEFAULT = GpuSettings()


def files(specs):
    return {spec.filename: spec.cooperative for spec in specs}


def test_a_small_mesh_compiles_the_one_block_loop_and_the_subtree_grid():
    # the bunny: 69,451 triangles, at most 416,706 root events
    got = files(build_modules(SAHConfig(), DEFAULT, 69_451, grid=True, cooperative=True))
    assert got == {"primitives.cu": False, "traverse.cu": False, "build.cu": False,
                   "build_loop_one_block.cu": True, "build_small_grid.cu": True,
                   "build_small_leaves.cu": False}


def test_a_large_mesh_adds_the_two_block_loop_and_the_stages():
    got = files(build_modules(SAHConfig(), DEFAULT, 5_535_104, grid=True, cooperative=True))
    assert {"build_loop.cu", "cost_candidates.cu", "build_small_grid.cu"} <= set(got)
    assert "build_loop_one_block.cu" not in got and "build_small.cu" not in got
    # past the one-block bound but within the loop's: no stages
    got = files(build_modules(SAHConfig(), DEFAULT, 300_000, grid=True, cooperative=True))
    assert "build_loop.cu" in got and "cost_candidates.cu" not in got


def test_perfect_splits_compile_the_clipping_loop_and_no_subtree_stage():
    got = files(build_modules(SAHConfig(clip=True), DEFAULT, 69_451, grid=True, cooperative=True))
    assert {"build_loop_clip.cu", "clip.cu"} <= set(got)
    assert not {"build_loop.cu", "build_loop_one_block.cu", "build_small_grid.cu",
                "build_small.cu", "build_small_leaves.cu"} & set(got)


def test_without_cooperative_launches_the_stages_and_a_launch_per_subtree_level():
    got = files(build_modules(SAHConfig(), DEFAULT, 69_451, grid=False, cooperative=False))
    assert {"cost_candidates.cu", "build_small.cu", "build_small_leaves.cu"} <= set(got)
    assert not any(name.startswith("build_loop") for name in got)
    assert "build_small_grid.cu" not in got


def test_small_meshes_and_medium_nodes():
    # below small_min_refs nothing is deferred: no subtree stage
    got = files(build_modules(SAHConfig(), DEFAULT, 1_000, grid=True, cooperative=True))
    assert not {"build_small.cu", "build_small_grid.cu", "build_small_leaves.cu"} & set(got)
    # medium nodes keep the launches per level
    medium = GpuSettings(small_refs=enc.MEDIUM_MAX_REFS)
    got = files(build_modules(SAHConfig(), medium, 69_451, grid=True, cooperative=True))
    assert "build_small.cu" in got and "build_small_grid.cu" not in got


def test_compile_ahead_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("KDTREE_GPU_COMPILE_PROCESSES", "0")
    assert compile_ahead.compile_modules([compile_ahead.ModuleSpec("primitives.cu"),
                                          compile_ahead.ModuleSpec("build.cu")]) == []


# (config, settings, kernels) of builds that take each path: the loop with one
# block and with two, the stages, perfect splits, the subtree stage in one
# launch and a launch per level
PATHS = [
    (SAHConfig(), GpuSettings(small_min_refs=0), "fused"),
    (SAHConfig(), GpuSettings(small_min_refs=0, loop_one_block_events=0), "fused"),
    (SAHConfig(), GpuSettings(small_min_refs=0, loop_max_events=2_000), "fused"),
    (SAHConfig(), GpuSettings(small_min_refs=0, small_grid=False), "fused"),
    (SAHConfig(), GpuSettings(small_min_refs=0), "stages"),
    (SAHConfig(clip=True), GpuSettings(), "fused"),
]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("cfg,settings,loop", PATHS)
def test_a_build_asks_only_for_the_modules_it_listed(cfg, settings, loop, monkeypatch):
    from kdtree_gpu.device import cooperative_launch

    V, F = soup(np.random.default_rng(7), 3_000)
    asked = []
    entry = kernels._module_entry

    def recorded(filename, options, name_expressions, cooperative):
        asked.append(compile_ahead.ModuleSpec(filename, tuple(options),
                                              None if name_expressions is None
                                              else tuple(name_expressions), cooperative))
        return entry(filename, options, name_expressions, cooperative)

    monkeypatch.setattr(kernels, "_module_entry", recorded)
    kernels.clear_cache()  # (every kernel looked up again: CuPy loads its cached binaries)
    tree = kd.build(V, F, config=cfg, device="cuda", kernels=loop, settings=settings)
    coop = cooperative_launch(0)
    listed = set(build_modules(cfg, settings, F.shape[0], grid=loop == "fused" and coop,
                               cooperative=coop))
    assert set(asked) <= listed, set(asked) - listed
    # the build ran what the list is about
    assert compile_ahead.ModuleSpec("build.cu") in asked
    if loop == "fused" and coop:
        assert any(spec.filename.startswith("build_loop") for spec in asked)
    if tree.build_info.get("small_subtrees"):
        assert compile_ahead.ModuleSpec("build_small_leaves.cu") in asked


@pytest.mark.gpu
@needs_gpu
def test_modules_compiled_ahead_are_loaded_not_compiled_again(tmp_path):
    # a machine with empty caches, in a process of its own: the children compile,
    # the parent then finds every binary in CuPy's cache; a later process finds
    # the children's stamps and compiles nothing
    code = """
import json
import cupy.cuda.compiler as compiler
from kdtree_gpu import compile_ahead, kernels
compiled = []
nvrtc = compiler._compile_using_nvrtc_no_warning
def counted(source, *args, **kwargs):
    if '#line 1 "' in source:  # (the package's modules; CuPy compiles its own kernels too)
        compiled.append(source.split('#line 1 "')[1].split('"')[0])
    return nvrtc(source, *args, **kwargs)
compiler._compile_using_nvrtc_no_warning = counted
specs = [compile_ahead.ModuleSpec("primitives.cu"),
         compile_ahead.ModuleSpec("build_small_leaves.cu")]
ahead = compile_ahead.compile_modules(specs, workers=2)
for spec in specs:
    kernels.get_module(*spec).compile()
print(json.dumps({"ahead": ahead, "in_process": compiled}))
"""
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cupy"),
               KDTREE_GPU_CACHE_DIR=str(tmp_path / "kd"))
    env.pop("KDTREE_GPU_COMPILE_PROCESSES", None)
    root = str(kernels.CUDA_DIR.parent.parent)
    # (run elsewhere, with this package first on the path: the children must
    # import the parent's package, not one in the working directory)
    def process():
        proc = subprocess.run([sys.executable, "-c",
                               f"import sys; sys.path.insert(0, {root!r})\n" + code],
                              env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr

    result, err = process()
    assert result["ahead"] == ["primitives.cu", "build_small_leaves.cu"]
    assert result["in_process"] == []
    assert "compiling GPU kernels" in err
    assert len(list((tmp_path / "kd" / "gpu_modules").iterdir())) == 2
    # a later process: stamped by the children, nothing compiled anywhere
    result, err = process()
    assert result == {"ahead": [], "in_process": []}
    assert "compiling" not in err
