"""What a batch is made of: jobs, settings, records, the report, and their constants."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from ..config import SAHConfig


TREE_SUFFIX = ".kdt"
# the status of a record
BUILT = "built"
UP_TO_DATE = "up to date"
FAILED = "failed"
DASK_INSTALL_HINT = "pip install 'kdtree-gpu[dask]'"
# how long connect() waits for a scheduler to answer and to have a worker
CONNECT_TIMEOUT_S = 10
WAIT_FOR_WORKERS_S = 60
_HASH_CHUNK = 1 << 20
# the prefix of every task key (the dashboard groups tasks by it)
TASK_PREFIX = "kdtree-build"


class OutputExistsError(FileExistsError):
    """A file that is not an earlier tree of the mesh is where its tree would go."""


# --- what a batch is made of ----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MeshJob:
    """One mesh of a batch: one task.

    Attributes
    ----------
    index : int
        Position in the batch (the report keeps this order).
    source : str
        The mesh as the caller named it (records and messages use it).
    path : str
        What the task loads: the absolute path when the file exists where the
        batch is planned (workers elsewhere need a shared file system), else
        ``source`` itself (a name the loader resolves, a built-in scene).
    output : str
        Absolute path of the tree file.
    size : int
        Bytes of the mesh file (0 when it is not a file here): large meshes
        are submitted first, so that a cluster does not end on one long build.
    """

    index: int
    source: str
    path: str
    output: str
    size: int = 0


@dataclasses.dataclass(frozen=True)
class BatchSettings:
    """What every task of a batch shares.

    Attributes
    ----------
    config : SAHConfig
    device : str
        A device name (:mod:`kdtree_gpu.device`) read where the task runs: on
        a worker, ``"auto"`` and ``"cuda"`` mean that worker's GPU.
    force : bool
        Build and overwrite even when the tree is up to date.
    loader : callable, optional
        ``loader(path) -> (vertices, faces)``; picklable when a cluster runs
        the batch. ``None``: :func:`load_source`.
    build_options : dict
        More keywords of :func:`kdtree_gpu.build` (``profile``, ``kernels``);
        none of them changes the tree.
    stats : bool
        Put :meth:`KdTree.stats` in each record (about as long as loading
        the mesh: one to two seconds per million triangles).
    """

    config: SAHConfig = dataclasses.field(default_factory=SAHConfig)
    device: str = "auto"
    force: bool = False
    loader: Optional[Callable] = None
    build_options: dict = dataclasses.field(default_factory=dict)
    stats: bool = True

    def source_record(self, sha256: str, path: str) -> dict:
        """What a tree file records in ``build_info["source"]`` (its header keeps the config)."""
        record = {"sha256": sha256, "path": path}
        if self.loader is not None:
            record["loader"] = _callable_name(self.loader)
        return record

    def same_settings(self, header: dict) -> bool:
        """Whether the header of a tree file names these settings (the device is not one)."""
        source = (header.get("build_info") or {}).get("source") or {}
        return (header.get("config") == self.config.to_dict()
                and source.get("loader") == _callable_name(self.loader))


@dataclasses.dataclass
class MeshRecord:
    """What happened to one mesh.

    Attributes
    ----------
    index : int
    input : str
        The mesh as the caller named it.
    output : str
        The tree file.
    status : {"built", "up to date", "failed"}
    error : str or None
        One line, for a failed mesh.
    input_error : bool
        The failure is about the input (a mesh that cannot be read or built,
        a file in the way, settings the builder lacks), not the build itself.
    reason : str or None
        Why a tree was built: ``"new"``, ``"forced"``, ``"mesh changed"``,
        ``"settings changed"``.
    triangles : int or None
    seconds : float or None
        Wall time of :func:`kdtree_gpu.build` (``build_info["seconds"]``).
    worker : str or None
        The Dask worker's address, or ``"local"`` (this process).
    device : str or None
        Where the tree was built: ``"cpu"`` or ``"cuda:N"`` as the worker
        numbers its GPUs.
    gpu : str or None
        The GPU's name, with the worker's ``CUDA_VISIBLE_DEVICES`` when set.
    retries : int or None
        How many times a worker holding the task died, so that the scheduler
        gave it to another (``None``: the scheduler could not be asked). A
        worker holds the task it runs; with fewer tasks than twice the
        workers' threads, Dask hands out every task at once and a worker may
        hold one more that it has not started.
    sha256 : str or None
        Of the mesh (see the module docstring).
    stats : dict
        :meth:`KdTree.stats` of a built tree.
    build_info : dict
        ``tree.build_info`` of a built tree (``profile_table`` with
        ``build_options={"profile": True}``).
    warnings : list of str
    exception : Exception or None
        The exception of a failed mesh built in this process (not sent back
        by workers).
    """

    index: int
    input: str
    output: str
    status: str
    error: Optional[str] = None
    input_error: bool = False
    reason: Optional[str] = None
    triangles: Optional[int] = None
    seconds: Optional[float] = None
    worker: Optional[str] = None
    device: Optional[str] = None
    gpu: Optional[str] = None
    retries: Optional[int] = 0
    sha256: Optional[str] = None
    stats: dict = dataclasses.field(default_factory=dict)
    build_info: dict = dataclasses.field(default_factory=dict)
    warnings: list = dataclasses.field(default_factory=list)
    exception: Optional[BaseException] = dataclasses.field(default=None, repr=False,
                                                           compare=False)

    @property
    def ok(self) -> bool:
        return self.status != FAILED

    def to_dict(self) -> dict:
        """The record as plain data (JSON), without the exception."""
        data = dataclasses.asdict(dataclasses.replace(self, exception=None))
        del data["exception"]
        return data


@dataclasses.dataclass
class BatchReport:
    """The records of a batch, in the order of its meshes, and its wall time."""

    records: list
    seconds: float

    def __iter__(self):
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index) -> MeshRecord:
        return self.records[index]

    @property
    def built(self) -> list:
        return [r for r in self.records if r.status == BUILT]

    @property
    def up_to_date(self) -> list:
        return [r for r in self.records if r.status == UP_TO_DATE]

    @property
    def failed(self) -> list:
        return [r for r in self.records if r.status == FAILED]

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        """One line: how many meshes were built, up to date, failed; time and meshes/s."""
        rate = len(self.built) / self.seconds if self.seconds > 0 else float("nan")
        return (f"{len(self.records)} meshes: {len(self.built)} built, "
                f"{len(self.up_to_date)} up to date, {len(self.failed)} failed "
                f"in {self.seconds:.1f} s ({rate:.2f} built/s)")

    def to_dicts(self) -> list:
        return [r.to_dict() for r in self.records]


def _callable_name(fn) -> Optional[str]:
    if fn is None:
        return None
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(fn))}"
