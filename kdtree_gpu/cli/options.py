"""Option types of the command line: each parses one option's text or says what it expected.

argparse calls them; an ``ArgumentTypeError`` becomes the one-line usage
error (exit status 2) that names the option.
"""

from __future__ import annotations

import argparse
import math

MAX_IMAGE_SIDE = 16384


def _int_at_least(minimum: int, what: str):
    """An option type: integers ``>= minimum``, with ``what`` in the error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "an integer >= 0")


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def parse_size(text: str) -> tuple:
    """Parse an image size ``"WxH"`` or ``"N"`` (square).

    Returns
    -------
    (int, int)
        Width and height, each in ``[1, 16384]``.

    Raises
    ------
    argparse.ArgumentTypeError
        Anything else.
    """
    parts = text.lower().replace("×", "x").split("x")
    try:
        if len(parts) == 1:
            width = height = int(parts[0])
        elif len(parts) == 2:
            width, height = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WxH or N (e.g. 640x480 or 256), got {text!r}") \
            from None
    if not (1 <= width <= MAX_IMAGE_SIDE and 1 <= height <= MAX_IMAGE_SIDE):
        raise argparse.ArgumentTypeError(
            f"width and height must be in [1, {MAX_IMAGE_SIDE}], got {text!r}")
    return width, height


def parse_vector(text: str) -> tuple:
    """Parse a point or direction ``"X,Y,Z"`` (three finite numbers)."""
    parts = text.split(",")
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected three numbers X,Y,Z, got {text!r}")
    return values


def parse_fov(text: str) -> float:
    """Parse a vertical field of view in degrees, in ``(0, 180)``."""
    value = finite_float(text)
    if not 0.0 < value < 180.0:
        raise argparse.ArgumentTypeError(f"expected degrees in (0, 180), got {text!r}")
    return value


def device_choice(text: str) -> str:
    """A device name as :func:`kdtree_gpu.device.parse_device` reads it (checked, not resolved)."""
    from ..device import parse_device

    try:
        parse_device(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip().lower()
