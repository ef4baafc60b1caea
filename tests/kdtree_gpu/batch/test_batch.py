"""``kd.build_many`` (kdtree_gpu.batch): in this process, and on a local Dask cluster.

The in-process tests need no Dask; the cluster tests start worker processes
(a real ``SpecCluster`` of nannies) and skip without Dask. The GPU-worker test
(marked ``gpu``) runs one worker per GPU, two where two GPUs are visible.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kdtree_gpu as kd
from kdtree_gpu import batch
from kdtree_gpu.config import SAHConfig
from kdtree_gpu.tree import read_header

def bumpy_grid(n, seed):
    """An n x n height field of 2 (n-1)^2 triangles."""
    rng = np.random.default_rng(seed)
    ii, jj = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    vertices = np.stack([ii.ravel(), jj.ravel(), 0.3 * rng.random(n * n)], axis=1)
    quads = (ii[:-1, :-1] * n + jj[:-1, :-1]).ravel()
    faces = np.concatenate([np.stack([quads, quads + n, quads + 1], axis=1),
                            np.stack([quads + n, quads + n + 1, quads + 1], axis=1)])
    return vertices.astype(np.float32), faces.astype(np.int32)


def write_mesh(path: Path, vertices, faces) -> Path:
    import trimesh

    trimesh.Trimesh(vertices=vertices, faces=faces, process=False).export(path)
    return path


@pytest.fixture
def meshes(tmp_path):
    """Five small meshes, one with a degenerate triangle, as PLY files."""
    folder = tmp_path / "meshes"
    folder.mkdir()
    paths = []
    for i in range(5):
        vertices, faces = bumpy_grid(3 + i, seed=i)
        if i == 2:
            faces = np.concatenate([faces, [[0, 0, 1]]])  # zero area: left out of the tree
        paths.append(write_mesh(folder / f"mesh{i}.ply", vertices, faces))
    return paths


def assert_same_trees(folder_a: Path, folder_b: Path, names):
    for name in names:
        a, b = kd.load_tree(folder_a / name), kd.load_tree(folder_b / name)
        assert a.compare(b) is None, name
        assert a.num_degenerate == b.num_degenerate, name


# --- in this process -------------------------------------------------------------------------

def test_builds_every_mesh_and_reports_each(meshes, tmp_path):
    seen = []
    report = kd.build_many(meshes, tmp_path / "trees", device="cpu", on_record=seen.append)
    assert [r.status for r in report] == ["built"] * 5 and report.ok
    assert [r.index for r in seen] == list(range(5))
    for path, record in zip(meshes, report):
        tree = kd.load_tree(record.output)
        assert record.output == str(tmp_path / "trees" / (path.stem + ".kdt"))
        assert record.input == str(path) and record.reason == "new"
        assert record.triangles == tree.num_triangles and record.seconds > 0
        assert (record.worker, record.device, record.gpu, record.retries) == ("local", "cpu",
                                                                              None, 0)
        assert record.stats["nodes"] == tree.num_nodes
        reference = kd.build(*kd.load_mesh(path), device="cpu")
        assert tree.compare(reference) is None
        assert tree.num_degenerate == reference.num_degenerate
    assert report[2].to_dict()["triangles"] == 33 and "exception" not in report[2].to_dict()
    assert report.summary().startswith("5 meshes: 5 built, 0 up to date, 0 failed")


def test_a_tree_records_its_mesh_and_a_second_run_skips_it(meshes, tmp_path):
    out = tmp_path / "trees"
    kd.build_many(meshes, out, device="cpu")
    header = read_header(out / "mesh0.kdt")
    source = header["build_info"]["source"]
    assert source["sha256"] == hashlib.sha256(meshes[0].read_bytes()).hexdigest()
    assert source["path"] == str(meshes[0].resolve()) and "loader" not in source
    assert header["config"] == SAHConfig().to_dict()
    before = [os.stat(out / f"mesh{i}.kdt").st_mtime_ns for i in range(5)]
    report = kd.build_many(meshes, out, device="cpu")
    assert [r.status for r in report] == ["up to date"] * 5
    assert report[0].triangles == 8 and report[0].sha256 == source["sha256"]
    assert [os.stat(out / f"mesh{i}.kdt").st_mtime_ns for i in range(5)] == before
    report = kd.build_many(meshes[:2], out, device="cpu", force=True)
    assert [(r.status, r.reason) for r in report] == [("built", "forced")] * 2


def test_changed_settings_or_mesh_rebuild_and_other_files_are_kept(meshes, tmp_path):
    out = tmp_path / "trees"
    kd.build_many(meshes[:3], out, device="cpu")
    # other settings: every tree is out of date
    report = kd.build_many(meshes[:3], out, device="cpu", config=SAHConfig(leaf_size=2))
    assert [(r.status, r.reason) for r in report] == [("built", "settings changed")] * 3
    assert kd.load_tree(out / "mesh0.kdt").config.leaf_size == 2
    # a changed mesh file
    write_mesh(meshes[0], *bumpy_grid(6, seed=9))
    report = kd.build_many(meshes[:3], out, device="cpu", config=SAHConfig(leaf_size=2))
    assert [(r.status, r.reason) for r in report] == [("built", "mesh changed"),
                                                      ("up to date", None), ("up to date", None)]
    # files that are not trees of these meshes stay unless force=True
    (out / "mesh1.kdt").write_bytes(b"keep me")
    kd.build(*kd.load_mesh(meshes[2]), device="cpu").save(out / "mesh2.kdt")  # no record
    report = kd.build_many(meshes[:3], out, device="cpu", config=SAHConfig(leaf_size=2))
    assert [r.status for r in report] == ["up to date", "failed", "failed"]
    assert "is not a tree file" in report[1].error and "force=True" in report[1].error
    assert "without a record of its mesh" in report[2].error
    assert report[1].input_error and isinstance(report[1].exception, batch.OutputExistsError)
    assert (out / "mesh1.kdt").read_bytes() == b"keep me"
    report = kd.build_many(meshes[:3], out, device="cpu", force=True)
    assert report.ok and kd.load_tree(out / "mesh1.kdt").num_triangles == 18


def test_a_mesh_that_fails_is_reported_and_the_others_build(meshes, tmp_path):
    broken = tmp_path / "broken.ply"
    broken.write_bytes(b"not a mesh at all")
    missing = tmp_path / "missing.ply"
    report = kd.build_many([meshes[0], broken, missing, meshes[1]], tmp_path / "trees",
                           device="cpu")
    assert [r.status for r in report] == ["built", "failed", "failed", "built"]
    assert "broken.ply" in report[1].error and "cannot read as a mesh" in report[1].error
    assert "missing.ply" in report[2].error and report[2].input_error
    assert len(report.failed) == 2 and not report.ok
    assert sorted(p.name for p in (tmp_path / "trees").iterdir()) == ["mesh0.kdt", "mesh1.kdt"]


def test_two_meshes_with_one_output_build_once(meshes, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    twin = write_mesh(other / "mesh0.ply", *bumpy_grid(4, seed=5))
    report = kd.build_many([meshes[0], twin], tmp_path / "trees", device="cpu")
    assert [r.status for r in report] == ["built", "failed"]
    assert "also the output of an earlier mesh" in report[1].error


def load_twice_as_large(path):
    """A custom loader: the mesh scaled by 2 (a different tree from the same file)."""
    vertices, faces = kd.load_mesh(path)
    return 2 * vertices, faces


def test_custom_loaders_and_scene_names(meshes, tmp_path):
    out = tmp_path / "trees"
    report = kd.build_many([meshes[0]], out, device="cpu", loader=load_twice_as_large)
    assert report[0].status == "built"
    source = read_header(out / "mesh0.kdt")["build_info"]["source"]
    assert source["loader"].endswith("load_twice_as_large")
    assert np.allclose(kd.load_tree(out / "mesh0.kdt").vertices,
                       2 * kd.load_mesh(meshes[0])[0])
    # the default loader makes another tree: the one on disk is out of date
    report = kd.build_many([meshes[0]], out, device="cpu")
    assert (report[0].status, report[0].reason) == ("built", "settings changed")
    # a built-in scene: its arrays are what the record hashes
    report = kd.build_many(["cornell"], out, device="cpu")
    assert report[0].status == "built" and report[0].output == str(out / "cornell.kdt")
    assert kd.build_many(["cornell"], out, device="cpu")[0].status == "up to date"


def test_without_out_dir_or_with_a_bad_device_is_an_error(meshes, tmp_path):
    with pytest.raises(ValueError, match="out_dir"):
        kd.build_many(meshes, None)
    with pytest.raises(ValueError, match="device"):
        kd.build_many(meshes, tmp_path, device="tpu")
    with pytest.raises(ValueError, match="outputs"):
        kd.build_many(meshes, outputs=[tmp_path / "a.kdt"])


def test_in_process_needs_no_dask_and_import_stays_light(meshes, tmp_path):
    # a fresh interpreter in which Dask cannot be imported
    code = (
        "import sys\n"
        "sys.modules['dask'] = sys.modules['distributed'] = None\n"
        "import kdtree_gpu as kd\n"
        "assert 'kdtree_gpu.batch' not in sys.modules\n"
        f"report = kd.build_many([{str(meshes[0])!r}], {str(tmp_path / 'out')!r}, device='cpu')\n"
        "assert report.ok, report.records\n"
        "from kdtree_gpu import batch\n"
        "try:\n"
        "    batch.require_dask('--workers')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    # the kdtree_gpu these tests import (and the numba cache they filled)
    env = dict(os.environ)
    root = str(Path(kd.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("--workers needs Dask, which is not installed: "
                                   "pip install 'kdtree-gpu[dask]'")
    assert (tmp_path / "out" / "mesh0.kdt").is_file()


# --- on a local Dask cluster ------------------------------------------------------------------

class KillWorkerOnce:
    """A loader whose first load of one mesh kills the process running it (a crashed worker)."""

    def __init__(self, victim: str, marker: Path):
        self.victim, self.marker = victim, str(marker)

    def __call__(self, path):
        if Path(path).name == self.victim and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os._exit(1)
        return kd.load_mesh(path)


@pytest.fixture
def by_value():
    """Let worker processes unpickle this module's loader (they cannot import a test module)."""
    cloudpickle = pytest.importorskip("cloudpickle")
    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    yield
    cloudpickle.unregister_pickle_by_value(module)


def test_a_worker_killed_during_the_batch_is_retried_elsewhere(meshes, tmp_path, by_value):
    pytest.importorskip("distributed")
    kd.build_many(meshes, tmp_path / "here", device="cpu")  # also warms numba's cache
    marker = tmp_path / "killed-once"
    loader = KillWorkerOnce("mesh3.ply", marker)
    # two workers with a CUDA_VISIBLE_DEVICES each: what GPU workers get (their builds run
    # on the CPU here)
    with batch.local_client(2, device="cpu", gpus=["7", "8"], dashboard=False) as client:
        assert sorted(client.run(os.getenv, "CUDA_VISIBLE_DEVICES").values()) == ["7", "8"]
        assert "CUDA_VISIBLE_DEVICES 7, 8" in client.cluster.kdtree_gpu_layout.replace("GPU ", "")
        report = kd.build_many(meshes, tmp_path / "there", device="cpu", client=client,
                               loader=loader)
        client.wait_for_workers(2, timeout=60)  # the nanny restarts the dead one, same GPU
        assert sorted(client.run(os.getenv, "CUDA_VISIBLE_DEVICES").values()) == ["7", "8"]
    assert marker.is_file()  # a worker died
    assert report.ok, [r.error for r in report.failed]
    victim = report[3]
    assert (victim.status, victim.retries) == ("built", 1)
    assert victim.worker.startswith("tcp://") and victim.worker != "local"
    assert [r.retries for r in report if r is not victim] == [0] * 4
    assert_same_trees(tmp_path / "here", tmp_path / "there", [p.stem + ".kdt" for p in meshes])
    assert not list((tmp_path / "there").glob(".*"))  # no partial files


# --- GPU workers: one process per GPU, trees equal to this process's ---------------------

@pytest.fixture
def gpu_meshes(tmp_path):
    """Six meshes of 50 to 20,000 triangles, largest last (the batch starts the largest first)."""
    folder = tmp_path / "meshes"
    folder.mkdir()
    return [write_mesh(folder / f"grid{n}.ply", *bumpy_grid(n, seed=n))
            for n in (6, 12, 25, 40, 70, 101)]


def _worker_view():
    import cupy

    return os.environ.get("CUDA_VISIBLE_DEVICES"), cupy.cuda.runtime.getDeviceCount()


@pytest.mark.gpu
def test_gpu_workers_build_what_this_process_builds(gpu_meshes, tmp_path):
    pytest.importorskip("distributed")
    gpus = batch.visible_gpus()
    workers = min(2, len(gpus))
    names = [p.stem + ".kdt" for p in gpu_meshes]
    here = kd.build_many(gpu_meshes, tmp_path / "here", device="cuda")
    assert here.ok and {r.device for r in here} == {"cuda:0"}
    on_cpu = kd.build_many(gpu_meshes, tmp_path / "cpu", device="cpu")
    assert on_cpu.ok
    assert_same_trees(tmp_path / "cpu", tmp_path / "here", names)

    with batch.local_client(workers, device="cuda", dashboard=False) as client:
        views = sorted(client.run(_worker_view).values())
        # each worker sees exactly one GPU, a different one each
        assert views == sorted((g, 1) for g in gpus[:workers])
        assert "GPU" in client.cluster.kdtree_gpu_layout
        report = kd.build_many(gpu_meshes, tmp_path / "there", device="cuda", client=client)
    assert report.ok, [r.error for r in report.failed]
    assert all(r.status == "built" and r.worker.startswith("tcp://") for r in report)
    # every record names the GPU it ran on; with two workers both GPUs took meshes
    # (each takes one task at a time, and there are more meshes than workers)
    assert all(r.device == "cuda:0" and "CUDA_VISIBLE_DEVICES=" in r.gpu for r in report)
    used = {r.gpu.rsplit("=", 1)[1].rstrip(")") for r in report}
    assert used == set(gpus[:workers])
    assert_same_trees(tmp_path / "here", tmp_path / "there", names)
