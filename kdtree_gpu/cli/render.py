"""``kdtree-gpu render``: a mesh or a built-in scene to a PNG, with a camera that sees it.

The default camera of a mesh
----------------------------
A mesh is lit by an area light above it and seen by a camera outside its
bounding box (``mesh_scene``'s exterior view). That shows a room such as
the conference mesh as what it is from outside: a closed white box that
hides everything in it. So a mesh that is a room gets ``mesh_scene``'s
interior view (the camera inside, near one end, looking along the longer
side; the light under the ceiling).

The room rule (``--view auto``): at least :data:`ROOM_COVERAGE` of the
bounding box's surface is covered by the mesh's own faces, counting the
triangles that lie in one of the box's six planes (every corner within
:data:`PLANE_TOLERANCE` box diagonals of it), each plane's share capped at
its face's area (a flat mesh, whose box has no inside, is no room). Walls,
floor and ceiling lie in those planes; a statue, an animal or a teapot
touches its box in a few points. On the shared meshes:
conference 0.62, cornell_box 0.67, sponza 0.96; the bunny, dragon, buddha,
armadillo, lucy, spot, suzanne and the teapot 0.004 at most.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .common import (EXIT_OK, CliError, check_buildable, check_writable, load_input,
                     load_scene, resolve_cli_device, single_input)

VIEW_CHOICES = ("auto", "inside", "outside")
ROOM_COVERAGE = 0.5
PLANE_TOLERANCE = 1e-3

DESCRIPTION = (
    "Render MESH (a file, a name, or a built-in scene such as 'cornell') with the path tracer "
    "and write a PNG (an existing image is replaced). A mesh gets a grey material and an area "
    "light; the camera looks at it from outside, or stands inside when the mesh is a room "
    "(--view auto: at least half of its bounding box's surface is covered by its own faces). "
    "--eye, --target, --up and --fov replace parts of that camera.")

EXAMPLES = """examples:
  kdtree-gpu render cornell -o cornell.png
  kdtree-gpu render cornell -o cornell.png --size 512 --spp 64 --max-depth 8
  kdtree-gpu render stanford_bunny -o bunny.png --size 640x480 --device gpu
  kdtree-gpu render conference -o room.png        # a room: the camera goes inside
  kdtree-gpu render teapot -o top.png --eye 0,12,0 --target 0,0,0 --up 0,0,-1 --fov 30"""


def enclosure(vertices, faces) -> float:
    """Share of the bounding box's surface covered by faces lying in the box's planes.

    Of the mesh ``vertices[faces]``; in ``[0, 1]``: 1 for a closed box, about
    0 for an object, 0 for a flat mesh (no inside to stand in).
    """
    corners = np.asarray(vertices, np.float64)[np.asarray(faces)]  # (m, 3 corners, 3 axes)
    lo, hi = corners.min(axis=(0, 1)), corners.max(axis=(0, 1))
    size = hi - lo
    tolerance = PLANE_TOLERANCE * float(np.linalg.norm(size))
    if np.any(size <= 2 * tolerance):
        return 0.0
    area = 0.5 * np.linalg.norm(np.cross(corners[:, 1] - corners[:, 0],
                                         corners[:, 2] - corners[:, 0]), axis=1)
    covered = total = 0.0
    for axis in range(3):
        face_area = float(np.prod(np.delete(size, axis)))
        for plane in (lo[axis], hi[axis]):
            in_plane = np.all(np.abs(corners[:, :, axis] - plane) <= tolerance, axis=1)
            covered += min(float(area[in_plane].sum()), face_area)
            total += face_area
    return covered / total if total > 0 else 0.0


def run(args) -> int:
    """Render and write the PNG."""
    from ..render import render, save_png

    device = resolve_cli_device(args.device)
    out = Path(args.output).expanduser()
    check_writable(out)
    item = single_input(args.mesh)
    scene, view = _scene(item, args.view)
    camera = _camera(scene.camera, args)
    width, height = args.size
    try:
        camera.frame(width, height)  # the camera's own checks, before any work
    except ValueError as exc:
        raise CliError(f"camera: {exc}") from None
    start = time.perf_counter()
    with device.use():
        result = render(scene, width, height, spp=args.spp, max_depth=args.max_depth,
                        device=device.kind, camera=camera)
    seconds = time.perf_counter() - start
    save_png(result.image, out)
    print(f"rendered {item.label} at {width}x{height}, {args.spp} spp, max depth "
          f"{args.max_depth} on {device} in {seconds:.2f} s -> {out}")
    print(f"  camera: eye {_xyz(camera.position)}, target {_xyz(camera.look_at)}, "
          f"up {_xyz(camera.up)}, fov {camera.vfov_degrees:g}" + (f"; {view}" if view else ""))
    return EXIT_OK


def _scene(item, view_choice: str):
    """The scene to render for an input and a note on its default camera (or ``""``)."""
    from ..scenes import as_scene, mesh_scene

    if item.scene is not None:
        scene = load_scene(item.scene)
        if scene.has_materials:
            return as_scene(scene), ""  # materials, lights and camera of its own
        vertices, faces = scene.arrays()
    else:
        vertices, faces = load_input(item)
    check_buildable(item, vertices, faces)
    if view_choice == "auto":
        share = enclosure(vertices, faces)
        inside = share >= ROOM_COVERAGE
        note = (f"inside: a room ({share:.0%} of its box is covered by its faces)" if inside else
                f"outside: not a room ({share:.0%} of its box is covered by its faces)")
    else:
        inside = view_choice == "inside"
        note = f"{view_choice} (--view)"
    return mesh_scene(vertices, faces, interior=inside, name=item.label), note


def _camera(default, args):
    """The default camera with the fields given on the command line replaced."""
    from ..scenes import Camera

    return Camera(position=args.eye or default.position,
                  look_at=args.target or default.look_at,
                  up=args.up or default.up,
                  vfov_degrees=args.fov or default.vfov_degrees)


def _xyz(values) -> str:
    return ",".join(f"{v:.4g}" for v in values)


def add_parser(commands, shared) -> None:
    """Declare ``kdtree-gpu render``: its help, examples and options."""
    from .options import parse_fov, parse_size, parse_vector, positive_int

    p = shared.add(commands, "render", "path-trace a mesh or a built-in scene to a PNG",
                   DESCRIPTION, EXAMPLES, [shared.device])
    p.add_argument("mesh", metavar="MESH|SCENE", help="a mesh file, a name, or a built-in scene")
    p.add_argument("-o", "--output", required=True, metavar="PNG", help="the image to write")
    p.add_argument("--size", type=parse_size, default=(256, 256), metavar="WxH|N",
                   help="image size (default: 256x256)")
    p.add_argument("--spp", type=positive_int, default=16, help="samples per pixel (default: 16)")
    p.add_argument("--max-depth", type=positive_int, default=5,
                   help="maximum path length in bounces (default: 5)")
    camera = p.add_argument_group("camera (default: chosen from the scene)")
    camera.add_argument("--view", choices=VIEW_CHOICES, default="auto",
                        help="a mesh's default camera: outside looking at it, inside it (rooms), "
                             "or by the room rule (default: auto)")
    camera.add_argument("--eye", type=parse_vector, metavar="X,Y,Z", help="camera position")
    camera.add_argument("--target", type=parse_vector, metavar="X,Y,Z",
                        help="point at the image center")
    camera.add_argument("--up", type=parse_vector, metavar="X,Y,Z",
                        help="up direction (default: 0,1,0)")
    camera.add_argument("--fov", type=parse_fov, metavar="DEG",
                        help="vertical field of view in degrees")
    p.set_defaults(handler=run)
