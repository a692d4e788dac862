"""The worker process: runs a batch's per-sample Python (transform, ``__getitem__``, collate).

Started by :class:`~dataload.workers.pool.ProcessPool` from the forkserver; this module is
preloaded there, so a worker starts with torch and numpy already imported. It seeds itself as a
DataLoader worker does -- ``torch.initial_seed() == base_seed + worker_id``, ``random`` the same,
numpy from ``(base_seed, worker_id)`` by torch's own function -- sets the worker info that
``torch.utils.data.get_worker_info()`` returns, runs ``worker_init_fn(worker_id)``, says READY,
then serves tasks until STOP or until the loader's end of the pipe closes (so a loader that
dies takes its workers with it). SIGINT is ignored: Ctrl-C is the loader's to handle, and it
stops the workers.

A task's bytes are read in place from the loader's slab; the result goes into the output slab
the task names (or is pickled when it does not fit). Any exception becomes a ``Failed`` naming
the sample when the error is a per-sample one.

Concurrency: one thread; one task at a time.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch

from dataload.collate import mark_loader_worker
from dataload.errors import SampleError
from dataload.packed_strings import PackedStrings
from dataload.source import SampleBatch
from dataload.workers.protocol import READY, STOP, Done, Failed, Task, pack_tree, tree_bytes
from dataload.workers.shm import Attachments

__all__ = ["worker_main"]


def worker_main(
    worker_id: int, num_workers: int, conn: Connection, payload: bytes, base_seed: int
) -> None:
    """Entry point of worker ``worker_id`` of ``num_workers``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    mark_loader_worker()
    try:
        assembler, worker_init_fn = pickle.loads(payload)
        _seed_like_dataloader(worker_id, num_workers, base_seed, assembler)
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
    except BaseException as exc:
        _send(conn, _failed(-1, exc))
        return
    _send_bytes(conn, READY)
    attachments = Attachments()
    try:
        while True:
            try:
                message = conn.recv_bytes()
            except (EOFError, OSError):
                return  # the loader is gone
            if message == STOP:
                return
            task: Task = pickle.loads(message)
            try:
                reply: Any = _run(task, assembler, attachments)
            except BaseException as exc:
                reply = _failed(task.task_id, exc)
            if not _send(conn, reply):
                return
    finally:
        attachments.clear()
        _exit_now()


def _exit_now() -> None:
    """Leave without interpreter teardown (nothing of the worker's needs it, and with torch
    loaded it is most of a short-lived worker's exit time)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _seed_like_dataloader(worker_id: int, num_workers: int, base_seed: int, assembler: Any) -> None:
    from torch.utils.data._utils import worker as torch_worker

    torch.set_num_threads(1)
    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(torch_worker._generate_state(base_seed, worker_id))
    dataset = getattr(assembler, "dataset", None)
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=worker_id,
        num_workers=num_workers,
        seed=seed,
        dataset=dataset,  # type: ignore[arg-type]
    )


def _run(task: Task, assembler: Any, attachments: Attachments) -> Done:
    data = None
    if task.data_ref is not None:
        name, offset, length = task.data_ref
        data = attachments.get(name, offset + length)[offset : offset + length]
    columns = task.columns
    if columns is not None and data is not None:  # string columns sent as offsets only
        columns = {
            name: values.attached(data)
            if isinstance(values, PackedStrings) and values.data is None
            else values
            for name, values in columns.items()
        }
    batch = SampleBatch(
        task.indices,
        data,
        task.starts,
        task.sizes,
        columns,
        bytes_read=task.bytes_read,
        packed=task.packed,
        labels=task.labels,
    )
    name_of = getattr(assembler, "source_name", "source")
    for position in task.failed_positions:  # read failures, already reported by the loader
        index = int(task.indices[position])
        batch.errors[position] = SampleError(name_of, index, "read failed")
    assembled = assembler(batch)
    value, needed = assembled.value, tree_bytes(assembled.value)
    spec, packed = value, False
    if task.out_ref is not None and 0 < needed <= task.out_ref[1]:
        out_name, capacity = task.out_ref
        spec, packed = pack_tree(value, attachments.get(out_name, capacity)[:capacity]), True
    return Done(
        task.task_id, spec, packed, assembled.samples, assembled.skipped, batch.bytes_read, needed
    )


def _failed(task_id: int, exc: BaseException) -> Failed:
    source = index = None
    if isinstance(exc, SampleError):
        source, index = exc.source, exc.sample_index
        message = str(exc).split(": ", 2)[-1]
        cause = exc.__cause__
        if cause is not None:
            message = f"{message} (caused by {cause!r})"
    else:
        message = repr(exc)
    return Failed(task_id, type(exc).__name__, source, index, message, traceback.format_exc())


def _send(conn: Connection, reply: Done | Failed) -> bool:
    try:
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # an unpicklable result: say so instead of dying
        data = pickle.dumps(_failed(getattr(reply, "task_id", -1), exc))
    return _send_bytes(conn, data)


def _send_bytes(conn: Connection, data: bytes) -> bool:
    try:
        conn.send_bytes(data)
        return True
    except (BrokenPipeError, OSError):
        return False
