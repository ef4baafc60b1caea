"""Fixtures of the command-line tests: ``main`` run in-process, tiny meshes, one-line errors.

Every command runs on tiny meshes written to ``tmp_path`` or on the built-in
Cornell box, so the tests stay fast on two CPU cores. The bad inputs a user
can give must each end in one line ``kdtree-gpu: error: ...`` and the exit
status of the rule in ``kdtree_gpu.cli``'s docstring, never a traceback.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from kdtree_gpu import cli


def write_ply(path: Path, vertices, faces, dtype="<f4") -> Path:
    """Write a binary little-endian PLY (the layout of the shared meshes)."""
    vertices = np.asarray(vertices, dtype=dtype).reshape(-1, 3)
    faces = np.asarray(faces, dtype="<i4").reshape(-1, 3)
    kind = {"<f4": "float", "<f8": "double"}[dtype]
    header = ("ply\nformat binary_little_endian 1.0\n"
              f"element vertex {len(vertices)}\nproperty {kind} x\nproperty {kind} y\n"
              f"property {kind} z\nelement face {len(faces)}\n"
              "property list uchar int vertex_indices\nend_header\n").encode("ascii")
    records = np.empty(len(faces), dtype=[("n", "u1"), ("i", "<i4", 3)])
    records["n"] = 3
    records["i"] = faces
    path.write_bytes(header + vertices.tobytes() + records.tobytes())
    return path


def grid_mesh(n=4, z=0.0, seed=0):
    """A bumpy n x n grid of 2 (n-1)^2 triangles (non-degenerate, not planar)."""
    rng = np.random.default_rng(seed)
    ii, jj = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    heights = z + 0.2 * rng.random((n, n))
    vertices = np.stack([ii.ravel(), jj.ravel(), heights.ravel()], axis=1).astype(np.float32)
    faces = []
    for i in range(n - 1):
        for j in range(n - 1):
            a, b, c, d = i * n + j, (i + 1) * n + j, i * n + j + 1, (i + 1) * n + j + 1
            faces += [(a, b, c), (b, d, c)]
    return vertices, np.array(faces, dtype=np.int32)


def two_boxes_mesh():
    """Two closed unit cubes side by side (24 triangles)."""
    import trimesh

    a = trimesh.creation.box(extents=(1, 1, 1))
    b = trimesh.creation.box(extents=(1, 1, 1))
    b.apply_translation((2.0, 0.5, 0.0))
    both = trimesh.util.concatenate([a, b])
    return np.asarray(both.vertices, np.float32), np.asarray(both.faces, np.int32)


def png_pixels(path: Path) -> np.ndarray:
    """(height, width, 3) uint8 of an 8-bit RGB PNG written without filters (render's PNGs)."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    width, height, depth, color = struct.unpack(">IIBB", data[16:26])
    assert (depth, color) == (8, 2), "not 8-bit RGB"
    chunks, at = [], 8
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"IDAT":
            chunks.append(data[at + 8:at + 8 + length])
        at += 12 + length
    rows = np.frombuffer(zlib.decompress(b"".join(chunks)), np.uint8).reshape(height, -1)
    assert np.all(rows[:, 0] == 0), "filtered scanlines"
    return rows[:, 1:].reshape(height, width, 3)


def assert_one_line_error(err: str, *fragments: str):
    """stderr is ``kdtree-gpu: error: ...`` lines only, and no traceback or warning."""
    assert "Traceback" not in err and "Warning" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    assert all(line.startswith("kdtree-gpu: error: ") for line in lines), err
    for fragment in fragments:
        assert fragment.lower() in err.lower(), f"{fragment!r} not in {err!r}"


@pytest.fixture
def run_cli(capsys):
    """Run ``main(argv)`` and return ``(exit status, stdout, stderr)``."""

    def run(*argv):
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def cli_helpers():
    """The helper functions above, for the test modules: ``cli_helpers.write_ply(...)``."""
    class Helpers:
        pass

    helpers = Helpers()
    for fn in (write_ply, grid_mesh, two_boxes_mesh, png_pixels, assert_one_line_error):
        setattr(helpers, fn.__name__, staticmethod(fn))
    return helpers


@pytest.fixture
def tiny_ply(tmp_path):
    """A 32-triangle bumpy grid as a PLY file."""
    return write_ply(tmp_path / "tiny.ply", *grid_mesh(5))


@pytest.fixture
def boxes_ply(tmp_path):
    """Two cubes as a PLY file."""
    return write_ply(tmp_path / "boxes.ply", *two_boxes_mesh())


@pytest.fixture
def bad_ply(tmp_path):
    """A file with a .ply name that is not a mesh."""
    path = tmp_path / "broken.ply"
    path.write_bytes(b"this is not a ply file\x00\x01\x02")
    return path


@pytest.fixture
def nan_ply(tmp_path):
    """A mesh with a NaN coordinate."""
    vertices, faces = grid_mesh(3)
    vertices[4, 1] = np.nan
    return write_ply(tmp_path / "nan.ply", vertices, faces)


@pytest.fixture
def bad_meshes(tmp_path):
    """One file per way a mesh can be bad: ``{kind: (path, words of the error)}``."""
    vertices, faces = grid_mesh(3)
    inf = vertices.copy()
    inf[2, 0] = np.inf
    nan = vertices.copy()
    nan[4, 1] = np.nan
    (tmp_path / "empty.ply").write_bytes(b"")
    (tmp_path / "garbage.ply").write_bytes(b"ply\ngarbage\x00\x01\n")
    return {
        "empty": (tmp_path / "empty.ply", "cannot read as a mesh"),
        "garbage": (tmp_path / "garbage.ply", "cannot read as a mesh"),
        "nan": (write_ply(tmp_path / "nan.ply", nan, faces), "has a NaN coordinate"),
        "inf": (write_ply(tmp_path / "inf.ply", inf, faces), "has an infinite coordinate"),
        "degenerate": (write_ply(tmp_path / "degenerate.ply", [[0, 0, 0], [1, 0, 0], [2, 0, 0]],
                                 [[0, 1, 2]]), "degenerate"),
        # float64 coordinates beyond float32: NumPy warns as they are converted
        "overflow": (write_ply(tmp_path / "overflow.ply", vertices.astype(np.float64) * 1e39,
                                faces, dtype="<f8"),
                     "overflows float32"),
    }
