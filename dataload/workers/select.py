"""Choosing where a loader's per-sample Python runs: the consumer thread, threads, or processes.

``num_workers`` counts processes, as in DataLoader (``worker_type="process"``, the default), or
threads of the runtime's CPU executor (``worker_type="thread"``); 0 runs the work in the thread
that iterates, as DataLoader does. Processes start only when there is per-sample Python to run
-- a transform, a collate_fn, a Dataset's ``__getitem__``/``decode``: the zero-copy batches of
raw records are assembled on the I/O loop and need no worker at all.

Process workers get the work by pickle (the forkserver cannot inherit it). When the transform,
collate_fn or dataset cannot be pickled (a lambda, a local function) and no ``worker_init_fn``
was given, the loader runs the work in ``num_workers`` threads instead and says so in its log
and in ``stats()["workers"]``; with a ``worker_init_fn`` it raises, since threads cannot honour
it. The base seed of the workers is drawn as DataLoader draws it from a generator seeded with
the loader's ``seed``; workers live as long as the loader (DataLoader's ``persistent_workers``),
so they are seeded once.

Concurrency: called once, from the loader's constructor.
"""

from __future__ import annotations

import logging
import pickle
import types
from collections.abc import Callable
from typing import Any, Literal, cast

import torch

from dataload.collate import BatchAssembler, OnError
from dataload.dataset_source import DatasetAssembler, DatasetSource, SourceLabel
from dataload.fetcher import Fetcher
from dataload.source import Source
from dataload.workers.fetcher import ProcessFetcher
from tiers.io import InvalidArgumentError, IORuntime

__all__ = ["WorkerType", "base_seed_of", "build_fetcher", "work_modules"]

WorkerType = Literal["process", "thread"]
log = logging.getLogger("tierkit.dataload")


def base_seed_of(seed: int) -> int:
    """The workers' base seed: DataLoader's draw from ``torch.Generator().manual_seed(seed)``."""
    generator = torch.Generator().manual_seed(seed)
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def build_fetcher(
    source: Source,
    *,
    transform: Callable[[Any], Any] | None,
    collate_fn: Callable[[list[Any]], Any] | None,
    on_error: OnError,
    runtime: IORuntime,
    num_workers: int,
    worker_type: WorkerType,
    worker_init_fn: Callable[[int], None] | None,
    base_seed: int,
    max_slabs: int,
    finish: Callable[[Any], Any] | None,
    context: Any = None,
) -> tuple[Fetcher | ProcessFetcher, str]:
    """The fetcher for a loader, and a note on where its work runs (``stats()["workers"]``)."""
    if worker_type not in ("process", "thread"):
        raise InvalidArgumentError(f"worker_type must be 'process' or 'thread': {worker_type!r}")
    if worker_init_fn is not None and (worker_type != "process" or num_workers == 0):
        raise InvalidArgumentError("worker_init_fn needs worker_type='process', num_workers > 0")
    assembler: Any
    if isinstance(source, DatasetSource):
        assembler = DatasetAssembler(source.dataset, source.name, transform, collate_fn, on_error)
    else:
        assembler = BatchAssembler(source, transform, collate_fn, on_error)
    note = f"{num_workers} threads" if num_workers else "the iterating thread"
    if worker_type == "process" and num_workers > 0 and assembler.heavy:
        payload, why_not = _payload(source, assembler, worker_init_fn)
        if payload is not None:
            work = (transform, collate_fn, worker_init_fn, getattr(assembler, "dataset", None))
            fetcher = ProcessFetcher(
                source,
                payload,
                runtime=runtime,
                num_workers=num_workers,
                base_seed=base_seed,
                on_error=on_error,
                max_slabs=max_slabs + 2 * num_workers,
                finish=finish,
                context=context,
                preload=work_modules(*work),
            )
            return fetcher, f"{num_workers} processes"
        if worker_init_fn is not None:
            raise InvalidArgumentError(f"process workers need picklable work: {why_not}")
        note = f"{num_workers} threads (not processes: {why_not})"
        log.warning("loader over %s: %s", source.name, note)
    elif worker_type == "process" and num_workers > 0:
        note = "none needed (zero-copy batches are assembled on the I/O thread)"
    fetcher_threads = Fetcher(
        source,
        assembler,
        runtime=runtime,
        decode_threads=num_workers,
        max_slabs=max_slabs,
        finish=finish,
    )
    return fetcher_threads, note


def work_modules(*work: Any) -> list[str]:
    """The modules that define ``work`` (functions, classes, or instances of classes; a
    dataset's own ``transform`` too), for the forkserver to preload: what unpickling the work
    in a worker would otherwise import there, once per worker."""
    modules: list[str] = []
    for item in work:
        if item is None:
            continue
        inner = getattr(item, "transform", None)  # a dataset's transform
        for obj in (item, inner) if inner is not None else (item,):
            owner = obj if isinstance(obj, type | types.FunctionType) else type(obj)
            name = getattr(owner, "__module__", None)
            if isinstance(name, str) and name not in ("__main__", "builtins") and "<" not in name:
                modules.append(name)
    return list(dict.fromkeys(modules))


def _payload(
    source: Source, assembler: Any, worker_init_fn: Callable[[int], None] | None
) -> tuple[bytes | None, str]:
    """The pickled work for the workers, or None and why it cannot be pickled."""
    if isinstance(assembler, BatchAssembler):  # a worker needs only the source's name
        label = cast(Source, SourceLabel(source.name))
        assembler = BatchAssembler(
            label, assembler.transform, assembler.collate_fn, assembler.on_error
        )
    try:
        return pickle.dumps((assembler, worker_init_fn), protocol=pickle.HIGHEST_PROTOCOL), ""
    except Exception as exc:  # pickle raises several types for local objects and lambdas
        return None, f"the transform, collate_fn or dataset cannot be pickled ({exc})"
