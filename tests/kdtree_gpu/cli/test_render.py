"""``kdtree-gpu render`` (kdtree_gpu.cli.render): images, camera options, the room rule."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kdtree_gpu.cli import render as cli_render


def camera_of(out: str) -> dict:
    """The camera line ``render`` prints, as numbers."""
    line = next(line for line in out.splitlines() if line.strip().startswith("camera:"))
    fields = dict(re.findall(r"(eye|target|up|fov) ([^;,\s]+(?:,[^;,\s]+)*)", line))
    values = {k: tuple(float(x) for x in v.split(",")) for k, v in fields.items()}
    values["view"] = line.split(";")[-1].strip() if ";" in line else ""
    return values


def test_render_cornell_writes_a_png_of_the_given_size(run_cli, cli_helpers, tmp_path):
    out_path = tmp_path / "cornell.png"
    code, out, err = run_cli("render", "cornell", "-o", out_path, "--size", "12x8", "--spp", "1",
                             "--max-depth", "2", "--device", "cpu")
    assert code == 0, err
    assert cli_helpers.png_pixels(out_path).shape == (8, 12, 3)
    assert str(out_path) in out


def test_render_a_mesh_file(run_cli, cli_helpers, boxes_ply, tmp_path):
    out_path = tmp_path / "boxes.png"
    code, out, err = run_cli("render", boxes_ply, "-o", out_path, "--size", "9", "--spp", "1",
                             "--device", "cpu")
    assert code == 0, err
    assert cli_helpers.png_pixels(out_path).shape == (9, 9, 3)
    assert camera_of(out)["view"].startswith("outside: not a room")


def test_render_unwritable_output_and_missing_mesh(run_cli, cli_helpers, tmp_path):
    code, _, err = run_cli("render", "cornell", "-o", tmp_path / "no" / "dir" / "x.png",
                           "--size", "4", "--spp", "1", "--device", "cpu")
    assert code == 2
    cli_helpers.assert_one_line_error(err, "does not exist")
    code, _, err = run_cli("render", tmp_path / "absent.ply", "-o", tmp_path / "x.png",
                           "--device", "cpu")
    assert code == 2
    cli_helpers.assert_one_line_error(err, "absent.ply")


def test_camera_options_replace_parts_of_the_default_camera(run_cli, cli_helpers, tmp_path):
    base = ["render", "cornell", "--size", "16", "--spp", "1", "--max-depth", "1",
            "--device", "cpu"]
    code, out, err = run_cli(*base, "-o", tmp_path / "default.png")
    assert code == 0, err
    default = camera_of(out)
    code, out, err = run_cli(*base, "-o", tmp_path / "moved.png", "--eye", "0.5,1,3",
                             "--fov", "25")
    assert code == 0, err
    moved = camera_of(out)
    assert moved["eye"] == (0.5, 1.0, 3.0) and moved["fov"] == (25.0,)
    assert moved["target"] == default["target"] and moved["up"] == default["up"]
    code, out, err = run_cli(*base, "-o", tmp_path / "tilted.png", "--target", "0,0,0",
                             "--up", "1,0,0")
    assert code == 0, err
    assert camera_of(out)["target"] == (0.0, 0.0, 0.0) and camera_of(out)["up"] == (1.0, 0.0, 0.0)
    images = [cli_helpers.png_pixels(tmp_path / f"{n}.png") for n in ("default", "moved", "tilted")]
    assert not np.array_equal(images[0], images[1]) and not np.array_equal(images[0], images[2])


@pytest.mark.parametrize("options, words", [
    (["--eye", "0,1,0", "--target", "0,1,0"], "look_at must differ"),
    (["--eye", "0,0,0", "--target", "0,1,0", "--up", "0,2,0"], "parallel"),
])
def test_a_camera_that_cannot_see_is_a_usage_error(run_cli, cli_helpers, tmp_path, options, words):
    code, out, err = run_cli("render", "cornell", "-o", tmp_path / "x.png", "--size", "4",
                             "--spp", "1", "--device", "cpu", *options)
    assert code == 2
    cli_helpers.assert_one_line_error(err, "camera", words)
    assert not (tmp_path / "x.png").exists()


# --- the room rule -----------------------------------------------------------------------------

def open_room(size=(4.0, 2.0, 3.0), open_face=True):
    """A box of six walls (two triangles each) with the front wall left out when ``open_face``."""
    import trimesh

    box = trimesh.creation.box(extents=size)
    keep = np.ones(len(box.faces), bool)
    if open_face:
        keep &= ~np.all(np.isclose(box.vertices[box.faces][:, :, 2], size[2] / 2), axis=1)
    return np.asarray(box.vertices, np.float32), np.asarray(box.faces[keep], np.int32)


def test_enclosure_tells_rooms_from_objects():
    import trimesh

    V, F = open_room(open_face=False)
    assert cli_render.enclosure(V, F) == pytest.approx(1.0)
    V, F = open_room()
    assert cli_render.enclosure(V, F) == pytest.approx(1 - 8 / 52)  # less the front wall (4 x 2)
    sphere = trimesh.creation.icosphere(subdivisions=3)
    assert cli_render.enclosure(sphere.vertices, sphere.faces) < 0.01
    # a floor alone is no room
    V, F = open_room()
    floor = np.all(np.isclose(V[F][:, :, 1], -1.0), axis=1)
    assert cli_render.enclosure(V, F[floor]) == 0.0  # flat: its box has no height
    assert cli_render.enclosure(V, F[floor | np.roll(floor, 2)]) < cli_render.ROOM_COVERAGE


def test_a_room_mesh_gets_the_camera_inside(run_cli, cli_helpers, tmp_path):
    path = cli_helpers.write_ply(tmp_path / "room.ply", *open_room())
    code, out, err = run_cli("render", path, "-o", tmp_path / "room.png", "--size", "8",
                             "--spp", "1", "--device", "cpu")
    assert code == 0, err
    camera = camera_of(out)
    assert camera["view"].startswith("inside: a room (85%")
    assert all(-2 < x < 2 for x in camera["eye"][::2]) and -1 < camera["eye"][1] < 1
    code, out, err = run_cli("render", path, "-o", tmp_path / "room.png", "--size", "8",
                             "--spp", "1", "--device", "cpu", "--view", "outside")
    assert code == 0, err
    assert camera_of(out)["view"] == "outside (--view)"
    assert camera_of(out)["eye"][2] > 1.5  # outside the box


def test_conference_is_rendered_from_inside(run_cli, cli_helpers, mesh_file, tmp_path):
    # the mesh that started it: from outside it is a white box on a grey ground
    mesh_file("conference.ply")
    out_path = tmp_path / "conference.png"
    code, out, err = run_cli("render", "conference", "-o", out_path, "--size", "32x24",
                             "--spp", "4", "--device", "cpu")
    assert code == 0, err
    assert camera_of(out)["view"].startswith("inside: a room")
    pixels = cli_helpers.png_pixels(out_path)
    colors, counts = np.unique(pixels.reshape(-1, 3), axis=0, return_counts=True)
    # not one flat color: no color (the background, a white wall) fills half the image
    assert counts.max() < 0.5 * pixels.shape[0] * pixels.shape[1], colors[counts.argmax()]
    assert pixels.mean(axis=2).std() > 20
