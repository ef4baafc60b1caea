"""Trees for a collection of meshes: one task per mesh, in this process or on a Dask cluster.

``kd.build_many(meshes, out_dir)`` builds the tree of every mesh and saves it
to ``out_dir/<stem>.kdt``; with ``client=`` (a ``dask.distributed.Client``)
every mesh is one Dask task, run by whichever worker is free, so one call
uses every GPU of a machine (one worker per GPU) or of many machines. The
call returns a :class:`BatchReport`: one :class:`MeshRecord` per mesh.

Nothing lost, nothing done twice
--------------------------------
- The worker that builds a tree writes it, atomically
  (:mod:`kdtree_gpu.atomic`): a tree file is complete or absent.
- A tree file records what it was built from in
  ``build_info["source"]``: the sha256 of the mesh file's bytes (of the
  vertex and face arrays when the mesh is not a file: a built-in scene), its
  path and a custom loader's name; the header holds the ``SAHConfig``. A tree
  whose mesh, config and loader match is *up to date*
  and is not built again unless ``force=True``; the device is not part of
  the record, since every device makes the same tree. Only the header is read
  (:func:`kdtree_gpu.tree.read_header`), and with a cluster this check runs
  here before anything is submitted, so a batch that was interrupted resumes
  where it stopped and a batch with nothing to do starts no work.
- An out-of-date tree of the same mesh (same input path, or same bytes under
  other settings) is rebuilt; any other file in the way is an error unless
  ``force=True``.
- A mesh that fails is a ``"failed"`` record with its error; the others go on.
- A worker that dies during a build (a crash, the out-of-memory killer) has
  its task run again on a worker that is alive: the Dask scheduler
  reschedules the tasks of a lost worker, up to
  ``distributed.scheduler.allowed-failures`` times (default 3) per task,
  after which the mesh fails with ``KilledWorker``. The record's ``retries``
  counts those restarts.
- An interrupt (Ctrl-C) cancels the tasks not yet started; running builds
  finish or die with their worker, and either way leave no partial tree
  (:func:`remove_partial_trees` clears the temporary files of workers that
  were killed).

Dask is imported only when a client or a local cluster is asked for; the
in-process path (``client=None``) needs no Dask.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import time
import uuid
import warnings
from pathlib import Path
from typing import Callable, Optional

from .config import SAHConfig
from .device import parse_device

__all__ = ["BUILT", "FAILED", "UP_TO_DATE", "BatchReport", "BatchSettings", "MeshJob",
           "MeshRecord", "OutputExistsError", "build_many", "build_one", "connect",
           "dashboard_link", "failed_record", "has_bokeh", "load_source", "local_client",
           "plan_jobs", "remove_partial_trees", "require_dask", "run_jobs", "visible_gpus"]

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


# --- the public call -----------------------------------------------------------------------

def build_many(meshes, out_dir=None, *, config: Optional[SAHConfig] = None, client=None,
               force: bool = False, device="auto", loader: Optional[Callable] = None,
               outputs=None, build_options: Optional[dict] = None, stats: bool = True,
               on_record: Optional[Callable] = None) -> BatchReport:
    """Build and save the tree of every mesh; skip those whose tree is up to date.

    Parameters
    ----------
    meshes : iterable of str or os.PathLike
        Mesh files, bare names in ``$KDTREE_GPU_MESH_DIR`` or built-in scene
        names (anything ``loader`` reads). With a cluster, the workers read
        the files: give paths they can all read.
    out_dir : str or os.PathLike
        Folder of the trees, ``<stem>.kdt`` per mesh; created when the first
        tree is written.
    config : SAHConfig, optional
    client : dask.distributed.Client, optional
        Run every mesh as one task on this client's cluster. ``None``: build
        in this process, one mesh after another (no Dask needed).
    force : bool
        Build every mesh, even when its tree is up to date, and overwrite
        whatever is at its output.
    device : str
        Where each task builds (:mod:`kdtree_gpu.device`), read on the worker:
        ``"auto"`` is the worker's GPU when it has one.
    loader : callable, optional
        ``loader(path) -> (vertices, faces)`` for meshes in other formats;
        picklable (a module-level function) when a cluster runs the batch.
        Default: :func:`load_source`.
    outputs : sequence of str or os.PathLike, optional
        The tree file of each mesh, instead of ``out_dir/<stem>.kdt``.
    build_options : dict, optional
        More keywords of :func:`kdtree_gpu.build` (``profile``, ``kernels``).
    stats : bool
        Put :meth:`KdTree.stats` (nodes, leaves, SAH cost, ...) in each
        record; ``False`` saves one to two seconds per million triangles.
    on_record : callable, optional
        Called with each :class:`MeshRecord` as its mesh completes (in
        completion order with a cluster).

    Returns
    -------
    BatchReport
        One record per mesh, in the order of ``meshes``.

    Raises
    ------
    ValueError
        Neither ``out_dir`` nor ``outputs``, or a bad device name.
    """
    jobs = plan_jobs(meshes, out_dir, outputs)
    parse_device(device)
    settings = BatchSettings(config=SAHConfig() if config is None else config, device=device,
                             force=force, loader=loader, build_options=dict(build_options or {}),
                             stats=stats)
    return run_jobs(jobs, settings, connect=None if client is None else (lambda: client),
                    on_record=on_record)


def plan_jobs(meshes, out_dir=None, outputs=None) -> list:
    """The :class:`MeshJob` of every mesh (see :func:`build_many`)."""
    from .mesh import resolve_mesh_path

    sources = [os.fspath(m) for m in meshes]
    if outputs is None:
        if out_dir is None:
            raise ValueError("build_many() needs out_dir (or one output per mesh)")
        outputs = [Path(out_dir) / (Path(s).stem + TREE_SUFFIX) for s in sources]
    else:
        outputs = list(outputs)
        if len(outputs) != len(sources):
            raise ValueError(f"{len(sources)} meshes but {len(outputs)} outputs")
    jobs = []
    for index, (source, output) in enumerate(zip(sources, outputs)):
        try:
            path = str(resolve_mesh_path(source).resolve())
            size = os.path.getsize(path)
        except OSError:
            path, size = source, 0
        jobs.append(MeshJob(index=index, source=source, path=path,
                            output=os.path.abspath(os.path.expanduser(os.fspath(output))),
                            size=size))
    return jobs


def run_jobs(jobs, settings: BatchSettings, connect: Optional[Callable] = None,
             on_record: Optional[Callable] = None, progress: Optional[Callable] = None
             ) -> BatchReport:
    """Run planned jobs in this process or on a cluster; see :func:`build_many`.

    Parameters
    ----------
    jobs : list of MeshJob
    settings : BatchSettings
    connect : callable, optional
        Returns the ``dask.distributed.Client`` to run on; called only when
        some tree is not up to date (so a batch with nothing to do starts no
        cluster). ``None``: this process.
    on_record : callable, optional
        ``on_record(record)`` as each mesh completes.
    progress : callable, optional
        ``progress(job, fraction)`` during builds in this process (the
        command line's bar); fraction 0 when a mesh starts.

    Raises
    ------
    KeyboardInterrupt
        After cancelling the tasks not yet started.
    """
    start = time.perf_counter()
    records = [None] * len(jobs)

    def emit(record):
        records[record.index] = record
        if on_record is not None:
            on_record(record)

    pending, claimed = [], {}
    for job in jobs:
        if job.output in claimed:
            emit(failed_record(job, OutputExistsError(
                f"{job.output} is also the output of an earlier mesh in this batch "
                f"({claimed[job.output]}; two meshes with the same name)")))
            continue
        claimed[job.output] = job.source
        pending.append(job)
    if connect is None:
        for job in pending:
            emit(build_one(job, settings, progress=progress))
    else:
        # read the headers here first: only trees that are not up to date become tasks
        to_submit = []
        for job in pending:
            record = None if settings.force else _up_to_date_record(job, settings)
            if record is not None:
                emit(record)
            else:
                to_submit.append(job)
        if to_submit:
            _run_on_dask(connect(), to_submit, settings, emit)
    return BatchReport(records=records, seconds=time.perf_counter() - start)


# --- one mesh ------------------------------------------------------------------------------

def build_one(job: MeshJob, settings: BatchSettings, progress: Optional[Callable] = None,
              worker: str = "local") -> MeshRecord:
    """Build and save the tree of one mesh unless it is up to date; never raises.

    This is the task every worker runs (and the in-process loop calls).

    Returns
    -------
    MeshRecord
        ``"built"``, ``"up to date"``, or ``"failed"`` with the error.
    """
    try:
        loader = settings.loader or load_source
        sha256, arrays = _mesh_digest(job.path, loader)
        state, reason, header = _output_state(job, settings, sha256)
        if state == UP_TO_DATE:
            return MeshRecord(index=job.index, input=job.source, output=job.output,
                              status=UP_TO_DATE, triangles=_header_triangles(header),
                              worker=worker, sha256=sha256)
        if progress is not None:
            progress(job, 0.0)
        if arrays is None:
            arrays = loader(job.path)
        vertices, faces = arrays
        tree, notes = _build(vertices, faces, settings,
                             None if progress is None else (lambda f: progress(job, f)))
        tree.build_info["source"] = settings.source_record(sha256, job.path)
        Path(job.output).parent.mkdir(parents=True, exist_ok=True)
        tree.save(job.output)
        device = tree.build_info.get("device")
        return MeshRecord(index=job.index, input=job.source, output=job.output, status=BUILT,
                          reason=reason, triangles=tree.num_triangles,
                          seconds=float(tree.build_info.get("seconds", float("nan"))),
                          worker=worker, device=device, gpu=_gpu_name(device), sha256=sha256,
                          stats=dict(tree.stats()) if settings.stats else {},
                          build_info=dict(tree.build_info),
                          warnings=notes)
    except Exception as exc:
        record = failed_record(job, exc)
        record.worker = worker
        return record


def _build(vertices, faces, settings, progress):
    """``kd.build``; settings the GPU builder lacks build on the CPU when the device is "auto"."""
    from . import builder

    options = dict(settings.build_options)
    if progress is not None:
        options["progress"] = progress
    try:
        return builder.build(vertices, faces, config=settings.config, device=settings.device,
                             **options), []
    except NotImplementedError as exc:
        if parse_device(settings.device)[0] != "auto":
            raise
        tree = builder.build(vertices, faces, config=settings.config, device="cpu", **options)
        return tree, [f"building on the CPU: {exc}"]


def load_source(source):
    """The default loader: a mesh file or name (:func:`kdtree_gpu.load_mesh`) or a built-in scene.

    Returns
    -------
    vertices : (num_vertices, 3) float32
    faces : (num_triangles, 3) int32
    """
    from .mesh import load_mesh, resolve_mesh_path

    try:
        path = resolve_mesh_path(source)
    except FileNotFoundError:
        from .scenes import scene_by_name, scene_names

        if str(source) in scene_names():
            return scene_by_name(str(source)).arrays()
        raise
    with warnings.catch_warnings():
        # coordinates beyond float32 make NumPy warn as load_mesh converts
        # them, before it raises the MeshError that names the vertex
        warnings.simplefilter("ignore", RuntimeWarning)
        return load_mesh(path)


def _mesh_digest(path, loader):
    """sha256 of the mesh file's bytes; of the loaded arrays (returned too) when it is no file."""
    digest = hashlib.sha256()
    if os.path.isfile(path):
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(_HASH_CHUNK), b""):
                digest.update(chunk)
        return digest.hexdigest(), None
    arrays = loader(path)
    import numpy as np

    for a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(f"{a.dtype.str}{a.shape}".encode())
        digest.update(memoryview(a).cast("B"))
    return digest.hexdigest(), arrays


def _output_state(job, settings, sha256):
    """``(state, reason, header)``: up to date, to build (why), or an error for a file in the way.

    Raises
    ------
    OutputExistsError
        A file at the output that is not an earlier tree of this mesh (without ``force``).
    """
    from .tree import TreeFileError, read_header

    if not os.path.lexists(job.output):
        return BUILT, "new", None
    if settings.force:
        return BUILT, "forced", None
    hint = "; use force=True to overwrite it"
    try:
        header = read_header(job.output)
    except (TreeFileError, OSError):
        raise OutputExistsError(f"{job.output} exists and is not a tree file{hint}") from None
    source = (header.get("build_info") or {}).get("source")
    if not isinstance(source, dict) or "sha256" not in source:
        raise OutputExistsError(f"{job.output} exists: a tree without a record of its mesh{hint}")
    same_mesh = source.get("sha256") == sha256
    same_settings = settings.same_settings(header)
    if same_mesh and same_settings:
        return UP_TO_DATE, None, header
    if same_mesh:
        return BUILT, "settings changed", header
    if source.get("path") == job.path:
        return BUILT, "mesh changed", header
    raise OutputExistsError(f"{job.output} exists: the tree of another mesh "
                            f"({source.get('path')}){hint}")


def _up_to_date_record(job, settings) -> Optional[MeshRecord]:
    """The record of a tree found up to date here, else ``None`` (the task decides)."""
    if not os.path.lexists(job.output):
        return None
    try:
        sha256, _ = _mesh_digest(job.path, settings.loader or load_source)
        state, _, header = _output_state(job, settings, sha256)
    except Exception:
        return None
    if state != UP_TO_DATE:
        return None
    return MeshRecord(index=job.index, input=job.source, output=job.output, status=UP_TO_DATE,
                      triangles=_header_triangles(header), worker="local", sha256=sha256)


def _header_triangles(header) -> Optional[int]:
    for entry in header.get("arrays", []):
        if entry.get("name") == "faces":
            return int(entry["shape"][0])
    return None


def failed_record(job: MeshJob, exc: BaseException, message: Optional[str] = None,
                  input_error: Optional[bool] = None) -> MeshRecord:
    """The record of a mesh that failed with ``exc`` (``message``: its line, if not the default)."""
    from .mesh import MeshError
    from .tree import TreeFileError

    if input_error is None:
        input_error = isinstance(exc, (MeshError, TreeFileError, OSError, NotImplementedError))

    return MeshRecord(index=job.index, input=job.source, output=job.output, status=FAILED,
                      error=message or _error_text(exc), input_error=input_error,
                      exception=exc)


def _error_text(exc: BaseException) -> str:
    """One line naming the problem (the file of an OS error)."""
    if isinstance(exc, OSError) and exc.filename is not None:
        if isinstance(exc, FileNotFoundError):
            return f"no such file or directory: {exc.filename}"
        return f"{exc.strerror or exc}: {exc.filename}"
    text = " ".join(str(exc).split())
    if isinstance(exc, (ValueError, RuntimeError, TypeError, OSError, MemoryError)) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _gpu_name(device) -> Optional[str]:
    if not device or not str(device).startswith("cuda"):
        return None
    from .device import device_name

    try:
        name = device_name(device)
    except Exception:
        name = str(device)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f"{name} (CUDA_VISIBLE_DEVICES={visible})" if visible else name


def _callable_name(fn) -> Optional[str]:
    if fn is None:
        return None
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(fn))}"


# --- Dask ------------------------------------------------------------------------------------

def require_dask(what: str = "this"):
    """Import ``distributed``, or raise a one-line ``ImportError`` saying what to install."""
    try:
        import distributed
    except ImportError:
        raise ImportError(f"{what} needs Dask, which is not installed: "
                          f"{DASK_INSTALL_HINT}") from None
    return distributed


def _dask_task(job: MeshJob, settings: BatchSettings) -> MeshRecord:
    # runs on a worker: the record goes back without the exception object
    from distributed import get_worker

    record = build_one(job, settings, worker=get_worker().address)
    record.exception = None
    return record


def _run_on_dask(client, jobs, settings, emit) -> None:
    """One task per job, largest mesh first; emit each record as its task completes."""
    import queue

    batch_id = uuid.uuid4().hex[:12]
    jobs = sorted(jobs, key=lambda j: -j.size)
    # one call: the scheduler gets every task at once, queues them in this order
    # and hands each worker one at a time (worker-saturation 1 on local clusters)
    submitted = client.map(_dask_task, jobs, settings=settings, pure=False,
                           key=[f"{TASK_PREFIX}-{batch_id}-{job.index}" for job in jobs])
    job_of = dict(zip((f.key for f in submitted), jobs))
    completed = queue.Queue()

    def collect(future):
        # runs in Dask's callback thread: every call to the cluster happens here,
        # so that Ctrl-C, which reaches the main thread, never lands inside one
        job = job_of[future.key]
        try:
            if future.status == "finished":
                record = future.result()
            else:
                record = _failed_future(job, future)
            record.retries = _worker_deaths(client, future.key)
        except BaseException as exc:  # the cluster went away
            record = failed_record(job, exc)
        future.release()
        completed.put(record)

    for future in submitted:
        future.add_done_callback(collect)
    try:
        for _ in submitted:
            emit(completed.get())
    except BaseException:
        # Ctrl-C, or the caller's on_record raised: nothing more starts
        client.cancel(submitted)
        raise


def _failed_future(job, future) -> MeshRecord:
    if future.status == "cancelled":
        return failed_record(job, RuntimeError("cancelled"))
    exc = future.exception()
    if type(exc).__name__ == "KilledWorker":
        return failed_record(job, exc, f"{job.source}: its worker died each time it built this "
                                       "mesh (a crash or the out-of-memory killer; see the "
                                       "worker logs)")
    return failed_record(job, exc)


def _worker_deaths(client, key) -> Optional[int]:
    """How many workers died holding task ``key`` (the scheduler's count), or None."""
    def count(key, dask_scheduler=None):
        # runs on the scheduler; a nested function travels by value, so the
        # scheduler needs no kdtree_gpu
        task = dask_scheduler.tasks.get(key)
        return None if task is None else int(task.suspicious)

    try:
        return client.run_on_scheduler(count, key)
    except Exception:
        return None


def visible_gpus() -> list:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries (empty without a GPU)."""
    from .device import gpu_available

    if not gpu_available():
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        return [v.strip() for v in visible.split(",") if v.strip()]
    import cupy

    return [str(i) for i in range(cupy.cuda.runtime.getDeviceCount())]


@contextlib.contextmanager
def local_client(workers: Optional[int] = None, device="auto", gpus=None,
                 dashboard: bool = True, quiet: bool = True):
    """A Dask cluster of worker processes on this machine, and a client on it.

    ``with local_client(2) as client: kd.build_many(meshes, out, client=client)``.

    Parameters
    ----------
    workers : int, optional
        Worker processes, one build at a time each. Default: one per GPU, or
        one per CPU core without GPUs.
    device : str
        ``"auto"``: GPU workers when a GPU is usable here, else CPU workers;
        ``"cpu"``: CPU workers; ``"gpu"`` / ``"cuda"``: GPU workers (an error
        without a GPU). ``"cuda:N"`` is refused: each GPU worker sees only its
        own GPU.
    gpus : list of str, optional
        ``CUDA_VISIBLE_DEVICES`` entries to give the workers (numbers or
        UUIDs); default: every GPU this process sees. Giving them makes GPU
        workers.
    dashboard : bool
        Serve the Dask dashboard on port 8787 (or a free one; its pages need
        bokeh), else on a free port.
    quiet : bool
        Only errors from Dask's logs.

    Yields
    ------
    distributed.Client
        ``client.cluster`` is the cluster; ``client.cluster.kdtree_gpu_layout``
        says how workers map to GPUs.

    Notes
    -----
    GPU workers: with ``dask-cuda`` installed and no more workers than GPUs,
    ``dask_cuda.LocalCUDACluster`` (one worker per GPU); otherwise worker
    processes started by Dask nannies with ``CUDA_VISIBLE_DEVICES`` set per
    worker (the nanny's ``env``), worker ``i`` on GPU ``i mod len(gpus)``.
    """
    import logging

    require_dask("a local cluster")
    import dask
    from distributed import Client

    kind, index = parse_device(device)
    if index is not None:
        raise ValueError(f"device {device!r} names one GPU; each worker of a local cluster "
                         "uses its own (give device='auto', 'gpu' or 'cpu')")
    if gpus is None and kind != "cpu":
        gpus = visible_gpus()
        if kind == "cuda" and not gpus:
            from .device import require_gpu

            require_gpu(f"device={device!r}")
    gpus = [str(g) for g in gpus or []]
    if workers is None:
        workers = len(gpus) or os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    dashboard_address = ":8787" if dashboard else ":0"
    log_level = logging.ERROR if quiet else logging.WARNING
    # one task at a time per worker: a queued task never waits behind a long
    # build, and only the running task counts as lost when a worker dies
    with dask.config.set({"distributed.scheduler.worker-saturation": 1.0}):
        cluster = _start_cluster(workers, gpus, dashboard_address, log_level)
    try:
        client = Client(cluster)
        # Ctrl-C in a terminal reaches the whole process group: this process
        # cancels the batch and stops the workers, which must not die of it first
        client.register_plugin(_ignore_interrupts_plugin())
    except BaseException:
        cluster.close()
        raise
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            client.close()
        with contextlib.suppress(Exception):
            cluster.close()


def _ignore_interrupts_plugin():
    """A worker plugin that makes SIGINT do nothing in the worker process (restarted ones too)."""
    from distributed import WorkerPlugin

    # defined here, so that it travels by value and workers need no kdtree_gpu to load it
    class IgnoreInterrupts(WorkerPlugin):
        name = "kdtree-gpu-ignore-interrupts"

        def setup(self, worker):
            import signal
            import threading

            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, signal.SIG_IGN)

    return IgnoreInterrupts()


def _start_cluster(workers, gpus, dashboard_address, log_level):
    from distributed import Nanny, Scheduler, SpecCluster

    if gpus and workers <= len(gpus):
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            LocalCUDACluster = None
        if LocalCUDACluster is not None:
            cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(gpus), n_workers=workers,
                                       threads_per_worker=1, dashboard_address=dashboard_address,
                                       silence_logs=log_level)
            cluster.kdtree_gpu_layout = (f"{workers} workers, one per GPU (dask_cuda."
                                         f"LocalCUDACluster, GPUs {','.join(gpus[:workers])})")
            return cluster
    specs, layout = {}, []
    for i in range(workers):
        env = {"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} if gpus else {}
        specs[f"kdtree-gpu-{i}"] = {"cls": Nanny, "options": {"nthreads": 1, "env": env,
                                                               "silence_logs": log_level}}
        layout.append(f"GPU {env['CUDA_VISIBLE_DEVICES']}" if gpus else "CPU")
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1",
                                               "dashboard_address": dashboard_address}}
    cluster = SpecCluster(scheduler=scheduler, workers=specs, silence_logs=log_level,
                          name="kdtree-gpu")
    what = "GPU" if gpus else "CPU"
    cluster.kdtree_gpu_layout = (f"{workers} {what} worker process{'es' if workers > 1 else ''}"
                                 + (f" (CUDA_VISIBLE_DEVICES {', '.join(layout)})" if gpus else ""))
    return cluster


@contextlib.contextmanager
def connect(address: str, wait_for_workers: float = WAIT_FOR_WORKERS_S):
    """A client on an existing cluster (``"tcp://host:8786"``) that has at least one worker.

    Raises
    ------
    OSError
        The scheduler does not answer.
    RuntimeError
        No worker joined within ``wait_for_workers`` seconds.
    """
    require_dask("a scheduler address")
    from distributed import Client

    client = Client(address, timeout=f"{CONNECT_TIMEOUT_S}s")
    try:
        try:
            client.wait_for_workers(1, timeout=wait_for_workers)
        except TimeoutError:
            raise RuntimeError(f"the scheduler at {address} has no worker after "
                               f"{wait_for_workers:g} s (start some: dask worker {address})"
                               ) from None
        yield client
    finally:
        with contextlib.suppress(Exception):
            client.close()


def dashboard_link(client) -> Optional[str]:
    """The address of the cluster's dashboard, or ``None`` when it serves none."""
    try:
        link = client.dashboard_link
    except Exception:
        return None
    return link or None


def has_bokeh() -> bool:
    """Whether this process can serve the dashboard's pages (they need bokeh)."""
    import importlib.util

    return importlib.util.find_spec("bokeh") is not None


def remove_partial_trees(jobs) -> list:
    """Delete the temporary files that killed workers left beside these outputs.

    Call it only when no worker may still be writing them (a local cluster
    that was closed). Returns the paths removed.
    """
    removed = []
    for job in jobs:
        output = Path(job.output)
        if not output.parent.is_dir():
            continue
        # the temporary name of kdtree_gpu.atomic.atomic_write
        for partial in output.parent.glob(f".{output.name}.tmp*"):
            with contextlib.suppress(OSError):
                partial.unlink()
                removed.append(str(partial))
    return removed

