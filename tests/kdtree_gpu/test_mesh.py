"""Tests of kdtree_gpu.mesh: loading meshes from files, names and objects."""

import numpy as np
import pytest
import trimesh

import kdtree_gpu as kd
from kdtree_gpu.mesh import MeshError
from kdtree_gpu.mesh import as_arrays, load_mesh, mesh_dir


@pytest.fixture
def box_mesh():
    mesh = trimesh.creation.box(extents=(1.0, 2.0, 3.0))
    return np.asarray(mesh.vertices, np.float32), np.asarray(mesh.faces, np.int32)


@pytest.mark.parametrize("suffix", [".ply", ".obj", ".stl", ".off", ".glb"])
def test_load_written_files(box_mesh, tmp_path, suffix):
    V, F = box_mesh
    path = tmp_path / f"box{suffix}"
    trimesh.Trimesh(V, F, process=False).export(path)
    V2, F2 = load_mesh(path)
    assert V2.dtype == np.float32 and F2.dtype == np.int32
    assert F2.shape == F.shape
    if suffix in (".ply", ".off", ".glb"):
        # these keep the vertex order and indexing
        np.testing.assert_allclose(V2, V, atol=1e-6)
        np.testing.assert_array_equal(F2, F)
    else:
        # STL stores triangles as corner lists; compare the triangles themselves
        np.testing.assert_allclose(np.sort(V2[F2].reshape(-1, 3), axis=0),
                                   np.sort(V[F].reshape(-1, 3), axis=0), atol=1e-6)


def test_obj_quads_are_triangulated(tmp_path):
    path = tmp_path / "quad.obj"
    path.write_text("v 0 0 0\nv 1 0 0\nv 1 1 0\nv 0 1 0\nf 1 2 3 4\n")
    V, F = load_mesh(path)
    assert V.shape == (4, 3) and F.shape == (2, 3)


def test_scene_with_several_geometries_is_concatenated(tmp_path):
    scene = trimesh.Scene([trimesh.creation.box(), trimesh.creation.icosphere(subdivisions=1)])
    path = tmp_path / "scene.glb"
    scene.export(path)
    V, F = load_mesh(path)
    assert F.shape[0] == 12 + 80
    V2, F2 = as_arrays(scene)
    assert F2.shape[0] == 12 + 80


def test_a_single_geometry_keeps_its_scene_transform(tmp_path):
    # a glTF node's transform applies to its one mesh, as it does to several
    box = trimesh.creation.box()
    shift = trimesh.transformations.translation_matrix([5.0, -2.0, 1.0])
    scene = trimesh.Scene()
    scene.add_geometry(box, transform=shift)
    path = tmp_path / "moved.glb"
    scene.export(path)
    V, F = load_mesh(path)
    assert F.shape == (12, 3)
    np.testing.assert_allclose(V.min(axis=0), box.vertices.min(axis=0) + [5.0, -2.0, 1.0])
    np.testing.assert_allclose(V.max(axis=0), box.vertices.max(axis=0) + [5.0, -2.0, 1.0])


def test_bare_name_lookup(box_mesh, tmp_path, monkeypatch):
    V, F = box_mesh
    trimesh.Trimesh(V, F, process=False).export(tmp_path / "mybox.ply")
    monkeypatch.setenv("KDTREE_GPU_MESH_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path.parent)
    assert mesh_dir() == tmp_path
    for name in ("mybox", "mybox.ply"):
        V2, F2 = load_mesh(name)
        np.testing.assert_array_equal(F2, F)
    assert kd.load_mesh("mybox")[1].shape == F.shape


def test_missing_file_names_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("KDTREE_GPU_MESH_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"nothing_here\.obj"):
        load_mesh("nothing_here")
    monkeypatch.delenv("KDTREE_GPU_MESH_DIR")
    assert mesh_dir() is None
    with pytest.raises(FileNotFoundError, match="KDTREE_GPU_MESH_DIR"):
        load_mesh("nothing_here")
    with pytest.raises(FileNotFoundError, match="not found"):
        load_mesh(tmp_path / "sub" / "missing.ply")


def test_garbage_file_is_a_mesh_error(tmp_path):
    path = tmp_path / "garbage.ply"
    path.write_bytes(b"ply\nthis is not a ply header\n\x00\x01\x02")
    with pytest.raises(MeshError, match="garbage.ply"):
        load_mesh(path)
    path = tmp_path / "garbage.stl"
    path.write_bytes(b"\x00" * 7)
    with pytest.raises(MeshError, match="garbage.stl"):
        load_mesh(path)


def test_invalid_meshes(tmp_path):
    path = tmp_path / "nan.obj"
    path.write_text("v 0 0 0\nv 1 0 nan\nv 0 1 0\nf 1 2 3\n")
    with pytest.raises(MeshError, match="NaN"):
        load_mesh(path)
    path = tmp_path / "points.obj"
    path.write_text("v 0 0 0\nv 1 0 0\n")
    with pytest.raises(MeshError):
        load_mesh(path)


def test_as_arrays_forms(box_mesh):
    V, F = box_mesh
    mesh = trimesh.Trimesh(V, F, process=False)
    for form in (mesh, (V, F), [V.astype(np.float64), F.astype(np.int64)]):
        V2, F2 = as_arrays(form)
        np.testing.assert_array_equal(V2, V)
        np.testing.assert_array_equal(F2, F)
    with pytest.raises(MeshError, match="expected a trimesh mesh"):
        as_arrays("not a mesh object")
    assert load_mesh(mesh)[1].shape == F.shape


def test_real_mesh_by_name(mesh_file):
    mesh_file("suzanne.ply")
    V, F = load_mesh("suzanne")
    assert V.shape == (507, 3) and F.shape == (968, 3)
