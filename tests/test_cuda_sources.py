"""Every .cu file compiles with nvcc as the module factory assembles it (no GPU needed)."""

import subprocess
import sys

import pytest

from kdtree_gpu import kernels

pytestmark = pytest.mark.skipif(kernels.find_nvcc() is None, reason="nvcc not installed")


@pytest.mark.parametrize("source", kernels.cuda_sources(), ids=lambda p: p.name)
def test_source_compiles(source):
    failures = kernels.check_sources(sources=[source])
    assert failures == {}, failures.get(source.name)


def test_check_command_reports_a_broken_file(tmp_path):
    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" __global__ void kd_broken(int* x) { x[0] = KD_NOT_DEFINED; }\n')
    good = kernels.CUDA_DIR / "primitives.cu"
    proc = subprocess.run([sys.executable, "-m", "kdtree_gpu.kernels", "--check", "--ptx",
                           str(good), str(broken)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "FAILED broken.cu" in proc.stdout
    assert "ok     primitives.cu" in proc.stdout
    assert "KD_NOT_DEFINED" in proc.stderr


def test_defines_are_visible_to_sources(tmp_path):
    uses = tmp_path / "uses_defines.cu"
    uses.write_text('extern "C" __global__ void kd_uses(int* x) { x[0] = KD_AXIS_LEAF + KD_NO_HIT; }\n')
    assert kernels.check_sources(sources=[uses], ptx=True) == {}
