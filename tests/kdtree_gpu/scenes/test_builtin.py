"""Built-in procedural scenes (kdtree_gpu.scenes.builtin)."""

import numpy as np
import pytest
import trimesh

from kdtree_gpu import scenes


def test_cornell_box_layout():
    scene = scenes.cornell_box()
    V, F, M = scene.vertices, scene.faces, scene.tri_material
    assert F.shape == (36, 3) and M.shape == (36,)
    assert scene.material is M
    np.testing.assert_array_equal(V.min(axis=0), [-1, 0, -1])
    np.testing.assert_array_equal(V.max(axis=0), [1, 2, 1])
    names = scene.material_names
    counts = {names[k]: int(np.sum(M == k)) for k in range(len(names))}
    assert counts == {"white": 6 + 24, "red": 2, "green": 2, "light": 2, "object": 0}
    P = V[F].astype(np.float64)
    normal = np.cross(P[:, 1] - P[:, 0], P[:, 2] - P[:, 0])
    centre = P.mean(axis=1)
    red, green, light = M == scenes.RED, M == scenes.GREEN, M == scenes.LIGHT
    assert np.all(P[red][..., 0] == -1) and np.all(normal[red][:, 0] > 0)
    assert np.all(P[green][..., 0] == 1) and np.all(normal[green][:, 0] < 0)
    # the light faces down, just below the ceiling, and is the only emitter
    assert np.all(normal[light][:, 1] < 0)
    assert np.all(np.abs(centre[light][:, 1] - scenes.LIGHT_HEIGHT) < 1e-6)
    assert np.all(scene.material_emission[M[~light]] == 0)
    assert np.all(scene.material_emission[scenes.LIGHT] > 0)
    assert np.all((scene.material_albedo >= 0) & (scene.material_albedo < 1))
    # open front: nothing at z = +1 except wall edges
    assert not np.any(np.all(P[..., 2] == 1, axis=1))
    assert scene.camera.position[2] > 1 and scene.camera.look_at == (0.0, 1.0, 0.0)


def closed_parts(vertices, faces):
    """Split a mesh into closed, consistently oriented parts, or fail the test.

    Vertices at the same position are merged first. A part is closed with
    consistent orientation when every directed edge ``a -> b`` of its
    triangles appears exactly once and its reverse ``b -> a`` exactly once.

    Returns
    -------
    part_volume : (num_parts,) float64
        Signed volume of each edge-connected part (positive when the normals
        point outward).
    """
    _, vertex_id = np.unique(vertices, axis=0, return_inverse=True)
    F = vertex_id.reshape(-1)[faces].astype(np.int64)
    num_vertices = int(F.max()) + 1
    edge_from = F.reshape(-1)
    edge_to = F[:, [1, 2, 0]].reshape(-1)
    edge_key = edge_from * num_vertices + edge_to
    reverse_key = edge_to * num_vertices + edge_from
    keys, counts = np.unique(edge_key, return_counts=True)
    assert counts.max() == 1, "a directed edge is used twice (inconsistent orientation)"
    assert np.isin(reverse_key, keys).all(), "an edge has no opposite edge (the mesh is open)"

    # parts: spread the smallest vertex label along the edges until nothing changes
    vertex_part = np.arange(num_vertices)
    while True:
        low = np.minimum(vertex_part[edge_from], vertex_part[edge_to])
        new_part = vertex_part.copy()
        np.minimum.at(new_part, edge_from, low)
        np.minimum.at(new_part, edge_to, low)
        if np.array_equal(new_part, vertex_part):
            break
        vertex_part = new_part
    _, face_part = np.unique(vertex_part[F[:, 0]], return_inverse=True)

    # signed volume (divergence theorem): sum of p0 . (p1 x p2) / 6 per part
    P = vertices[faces].astype(np.float64)
    tri_volume = np.einsum("ij,ij->i", P[:, 0], np.cross(P[:, 1], P[:, 2])) / 6
    return np.bincount(face_part.reshape(-1), weights=tri_volume)


def test_cornell_boxes_are_closed():
    scene = scenes.cornell_box()
    part_volume = closed_parts(scene.vertices, scene.faces[12:])
    # two boxes, normals outward: each closed box has positive volume
    assert part_volume.shape == (2,) and np.all(part_volume > 0)


def test_closed_parts_finds_open_and_flipped_meshes():
    sphere = scenes.icosphere(subdivisions=1)
    np.testing.assert_allclose(closed_parts(sphere.vertices, sphere.faces), [np.pi * 4 / 3],
                               rtol=0.3)
    with pytest.raises(AssertionError, match="open"):
        closed_parts(sphere.vertices, sphere.faces[1:])
    flipped = sphere.faces.copy()
    flipped[0] = flipped[0, ::-1]
    with pytest.raises(AssertionError, match="inconsistent orientation"):
        closed_parts(sphere.vertices, flipped)
    inside_out = closed_parts(sphere.vertices, sphere.faces[:, ::-1])
    assert inside_out.shape == (1,) and inside_out[0] < 0


def test_cornell_box_with_mesh():
    sphere = scenes.icosphere(subdivisions=1, radius=5.0)
    scene = scenes.cornell_box_with(sphere.vertices, sphere.faces, size=1.0)
    assert scene.faces.shape[0] == 12 + 80
    obj = scene.tri_material == scenes.OBJECT
    assert obj.sum() == 80
    P = scene.vertices[scene.faces[obj]].reshape(-1, 3)
    assert P[:, 1].min() == 0.0
    np.testing.assert_allclose(P.max(axis=0) - P.min(axis=0), 1.0, rtol=1e-5)
    assert np.all(np.abs(P[:, [0, 2]]) <= 0.5 + 1e-6)


def test_icosphere():
    for s in range(4):
        scene = scenes.icosphere(subdivisions=s, radius=2.0)
        assert scene.faces.shape[0] == 20 * 4 ** s
        np.testing.assert_allclose(np.linalg.norm(scene.vertices, axis=1), 2.0, rtol=1e-6)
        part_volume = closed_parts(scene.vertices, scene.faces)
        assert part_volume.shape == (1,) and part_volume[0] > 0
    with pytest.raises(ValueError, match="subdivisions"):
        scenes.icosphere(subdivisions=-1)


def test_soup_and_quads():
    soup = scenes.random_soup(1000, seed=1)
    assert soup.faces.shape == (1000, 3)
    assert not np.array_equal(soup.vertices, scenes.random_soup(1000, seed=2).vertices)
    quads = scenes.quad_grid(n=5, layers=3)
    assert quads.faces.shape[0] == 2 * 3 * 3 * 25
    P = quads.vertices[quads.faces]
    flat = (P.min(axis=1) == P.max(axis=1)).sum(axis=1)
    assert np.all(flat == 1)  # every triangle is flat on exactly one axis


def test_icosphere_is_closed_and_wound_inward():
    V, F = scenes.icosphere(2, inward=True).arrays()
    assert len(F) == 20 * 16
    # every edge is shared by exactly two triangles, in opposite directions
    edges = np.concatenate([F[:, [0, 1]], F[:, [1, 2]], F[:, [2, 0]]])
    assert len({tuple(e) for e in edges.tolist()}) == len(edges)
    assert {tuple(e[::-1]) for e in edges.tolist()} == {tuple(e) for e in edges.tolist()}
    P = V[F].astype(np.float64)
    normal = np.cross(P[:, 1] - P[:, 0], P[:, 2] - P[:, 0])
    assert np.all(np.sum(normal * P.mean(axis=1), axis=1) < 0)
    # the same triangles as the outward sphere, wound the other way
    outward = scenes.icosphere(2)
    np.testing.assert_array_equal(V, outward.vertices)
    np.testing.assert_array_equal(F, outward.faces[:, ::-1])


def test_furnace_is_a_closed_emitting_sphere_seen_from_inside():
    furnace = scenes.furnace_scene(0.25, emission=2.0, subdivisions=2)
    assert furnace.num_triangles == 320 and furnace.has_materials
    np.testing.assert_array_equal(furnace.material_albedo, [[0.25] * 3])
    np.testing.assert_array_equal(furnace.material_emission, [[2.0] * 3])
    assert not furnace.tri_material.any()
    assert np.linalg.norm(furnace.camera.position) < 1  # inside the unit sphere
    assert closed_parts(furnace.vertices, furnace.faces)[0] < 0  # wound inward
    with pytest.raises(scenes.SceneError, match="albedo"):
        scenes.furnace_scene(1.0)


def load_writer():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "meshes" / "write_cornell_box.py"
    spec = importlib.util.spec_from_file_location("write_cornell_box", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path.parent


def test_committed_cornell_obj_matches_the_scene(tmp_path):
    from kdtree_gpu.mesh import load_mesh

    writer, folder = load_writer()
    scene = scenes.cornell_box()
    assert (folder / "cornell_box.obj").read_text() == writer.obj_text(scene, "cornell_box.mtl")
    assert (folder / "cornell_box.mtl").read_text() == writer.mtl_text(scene)
    V, F = load_mesh(folder / "cornell_box.obj")
    corners = np.sort(V[F].reshape(len(F), 9), axis=0)
    expected = np.sort(scene.vertices[scene.faces].reshape(-1, 9), axis=0)
    np.testing.assert_array_equal(corners, expected)
    # materials survive the round trip through trimesh's OBJ/MTL reader
    loaded = trimesh.load(folder / "cornell_box.obj", process=False)
    light = loaded.geometry["light"]
    assert len(light.faces) == 2
    np.testing.assert_allclose(np.asarray(light.visual.material.diffuse[:3]) / 255,
                               scene.material_albedo[scenes.LIGHT], atol=0.01)
    writer.write_cornell_box(tmp_path)
    assert (tmp_path / "cornell_box.obj").read_text() == (folder / "cornell_box.obj").read_text()
