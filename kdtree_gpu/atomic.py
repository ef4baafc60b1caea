"""Atomic file output: a file is either complete or not there.

Every file the package writes (tree files, PNG images, batch reports) goes
through :func:`atomic_write`: the bytes go to a temporary file in the target's
folder, are flushed to disk, and the temporary file is renamed over the
target. An interrupted or failed write never leaves a partial file and never
damages an existing one; the new file gets the mode a plain ``open()`` would
give it (``0o666`` less the umask).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_write(path, fsync: bool = True):
    """Write ``path`` atomically: ``with atomic_write(path) as f: f.write(...)``.

    Parameters
    ----------
    path : str or os.PathLike
        Target file; an existing file is replaced only once the new one is
        complete on disk.
    fsync : bool
        Flush the data and the rename to disk (off: only the rename is
        atomic, which is enough for files that can be written again).

    Yields
    ------
    file
        A binary file object open for writing.

    Raises
    ------
    OSError
        The folder does not exist or cannot be written; nothing is left behind.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        # mkstemp creates the file with mode 0600
        os.chmod(tmp_name, default_file_mode())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    if fsync:
        _fsync_folder(path.parent)


def default_file_mode() -> int:
    """The mode a plain ``open(path, "w")`` gives a new file: ``0o666`` less the umask."""
    return 0o666 & ~_current_umask()


def _current_umask() -> int:
    # Linux reports the umask without changing it; elsewhere it can only be
    # read by setting it (process-wide, so for the shortest possible time)
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _fsync_folder(folder: Path) -> None:
    # make the rename itself durable; not possible on every platform
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
