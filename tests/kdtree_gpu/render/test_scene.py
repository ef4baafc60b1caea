"""The scene on the render backend: triangle records, light tables (kdtree_gpu.render.scene)."""

import numpy as np
import pytest

from kdtree_gpu import scenes
from kdtree_gpu.render.scene import build_alias_table, light_tables, triangle_records, upload_scene


def test_alias_table_samples_in_proportion_to_weights():
    weights = np.array([1.0, 0.0, 3.0, 0.5, 10.0])
    prob, alias, pmf = build_alias_table(weights)
    np.testing.assert_allclose(pmf, weights / weights.sum())
    # exact probability of each item from the table itself
    n = len(weights)
    exact = np.zeros(n)
    for i in range(n):
        exact[i] += prob[i] / n
        exact[alias[i]] += (1 - prob[i]) / n
    np.testing.assert_allclose(exact, pmf, atol=1e-6)
    with pytest.raises(ValueError):
        build_alias_table([0.0, 0.0])


def test_mesh_scene_light_is_the_only_light():
    V, F = scenes.icosphere(1, inward=True).arrays()
    scene = scenes.mesh_scene(V, F)
    light_tri, _, _, pmf = light_tables(scene)
    np.testing.assert_array_equal(light_tri, [len(F), len(F) + 1])
    assert abs(pmf.sum() - 1) < 1e-6


def test_builtin_scenes_are_accepted():
    cornell = scenes.as_scene(scenes.cornell_box())
    assert cornell.num_triangles == scenes.cornell_box().faces.shape[0]
    light_tri, _, _, _ = light_tables(cornell)
    assert len(light_tri) == 2
    # the Cornell light faces down: its front face lights the floor
    assert np.all(cornell.vertices[cornell.faces[light_tri]][:, :, 1] > 1.9)
    sphere = scenes.as_scene(scenes.icosphere(1))  # geometry only: default light and camera
    assert sphere.num_triangles == 80 + 2


def test_upload_pads_records_to_16_bytes():
    scene = scenes.cornell_box()
    tri_vertex, tri_normal = triangle_records(scene.vertices, scene.faces)
    assert tri_vertex.shape == (36, 3, 4) and tri_normal.shape == (36, 4)
    np.testing.assert_array_equal(tri_vertex[:, :, :3], scene.vertices[scene.faces])
    np.testing.assert_allclose(np.linalg.norm(tri_normal[:, :3], axis=1), 1, rtol=1e-6)
    device = upload_scene(np, scene, 8, 6)
    assert device.material_albedo.shape == (len(scenes.CORNELL_MATERIALS), 4)
    np.testing.assert_array_equal(device.material_emission[:, :3], scene.material_emission)
    np.testing.assert_array_equal(device.camera_frame, scene.camera.frame(8, 6))
    assert device.num_lights == 2 and device.two_sided == 0
