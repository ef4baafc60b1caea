"""Tone mapping and PNG output for rendered images (no imaging library needed)."""

from __future__ import annotations

import struct
import zlib

import numpy as np

from ..arrays import to_numpy
from ..atomic import atomic_write

TONEMAP_CHOICES = ("clamp", "reinhard")


def tonemap(image, exposure: float = 1.0, method: str = "clamp"):
    """Linear radiance to 8-bit sRGB.

    Parameters
    ----------
    image : (height, width, 3) float
        Linear radiance (a GPU array is copied to the host).
    exposure : float
        Scale applied before the curve.
    method : {"clamp", "reinhard"}
        ``"clamp"`` clips to ``[0, 1]``; ``"reinhard"`` maps ``x / (1 + x)``.

    Returns
    -------
    (height, width, 3) uint8
        sRGB-encoded (IEC 61966-2-1 transfer curve). NaN becomes 0.
    """
    if method not in TONEMAP_CHOICES:
        raise ValueError(f"method must be one of {TONEMAP_CHOICES}, got {method!r}")
    x = np.nan_to_num(to_numpy(image).astype(np.float64) * float(exposure), nan=0.0,
                      posinf=1.0, neginf=0.0)
    if x.ndim != 3 or x.shape[2] != 3:
        raise ValueError(f"image must have shape (height, width, 3), got {x.shape}")
    x = np.maximum(x, 0.0)
    if method == "reinhard":
        x = x / (1.0 + x)
    x = np.minimum(x, 1.0)
    srgb = np.where(x <= 0.0031308, 12.92 * x, 1.055 * np.power(x, 1.0 / 2.4) - 0.055)
    return np.clip(np.round(srgb * 255.0), 0, 255).astype(np.uint8)


def encode_png(pixels) -> bytes:
    """Encode an 8-bit RGB image as PNG bytes.

    Parameters
    ----------
    pixels : (height, width, 3) uint8

    Returns
    -------
    bytes
    """
    pixels = np.ascontiguousarray(pixels)
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"pixels must be (height, width, 3) uint8, got {pixels.shape} {pixels.dtype}")
    height, width, _ = pixels.shape
    # filter type 0 (None) before every scanline
    raw = np.zeros((height, 1 + 3 * width), dtype=np.uint8)
    raw[:, 1:] = pixels.reshape(height, 3 * width)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw.tobytes(), 6)) + chunk(b"IEND", b""))


def save_png(image, path, exposure: float = 1.0, method: str = "clamp") -> None:
    """Write an image to a PNG file atomically.

    Parameters
    ----------
    image : (height, width, 3) float or uint8
        Linear radiance (tone mapped with :func:`tonemap`) or 8-bit sRGB.
    path : str or os.PathLike
        Written through :func:`kdtree_gpu.atomic.atomic_write`: a reader
        never sees a partial file.
    exposure, method :
        See :func:`tonemap` (ignored for uint8 input).
    """
    image = to_numpy(image)
    pixels = image if image.dtype == np.uint8 else tonemap(image, exposure, method)
    data = encode_png(pixels)
    with atomic_write(path) as f:
        f.write(data)
