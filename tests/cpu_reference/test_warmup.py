"""The first compilation is announced once; cached code and warm processes stay silent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from numba.core import event

import cpu_reference
from cpu_reference.warmup import COMPILE_MESSAGE
from kdtree_gpu import SAHConfig

REPO = Path(__file__).resolve().parents[2]

# kd.build on the CPU first (it warms up before its clock starts), then the
# builder's own warm-up and build: the message at most once per process
SCRIPT = """
import json, numpy as np, cpu_reference, kdtree_gpu
V = np.random.default_rng(0).random((30, 3)).astype(np.float32)
front = kdtree_gpu.build(V, np.arange(30).reshape(10, 3), device="cpu")
result = cpu_reference.warm_up()
tree = cpu_reference.build(V, np.arange(30).reshape(10, 3))
print(json.dumps({"compiled": result.compiled, "seconds": result.seconds,
                  "front_compiled": front.build_info["compiled"],
                  "build_compiled": tree.build_info["compiled"]}))
"""


def run_fresh(cache_dir):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_first_compile_is_announced_once_and_the_cached_run_is_silent(tmp_path):
    # a new numba cache folder: this process compiles (about 30 s), the next one loads
    first, stderr = run_fresh(tmp_path / "numba")
    # kd.build compiled before its clock started: the build it timed compiled nothing
    assert first["front_compiled"] is False
    assert first["compiled"] is False and first["build_compiled"] is False  # warm since
    assert stderr.count(COMPILE_MESSAGE) == 1, stderr
    assert stderr.strip() == COMPILE_MESSAGE  # one line, nothing else
    second, stderr = run_fresh(tmp_path / "numba")
    assert second["compiled"] is False
    assert COMPILE_MESSAGE not in stderr, stderr


def test_warm_process_returns_at_once_and_builds_compile_nothing():
    cpu_reference.warm_up()
    again = cpu_reference.warm_up()
    assert again.compiled is False

    compiled = []

    class Listener(event.Listener):
        def on_start(self, ev):
            compiled.append(ev.data["dispatcher"].py_func.__qualname__)

        def on_end(self, ev):
            pass

    # every setting and thread count uses the kernels as warm_up() compiled them
    rng = np.random.default_rng(3)
    centres = rng.random((3000, 1, 3))
    V = (centres + 0.02 * rng.normal(size=(3000, 3, 3))).reshape(-1, 3).astype(np.float32)
    F = np.arange(V.shape[0]).reshape(-1, 3)
    with event.install_listener("numba:compile", Listener()):
        for config in (SAHConfig(), SAHConfig(clip=True, axes="longest", leaf_size=3)):
            for threads in (1, 2):
                tree = cpu_reference.build(V, F, config, threads=threads)
                assert tree.build_info["compiled"] is False
    assert compiled == []


RAYS_SCRIPT = """
import numpy as np, cpu_reference, kdtree_gpu
cpu_reference.warm_up()
V = np.random.default_rng(0).random((30, 3)).astype(np.float32)
tree = kdtree_gpu.build(V, np.arange(30).reshape(10, 3), device="cpu")
O = np.random.default_rng(1).random((50, 3)).astype(np.float32)
tree.intersect(O, -O, device="cpu")
tree.occluded(O, -O, device="cpu")
"""


def test_first_cpu_rays_announce_their_compile_once(tmp_path):
    from kdtree_gpu.trace.api import RAY_COMPILE_MESSAGE

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    runs = [subprocess.run([sys.executable, "-c", RAYS_SCRIPT], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=900) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    assert runs[0].stderr.splitlines() == [COMPILE_MESSAGE, RAY_COMPILE_MESSAGE], runs[0].stderr
    assert runs[1].stderr == ""
