"""The scene type, the camera, and scenes made ready to render (kdtree_gpu.scenes.scene)."""

import dataclasses

import numpy as np
import pytest

from kdtree_gpu import scenes
from kdtree_gpu.scenes import Camera, Scene, SceneError, as_scene, frame_bounds, mesh_scene


def sphere():
    return scenes.icosphere(1, inward=True).arrays()


def test_geometry_only_scene_and_materials_go_together():
    V, F = sphere()
    geometry = Scene(V, F, name="ball")
    assert not geometry.has_materials and geometry.camera is None
    assert geometry.arrays() == (geometry.vertices, geometry.faces)
    np.testing.assert_array_equal(geometry.bounds, [V.min(axis=0), V.max(axis=0)])
    with pytest.raises(SceneError, match="go together"):
        Scene(V, F, tri_material=np.zeros(len(F), np.int32))


def test_bad_scenes_raise_clear_errors():
    V, F = scenes.icosphere(0, inward=True).arrays()
    with pytest.raises(SceneError, match="material id"):
        Scene(V, F, np.full(len(F), 3, np.int32), [[0.5] * 3], [[0] * 3], Camera())
    with pytest.raises(SceneError, match="albedo must be <= 1"):
        Scene(V, F, np.zeros(len(F), np.int32), [[1.5] * 3], [[0] * 3], Camera())
    with pytest.raises(SceneError, match="integer"):
        Scene(V, F, np.zeros(len(F), np.float32), [[0.5] * 3], [[0] * 3])
    with pytest.raises(SceneError, match="background"):
        Scene(V, F, background=[-1, 0, 0])
    with pytest.raises(SceneError, match="camera must be a Camera"):
        Scene(V, F, camera=(0, 0, 1))
    with pytest.raises(SceneError, match="missing"):
        as_scene({"vertices": V})
    with pytest.raises(SceneError, match="parallel"):
        Camera(position=(0, 0, 0), look_at=(0, 1, 0), up=(0, 1, 0)).frame(4, 4)
    with pytest.raises(SceneError, match="vfov"):
        Camera(vfov_degrees=180)


def test_camera_frame_spans_the_image():
    camera = Camera(position=(0, 0, 5), look_at=(0, 0, 0), vfov_degrees=90)
    eye, right, up, forward = camera.frame(200, 100).astype(np.float64)
    np.testing.assert_allclose(eye, [0, 0, 5])
    np.testing.assert_allclose(forward, [0, 0, -1])
    np.testing.assert_allclose(up, [0, 1, 0], atol=1e-7)  # tan(45 degrees) = 1
    np.testing.assert_allclose(right, [2, 0, 0], atol=1e-7)  # twice as wide


def test_mesh_scene_adds_a_light_and_frames_the_mesh():
    V, F = sphere()
    scene = mesh_scene(V, F)
    assert scene.num_triangles == len(F) + 2 and scene.has_materials
    np.testing.assert_array_equal(scene.tri_material, [0] * len(F) + [1, 1])
    assert scene.material_emission[1].min() > 0 and not scene.material_emission[0].any()
    # the quad hangs above the mesh, facing down, out of the camera's view
    quad = scene.vertices[scene.faces[-2:]].astype(np.float64)
    assert np.all(quad[..., 1] > V[:, 1].max())
    assert np.all(np.cross(quad[:, 1] - quad[:, 0], quad[:, 2] - quad[:, 0])[:, 1] < 0)
    assert scene.camera == frame_bounds(np.stack([V.min(axis=0), V.max(axis=0)]))
    inside = mesh_scene(V, F, interior=True)
    assert np.all(np.abs(inside.camera.position) < 1)


def test_as_scene_completes_what_render_accepts():
    V, F = sphere()
    # a bare mesh and a geometry-only scene are lit and framed alike
    bare = as_scene((V, F))
    geometry = as_scene(Scene(V, F, name="ball"))
    np.testing.assert_array_equal(bare.vertices, geometry.vertices)
    assert geometry.camera == bare.camera and geometry.name == "ball"
    # a geometry-only scene keeps its own camera
    camera = Camera(position=(0, 0, 9))
    assert as_scene(Scene(V, F, camera=camera)).camera == camera
    # a scene with materials is kept; without a camera it gets one framing it
    cornell = scenes.cornell_box()
    assert as_scene(cornell) is cornell
    framed = as_scene(dataclasses.replace(cornell, camera=None))
    assert framed.camera == frame_bounds(cornell.bounds)
    # a camera given replaces the scene's
    assert as_scene(cornell, camera=camera).camera == camera
    assert cornell.camera != camera


def test_scene_object_with_named_fields_is_accepted():
    room = scenes.cornell_box()
    obj = {"vertices": room.vertices, "faces": room.faces, "material_ids": room.tri_material,
           "albedo": room.material_albedo, "emission": room.material_emission,
           "camera": {"position": room.camera.position, "look_at": room.camera.look_at,
                      "fov": room.camera.vfov_degrees}}
    scene = as_scene(obj)
    np.testing.assert_array_equal(scene.tri_material, room.tri_material)
    assert scene.camera == room.camera
    # without materials: lit and framed like a bare mesh
    assert as_scene({"vertices": room.vertices, "faces": room.faces}).num_triangles == 36 + 2
