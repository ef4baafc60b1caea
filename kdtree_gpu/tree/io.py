"""Tree files: one self-contained, checksummed file per tree (suggested ``.kdt``).

Layout (all integers little-endian)
-----------------------------------
========================  ==================================================
bytes ``[0, 8)``          magic ``b"KDTGPU\\r\\n"`` (the CR LF catches text-mode
                          copies, as in PNG)
bytes ``[8, 12)``         uint32 format version (:data:`FORMAT_VERSION`)
bytes ``[12, 20)``        uint64 length ``H`` of the JSON header
bytes ``[20, 20 + H)``    JSON header (UTF-8), then zero padding up to a
                          multiple of :data:`ALIGN`: the payload start
payload                   the arrays, each at its ``offset`` (relative to the
                          payload start, a multiple of :data:`ALIGN`), C order,
                          little-endian, zero padding between them
last 32 bytes             SHA-256 of every byte before them
========================  ==================================================

The JSON header holds ``config`` (:meth:`SAHConfig.to_dict`),
``num_degenerate``, ``build_info``, ``payload_size`` and ``arrays``: for each
of :data:`ARRAY_NAMES` its ``name``, ``dtype`` (NumPy string such as
``"<f4"``), ``shape``, ``offset`` and ``nbytes``.

Saving is atomic (:func:`kdtree_gpu.atomic.atomic_write`): an interrupted or
failed save never leaves a partial file and never damages an existing one.
This module knows the file format only; :func:`kdtree_gpu.tree.load_tree`
turns what :func:`read_tree_file` returns into a ``KdTree``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import threading
from pathlib import Path

import numpy as np

from ..atomic import atomic_write

MAGIC = b"KDTGPU\r\n"
FORMAT_VERSION = 1
ALIGN = 64
CHECKSUM_SIZE = 32  # SHA-256
_PREFIX = struct.Struct("<8sIQ")  # magic, version, header length

ARRAY_NAMES = ("node_axis", "node_split", "node_child", "node_count", "leaf_tris", "bounds",
               "vertices", "faces")
_ARRAY_DTYPES = {
    "node_axis": "<i1", "node_split": "<f4", "node_child": "<i4", "node_count": "<i4",
    "leaf_tris": "<i4", "bounds": "<f4", "vertices": "<f4", "faces": "<i4",
}


class TreeFileError(ValueError):
    """A file that is not a readable tree file; the message names the problem."""


def json_default(value):
    """Turn a value ``json.dumps`` cannot write into plain JSON (its ``default=``).

    ``build_info`` and command-line records are free-form: NumPy scalars and
    arrays become numbers and lists, sets lists, dataclass instances dicts,
    anything else (paths included) its text.
    """
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def _pad(n: int) -> int:
    return (-n) % ALIGN


def _write_and_hash(f, pieces) -> bytes:
    """Write ``pieces`` to ``f`` in order and return the SHA-256 of their bytes.

    The checksum runs in a second thread while this one writes: hashlib and
    file writes both release the GIL on large buffers, so a large tree is
    saved in about the longer of the two instead of their sum.
    """
    hasher = hashlib.sha256()
    failed = []

    def hash_all():
        try:
            for piece in pieces:
                hasher.update(piece)
        except BaseException as exc:  # pragma: no cover - hashing memory does not fail
            failed.append(exc)

    worker = threading.Thread(target=hash_all, name="kdtree-gpu tree checksum")
    worker.start()
    try:
        for piece in pieces:
            f.write(piece)
    finally:
        worker.join()
    if failed:  # pragma: no cover
        raise failed[0]
    return hasher.digest()


def save_tree(tree, path) -> None:
    """Write a tree to ``path`` atomically (see the module docstring).

    Parameters
    ----------
    tree : KdTree
        Anything with the attributes named in :data:`ARRAY_NAMES`, ``config``,
        ``num_degenerate`` and ``build_info``.
    path : str or os.PathLike
        Target file; an existing file is replaced only once the new one is
        complete on disk.

    Raises
    ------
    OSError
        The folder does not exist or cannot be written; nothing is left behind.
    """
    arrays = {name: np.ascontiguousarray(getattr(tree, name), dtype=_ARRAY_DTYPES[name])
              for name in ARRAY_NAMES}
    entries, offset = [], 0
    for name, a in arrays.items():
        entries.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape),
                        "offset": offset, "nbytes": int(a.nbytes)})
        offset += a.nbytes + _pad(a.nbytes)
    header = {
        "format": "kdtree-gpu tree",
        "config": tree.config.to_dict(),
        "num_degenerate": int(tree.num_degenerate),
        "build_info": tree.build_info,
        "payload_size": offset,
        "arrays": entries,
    }
    header_bytes = json.dumps(header, default=json_default, sort_keys=True).encode("utf-8")
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header_bytes))
    pieces = [prefix, header_bytes, bytes(_pad(len(prefix) + len(header_bytes)))]
    for a in arrays.values():
        pieces += [memoryview(a).cast("B"), bytes(_pad(a.nbytes))]
    with atomic_write(path) as f:
        f.write(_write_and_hash(f, pieces))


def read_header(path) -> dict:
    """Read and return the JSON header of a tree file (no checksum verification).

    Raises
    ------
    TreeFileError
        Not a tree file, unsupported version, truncated or corrupt header.
    """
    with open(path, "rb") as f:
        head = f.read(_PREFIX.size)
        header, _ = _parse_header(path, head, f.read)
    return header


def _parse_header(path, head, read):
    if len(head) < len(MAGIC) or head[:len(MAGIC)] != MAGIC:
        raise TreeFileError(f"{path}: not a kdtree-gpu tree file (wrong magic bytes)")
    if len(head) < _PREFIX.size:
        raise TreeFileError(f"{path}: truncated file (ends inside the file header)")
    _, version, header_len = _PREFIX.unpack(head)
    if version != FORMAT_VERSION:
        raise TreeFileError(f"{path}: unsupported tree file version {version} "
                            f"(this kdtree-gpu reads version {FORMAT_VERSION})")
    header_bytes = read(header_len)
    if len(header_bytes) < header_len:
        raise TreeFileError(f"{path}: truncated file (ends inside the JSON header)")
    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TreeFileError(f"{path}: corrupt JSON header: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("arrays"), list) \
            or not isinstance(header.get("payload_size"), int):
        raise TreeFileError(f"{path}: corrupt JSON header: missing 'arrays' or 'payload_size'")
    payload_start = _PREFIX.size + header_len + _pad(_PREFIX.size + header_len)
    return header, payload_start


def read_tree_file(path):
    """Read and verify a file written by :func:`save_tree`.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    header : dict
        The JSON header.
    arrays : dict
        ``{name: numpy.ndarray}``, every name of :data:`ARRAY_NAMES` present.

    Raises
    ------
    FileNotFoundError
        No such file.
    TreeFileError
        Not a tree file, unsupported version, truncated file, checksum
        mismatch, or arrays the header does not place in the payload.
    """
    path = Path(path)
    with open(path, "rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)
        view = memoryview(data)
        got = f.readinto(view)
    data = data[:got]
    header, payload_start = _parse_header(path, bytes(data[:_PREFIX.size]),
                                          _reader(data, _PREFIX.size))
    expected = payload_start + header["payload_size"] + CHECKSUM_SIZE
    if len(data) < expected:
        raise TreeFileError(f"{path}: truncated file ({len(data)} bytes, the header describes "
                            f"{expected})")
    if len(data) > expected:
        raise TreeFileError(f"{path}: corrupt file ({len(data) - expected} unexpected bytes "
                            f"after the checksum)")
    digest = hashlib.sha256(memoryview(data)[:expected - CHECKSUM_SIZE]).digest()
    if digest != bytes(data[expected - CHECKSUM_SIZE:expected]):
        raise TreeFileError(f"{path}: checksum mismatch (the file is corrupt)")

    arrays = {}
    for entry in header["arrays"]:
        try:
            name, dtype, shape = entry["name"], np.dtype(entry["dtype"]), tuple(entry["shape"])
            start = payload_start + int(entry["offset"])
            count = int(np.prod(shape, dtype=np.int64))
        except (KeyError, TypeError, ValueError) as exc:
            raise TreeFileError(f"{path}: corrupt array entry {entry!r}: {exc}") from None
        if start + count * dtype.itemsize > expected - CHECKSUM_SIZE:
            raise TreeFileError(f"{path}: array {name!r} lies outside the payload")
        a = np.frombuffer(data, dtype=dtype, count=count, offset=start).reshape(shape)
        arrays[name] = a.astype(dtype.newbyteorder("="), copy=False)
    missing = [name for name in ARRAY_NAMES if name not in arrays]
    if missing:
        raise TreeFileError(f"{path}: the file has no {', '.join(missing)} array(s)")
    return header, arrays


def _reader(data, start):
    position = [start]

    def read(n):
        chunk = bytes(data[position[0]:position[0] + n])
        position[0] += n
        return chunk

    return read
