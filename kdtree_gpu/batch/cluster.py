"""The Dask side of a batch: local clusters, connecting to one, running the tasks.

Dask is imported inside these functions only, when a batch asks for it.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Optional

from ..device import parse_device
from .records import (CONNECT_TIMEOUT_S, DASK_INSTALL_HINT, TASK_PREFIX, WAIT_FOR_WORKERS_S,
                      BatchSettings, MeshJob, MeshRecord)
from .task import build_one, failed_record


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
    from ..device import gpu_available

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
            from ..device import require_gpu

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
    """A worker plugin that makes SIGINT do nothing in the worker process (restarted ones
    too) and keeps the heartbeat race of a cancelled batch's shutdown off stderr."""
    from distributed import WorkerPlugin

    # defined here, so that it travels by value and workers need no kdtree_gpu to load it
    class IgnoreInterrupts(WorkerPlugin):
        name = "kdtree-gpu-ignore-interrupts"

        def setup(self, worker):
            import logging
            import signal
            import threading

            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, signal.SIG_IGN)

            # When the batch is cancelled the scheduler can close while a
            # heartbeat is on its way: the worker then logs a traceback
            # though nothing is wrong. Other worker messages still show.
            class QuietShutdown(logging.Filter):
                def filter(self, record):
                    return "during heartbeat" not in record.getMessage()

            logging.getLogger("distributed.worker").addFilter(QuietShutdown())

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
def connect(address: str, wait_for_workers: float = WAIT_FOR_WORKERS_S,
            timeout: Optional[float] = None):
    """A client on an existing cluster (``"tcp://host:8786"``) that has at least one worker.

    ``timeout`` is how long the scheduler has to answer (default
    :data:`CONNECT_TIMEOUT_S` seconds).

    Raises
    ------
    OSError
        The scheduler does not answer.
    RuntimeError
        No worker joined within ``wait_for_workers`` seconds.
    """
    require_dask("a scheduler address")
    from distributed import Client

    timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
    client = Client(address, timeout=f"{timeout}s")
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
