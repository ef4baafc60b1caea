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

import os
import time
from pathlib import Path
from typing import Callable, Optional

from ..config import SAHConfig
from ..device import parse_device
from .cluster import (_run_on_dask, connect, dashboard_link, has_bokeh, local_client,
                      remove_partial_trees, require_dask, visible_gpus)
from .records import (BUILT, FAILED, TREE_SUFFIX, UP_TO_DATE, BatchReport, BatchSettings,
                      MeshJob, MeshRecord, OutputExistsError)
from .task import _up_to_date_record, build_one, failed_record, load_source

__all__ = ["BUILT", "FAILED", "UP_TO_DATE", "BatchReport", "BatchSettings", "MeshJob",
           "MeshRecord", "OutputExistsError", "build_many", "build_one", "connect",
           "dashboard_link", "failed_record", "has_bokeh", "load_source", "local_client",
           "plan_jobs", "remove_partial_trees", "require_dask", "run_jobs", "visible_gpus"]


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
    from ..mesh import resolve_mesh_path

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
