"""``kdtree-gpu build`` on Dask: ``--workers N`` (a local cluster) and ``--scheduler ADDRESS``.

Every cluster here is real: worker processes started by Dask nannies
(``--workers 2``), or a ``dask scheduler`` and two ``dask worker`` processes
talking TCP on 127.0.0.1. Builds run on the CPU, so the tests run anywhere
Dask is installed and skip where it is not.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import kdtree_gpu

def needs_dask():
    pytest.importorskip("distributed")


@pytest.fixture
def collection(tmp_path, cli_helpers):
    """34 small meshes (one with a degenerate triangle) and a broken file."""
    folder = tmp_path / "meshes"
    folder.mkdir()
    for i in range(34):
        vertices, faces = cli_helpers.grid_mesh(3 + i % 7, seed=i)
        if i == 5:
            faces = np.concatenate([faces, [[0, 1, 1]]])
        cli_helpers.write_ply(folder / f"mesh{i:02d}.ply", vertices, faces)
    (folder / "broken.ply").write_bytes(b"ply\nnot really\x00")
    return folder


@pytest.fixture
def warm_cpu_builder():
    """Compile (or load) the CPU builder here first, so that workers find numba's cache."""
    kdtree_gpu.build(*kdtree_gpu.scenes.cornell_box().arrays(), device="cpu")


def json_records(out: str) -> list:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def assert_same_trees(folder_a: Path, folder_b: Path):
    names = sorted(p.name for p in folder_a.glob("*.kdt"))
    assert names == sorted(p.name for p in folder_b.glob("*.kdt"))
    for name in names:
        a, b = kdtree_gpu.load_tree(folder_a / name), kdtree_gpu.load_tree(folder_b / name)
        assert a.compare(b) is None, name
        assert a.num_degenerate == b.num_degenerate, name
    return names


def same_code_env() -> dict:
    """The environment of a subprocess that imports the kdtree_gpu these tests import
    (and so finds the numba cache they filled)."""
    env = dict(os.environ)
    root = str(Path(kdtree_gpu.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_workers_build_the_collection_as_this_process_does_and_a_rerun_skips_it(
        run_cli, collection, tmp_path, warm_cpu_builder):
    needs_dask()
    meshes = str(collection / "*.ply")
    code, _, err = run_cli("build", meshes, "-o", tmp_path / "here", "--device", "cpu")
    assert code == 1 and "broken.ply" in err

    start = time.perf_counter()
    code, out, err = run_cli("build", meshes, "-o", tmp_path / "there", "--workers", "2",
                             "--device", "cpu", "--json")
    first_s = time.perf_counter() - start
    assert code == 1  # the broken mesh
    records = json_records(out)
    assert len(records) == 35
    failed = [r for r in records if not r["ok"]]
    assert len(failed) == 1 and "broken.ply" in failed[0]["mesh"]
    assert "kdtree-gpu: error: " in err and "1 of 35 meshes failed" in err
    assert "local cluster: 2 CPU worker processes" in err and "dashboard: http" in err
    built = [r for r in records if r["ok"]]
    assert {r["status"] for r in built} == {"built"}
    assert {r["device"] for r in built} == {"cpu"}
    assert len({r["worker"] for r in built}) == 2  # both workers built meshes
    assert all(r["worker"].startswith("tcp://127.0.0.1:") for r in built)
    assert len(assert_same_trees(tmp_path / "here", tmp_path / "there")) == 34
    assert not list((tmp_path / "there").glob(".*"))

    # the same collection again: every tree is up to date, no cluster starts
    good = str(collection / "mesh*.ply")
    start = time.perf_counter()
    code, out, err = run_cli("build", good, "-o", tmp_path / "there", "--workers", "2",
                             "--device", "cpu", "--json")
    second_s = time.perf_counter() - start
    assert code == 0, err
    assert [r["status"] for r in json_records(out)] == ["up to date"] * 34
    assert "local cluster" not in err
    assert second_s * 10 <= first_s, (first_s, second_s)
    # with the broken mesh: only it is tried again (here, in this process)
    code, out, _ = run_cli("build", meshes, "-o", tmp_path / "there", "--device", "cpu")
    assert code == 1
    assert out.count(": up to date -> ") == 34


def test_scheduler_runs_the_batch_on_dask_workers_over_tcp(run_cli, collection, tmp_path,
                                                          warm_cpu_builder):
    needs_dask()
    from distributed import Client

    meshes = [collection / f"mesh{i:02d}.ply" for i in range(12)] + [collection / "broken.ply"]
    code, _, _ = run_cli("build", *meshes, "-o", tmp_path / "here", "--device", "cpu")
    assert code == 1
    address = f"tcp://127.0.0.1:{free_port()}"
    dask = [sys.executable, "-m", "dask"]
    processes = []
    # each in a process group of its own, ended at the end by its id
    start = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                 cwd=tmp_path, env=same_code_env())
    try:
        processes.append(subprocess.Popen(
            dask + ["scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                    "--no-dashboard"], **start))
        for name in ("w1", "w2"):
            processes.append(subprocess.Popen(
                dask + ["worker", address, "--name", name, "--nworkers", "1", "--nthreads", "1",
                        "--no-dashboard"], **start))
        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
        code, out, err = run_cli("build", *meshes, "-o", tmp_path / "there", "--scheduler",
                                 address, "--json")
    finally:
        for process in reversed(processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    assert code == 1
    assert f"cluster at {address}: 2 workers" in err
    records = json_records(out)
    assert [r["ok"] for r in records].count(False) == 1
    built = [r for r in records if r["ok"]]
    assert len(built) == 12 and len({r["worker"] for r in built}) == 2
    assert len(assert_same_trees(tmp_path / "here", tmp_path / "there")) == 12


def test_ctrl_c_cancels_the_batch_and_leaves_only_complete_trees(tmp_path, cli_helpers,
                                                                 warm_cpu_builder):
    needs_dask()
    folder = tmp_path / "larger"
    folder.mkdir()
    # enough work that the interrupt lands mid-batch: 24 meshes of 28,800 triangles
    # (16 of 5,000 could all be built between the first record and the signal)
    for i in range(24):
        cli_helpers.write_ply(folder / f"grid{i:02d}.ply", *cli_helpers.grid_mesh(120, seed=i))
    out = tmp_path / "out"
    # a terminal's Ctrl-C: SIGINT to the whole process group, workers included
    process = subprocess.Popen(
        [sys.executable, "-m", "kdtree_gpu", "build", str(folder / "*.ply"), "-o", str(out),
         "--workers", "2", "--device", "cpu", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        cwd=tmp_path, env=same_code_env(),
        # a test runner started in the background of a shell inherits SIGINT ignored
        # (and Python then keeps it so): give the command a terminal's default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = process.stdout.readline()
        assert json.loads(first)["status"] == "built"
        os.killpg(process.pid, signal.SIGINT)
        rest, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, err
    assert err.splitlines()[-1] == "kdtree-gpu: error: interrupted"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    names = sorted(p.name for p in out.iterdir())
    assert all(not name.startswith(".") for name in names), names  # no partial files
    for name in names:
        kdtree_gpu.load_tree(out / name)  # complete: the checksum holds
    assert 1 <= len(names)
    # the batch resumes: what was built is up to date, the rest builds
    done = subprocess.run([sys.executable, "-m", "kdtree_gpu", "build", str(folder / "*.ply"),
                           "-o", str(out), "--device", "cpu", "--json"],
                          capture_output=True, text=True, cwd=tmp_path, env=same_code_env(),
                          timeout=120)
    assert done.returncode == 0, done.stderr
    statuses = [r["status"] for r in json_records(done.stdout)]
    assert statuses.count("up to date") == len(names) and statuses.count("built") == 24 - len(names)


def test_without_dask_the_options_say_what_to_install(run_cli, cli_helpers, tiny_ply, tmp_path,
                                                      monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)
    for option in (["--workers", "2"], ["--scheduler", "tcp://127.0.0.1:8786"]):
        code, out, err = run_cli("build", tiny_ply, "-o", tmp_path / "t.kdt", *option)
        assert code == 2 and out == ""
        cli_helpers.assert_one_line_error(err, f"{option[0]} needs Dask",
                                          "pip install 'kdtree-gpu[dask]'")
    assert not (tmp_path / "t.kdt").exists()


def test_workers_and_scheduler_usage_errors(run_cli, cli_helpers, tiny_ply, tmp_path,
                                            monkeypatch):
    needs_dask()
    from kdtree_gpu import batch

    code, _, err = run_cli("build", tiny_ply, "--workers", "2", "--scheduler", "tcp://x:1")
    assert code == 2
    cli_helpers.assert_one_line_error(err, "not allowed with argument")
    code, _, err = run_cli("build", tiny_ply, "--workers", "0")
    assert code == 2
    cli_helpers.assert_one_line_error(err, "--workers", "positive integer")
    code, _, err = run_cli("build", tiny_ply, "--workers", "2", "--device", "cuda:1")
    assert code == 2
    cli_helpers.assert_one_line_error(err, "--device cuda:1", "each worker uses its own GPU")
    # nobody listens at this address
    monkeypatch.setattr(batch.cluster, "CONNECT_TIMEOUT_S", 1)
    address = f"tcp://127.0.0.1:{free_port()}"
    code, _, err = run_cli("build", tiny_ply, "-o", tmp_path / "t.kdt", "--scheduler", address)
    assert code == 2
    cli_helpers.assert_one_line_error(err, f"--scheduler {address}")
    assert not (tmp_path / "t.kdt").exists()
