"""Tone mapping and PNG output (kdtree_gpu.render.image)."""

import numpy as np
import pytest

from kdtree_gpu.render.image import encode_png, save_png, tonemap


def test_tonemap_and_png_round_trip(tmp_path):
    image = np.zeros((3, 4, 3), np.float32)
    image[0, 0] = [1.0, 0.5, 0.0]
    image[1, 1] = [np.nan, np.inf, -1.0]
    pixels = tonemap(image)
    assert pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels[0, 0], [255, 188, 0])  # sRGB(0.5) = 0.735
    np.testing.assert_array_equal(pixels[1, 1], [0, 255, 0])
    path = tmp_path / "out.png"
    save_png(image, path)
    assert path.read_bytes() == encode_png(pixels)
    assert [p.name for p in tmp_path.iterdir()] == ["out.png"]
    PIL = pytest.importorskip("PIL.Image")
    with PIL.open(path) as img:
        np.testing.assert_array_equal(np.asarray(img.convert("RGB")), pixels)
