"""The CUDA module factory: source assembly, naming rules, memoization."""

import re

import pytest

from kdtree_gpu import encoding, kernels
from kdtree_gpu.device import gpu_available

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")


def test_cuda_sources_lists_cu_files():
    sources = kernels.cuda_sources()
    assert sources, "kdtree_gpu/cuda has no .cu files"
    assert all(p.suffix == ".cu" and p.parent == kernels.CUDA_DIR for p in sources)
    assert [p.name for p in sources] == sorted(p.name for p in sources)
    assert "primitives.cu" in [p.name for p in sources]


def test_read_source_prepends_the_preamble_and_resets_line_numbers():
    text = kernels.read_source("primitives.cu")
    preamble = kernels.cuda_preamble()
    assert preamble.startswith(encoding.cuda_defines())
    assert "struct KdEvents {" in preamble and "struct KdLoopSettings {" in preamble
    assert text.startswith(preamble)
    rest = text[len(preamble):].splitlines()
    assert rest[0].startswith("// kd-headers ")
    assert rest[1] == '#line 1 "primitives.cu"'
    assert "\n".join(rest[2:]) + "\n" == (kernels.CUDA_DIR / "primitives.cu").read_text()


def test_read_source_rejects_bad_names():
    with pytest.raises(FileNotFoundError, match="available: .*primitives.cu"):
        kernels.read_source("missing.cu")
    for bad in ("../kernels.py", "primitives", "sub/primitives.cu"):
        with pytest.raises(ValueError, match=".cu file"):
            kernels.read_source(bad)


def test_kernel_names_carry_the_prefix():
    with pytest.raises(ValueError, match="start with 'kd_'"):
        kernels.get_function("primitives.cu", "segmented_min_u32")
    # every extern "C" kernel in the sources follows the convention
    pattern = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+"
                         r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")
    for source in kernels.cuda_sources():
        for name in pattern.findall(source.read_text()):
            assert name.startswith("kd_"), f"{source.name}: {name}"


def test_kernel_parameters_take_macros_from_included_headers():
    # the loop's entry points name their parameters by a macro of build_loop.cuh:
    # both files' kernels take the same list, read from the header
    two = kernels.kernel_parameters("build_loop.cu", "kd_build_levels_grid")
    one = kernels.kernel_parameters("build_loop_one_block.cu", "kd_build_levels_grid_one_block")
    assert one == two and len(two) > 10
    assert ("status", "long long", True) in two
    with pytest.raises(ValueError, match="no definition"):
        kernels.kernel_parameters("build_loop_one_block.cu", "kd_build_levels_grid")


def test_compile_options_include_std_and_include_path():
    options = kernels.compile_options(("-DKD_X=1",))
    assert "--std=c++17" in options
    assert f"-I{kernels.CUDA_DIR}" in options
    assert options[-1] == "-DKD_X=1"
    assert not any("fast" in o for o in options)


def test_write_defines_header(tmp_path):
    path = kernels.write_defines_header(tmp_path / "sub" / "kd_defines.h")
    text = path.read_text()
    assert text.startswith("#pragma once")
    assert f"#define KD_AXIS_LEAF ({encoding.AXIS_LEAF})" in text


@pytest.mark.skipif(gpu_available(), reason="checks the error without a GPU")
def test_get_module_without_gpu_raises_clearly():
    with pytest.raises(RuntimeError, match="compiling primitives.cu needs a CUDA GPU"):
        kernels.get_module("primitives.cu")


@pytest.mark.gpu
@needs_gpu
def test_get_module_is_memoized_per_device():
    kernels.clear_cache()
    m1 = kernels.get_module("primitives.cu")
    assert kernels.get_module("primitives.cu") is m1
    assert kernels.get_module("primitives.cu", options=("-DKD_UNUSED=1",)) is not m1
    f1 = kernels.get_function("primitives.cu", "kd_segmented_min_u32")
    assert kernels.get_function("primitives.cu", "kd_segmented_min_u32") is f1
    assert f1.name == "kd_segmented_min_u32"


def test_no_source_repeats_a_generated_constant():
    # every number shared with Python comes from the generated defines
    names = {line.split()[1] for line in encoding.cuda_defines().splitlines()
             if line.startswith("#define")}
    for source in sorted(kernels.CUDA_DIR.glob("*.cu*")):
        for line in source.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] == "#define":
                assert words[1] not in names, f"{source.name} defines {words[1]} again"


def test_float_constants_are_exact_hex_literals():
    text = encoding.cuda_defines()
    assert f"#define KD_TRAVERSE_EPS ({float(encoding.TRAVERSE_EPS).hex()}f)" in text
    assert float.fromhex("0x1.0000000000000p-18") == float(encoding.TRAVERSE_EPS)
    assert "#define KD_NO_INDEX (18446744073709551615ull)" in text
    assert "#define KD_NO_HIT (-1)" in text


def test_first_compile_on_a_machine_says_so_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kernels, "_announced", False)
    calls = []
    first, second = tmp_path / "gpu_modules" / "a", tmp_path / "gpu_modules" / "b"
    assert kernels.compile_announced(first, lambda: calls.append(1) or "module", arch="90") \
        == "module"
    assert capsys.readouterr().err.strip() == kernels.GPU_COMPILE_MESSAGE.format(arch="90")
    assert first.exists()
    # another new module in the same process: compiled, stamped, no second message
    kernels.compile_announced(second, lambda: calls.append(2))
    assert capsys.readouterr().err == "" and second.exists()
    # a later process (fresh flags) finds the stamps: no message
    monkeypatch.setattr(kernels, "_announced", False)
    kernels.compile_announced(first, lambda: calls.append(3))
    assert capsys.readouterr().err == ""
    assert calls == [1, 2, 3]


def test_unwritable_stamp_directory_is_not_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kernels, "_announced", False)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert kernels.compile_announced(blocker / "gpu_modules" / "a", lambda: 7) == 7
    assert "compiling GPU kernels" in capsys.readouterr().err


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KDTREE_GPU_CACHE_DIR", str(tmp_path))
    assert kernels.cache_dir() == tmp_path


@pytest.mark.gpu
@needs_gpu
def test_gpu_build_on_a_new_machine_announces_its_compile_once(tmp_path, monkeypatch, capsys):
    import numpy as np

    import kdtree_gpu as kd

    V = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], np.float32)
    F = np.array([[0, 1, 2]], np.int32)
    monkeypatch.setenv("KDTREE_GPU_CACHE_DIR", str(tmp_path))  # a machine with no stamps
    monkeypatch.setattr(kernels, "_announced", False)
    kernels.clear_cache()
    kd.build(V, F, device="cuda")
    assert capsys.readouterr().err.count("compiling GPU kernels") == 1
    assert list((tmp_path / "gpu_modules").iterdir())
    # a later process on the same machine: stamps found, nothing said
    monkeypatch.setattr(kernels, "_announced", False)
    kernels.clear_cache()
    kd.build(V, F, device="cuda")
    assert "compiling" not in capsys.readouterr().err
