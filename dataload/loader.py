"""ShuffledLoader: a drop-in for torch's DataLoader with a true global shuffle, read RINAS-style.

Each epoch's order is a pure function of ``(seed, epoch)`` over the whole source, sliced per rank
(``order.py``). The loader keeps up to ``prefetch_batches`` batches in flight on one background
I/O thread (``fetcher.py``): all their reads are issued together and complete in any order, and
each batch is assembled in sampler order. Prefetch runs on across the end of an epoch, so the
next epoch's first batch is usually ready when the loop asks for it.

Position and resume: the loader counts epochs itself (``set_epoch`` is accepted, never needed)
and its position is ``(epoch, samples_consumed)`` at this rank, counted when a batch is *handed
to the caller*. ``state_dict()`` therefore names exactly the next batch; ``load_state_dict``
resumes there by index arithmetic, and can be repeated. ``iter()`` continues from the current
position: after a finished epoch that is the next epoch, after a ``break`` the rest of this one.

Workers (issue 19): ``source`` may also be any map-style ``torch.utils.data.Dataset``
(``dataset_source.py``; with the located-bytes protocol of ``located.py`` its reads run on the
I/O core). ``num_workers`` counts worker processes, as in DataLoader, that run the per-sample
Python on batches in shared memory (``workers/``); ``worker_type="thread"`` keeps them threads.

Concurrency: iterate a loader from one thread at a time. ``close`` (or leaving a ``with`` block)
stops its thread; a loader dropped without ``close`` stops it when garbage-collected.
"""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dataload.collate import Assembled, OnError
from dataload.dataset_source import DatasetSource
from dataload.loader_setup import (
    close_fetcher,
    cuda_available,
    distributed_defaults,
    mp_context,
    pin,
    pin_note,
    private_runtime,
)
from dataload.order import RankPlan, RankRemainder
from dataload.source import Source
from dataload.state import check_state, make_state
from dataload.stats import LoaderStats
from dataload.workers.select import WorkerType, base_seed_of, build_fetcher
from tiers.io import InvalidArgumentError, IOEngine, IORuntime, default_runtime

__all__ = ["ShuffledLoader"]

log = logging.getLogger("tierkit.dataload")


class ShuffledLoader:
    """Iterable of batches of ``source``, globally shuffled per epoch, exactly resumable.

    Args:
        source: a :class:`~dataload.source.Source` (record file, Arrow, Parquet, LMDB, files)
            or a map-style ``Dataset`` (``__len__`` + ``__getitem__``; see ``located.py`` for
            the optional protocol that lets the I/O core read its bytes).
        batch_size: samples per batch; ``drop_last`` drops this rank's short last batch.
        shuffle, seed: a new permutation of the whole source every epoch (``shuffle=False``:
            index order).
        rank, world_size: this process's share; default: ``torch.distributed`` when
            initialised, else 0 of 1. ``rank_remainder``: "pad" (repeat a few samples so every
            rank gets the same count) or "drop" (leave the remainder out).
        transform: per-sample function (bytes view, ``{column: value}`` or a dataset's sample
            in, anything out); ``collate_fn`` combines a batch (default: one zero-copy tensor
            for equal-size samples, else ``default_collate``).
        num_workers, worker_type: where transforms, ``__getitem__`` and collate run: 0 in the
            iterating thread, as DataLoader's ``num_workers=0`` (reads still run ahead);
            else ``num_workers`` processes ("process", the default: as DataLoader's workers,
            on batches in shared memory) or threads of the runtime's CPU executor ("thread").
            ``worker_init_fn(worker_id)`` runs first in each process; ``multiprocessing_context``
            None means forkserver (see ``workers/pool.py``; "spawn" also works).
        prefetch_batches: batches in flight beyond the one being consumed (default: 4, or
            ``2 * num_workers`` when more -- DataLoader's ``prefetch_factor=2`` per worker).
        pin_memory: copy batches into pinned memory in the decode thread -- only when CUDA is
            available; without CUDA it does nothing (``stats()["pin_memory"]`` says so).
        on_error: "raise" the first failed sample's error, or "skip" failed samples (counted in
            ``stats()["skipped"]``).
        runtime: the IORuntime whose loop thread, engine and CPU executor the loader uses
            (default: the process's, shared with every other product).
        engine, queue_depth: set either (a kind "uring" | "thread", or a factory returning an
            IOEngine; a queue depth other than 128) to give this loader a private runtime
            with that engine instead, closed with the loader.
        progress: show a tqdm bar per epoch.
    """

    def __init__(
        self,
        source: Source,
        batch_size: int = 1,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        rank_remainder: RankRemainder = "pad",
        transform: Callable[[Any], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        worker_type: WorkerType = "process",
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        prefetch_batches: int | None = None,
        pin_memory: bool = False,
        on_error: OnError = "raise",
        runtime: IORuntime | None = None,
        engine: str | Callable[[], IOEngine] | None = None,
        queue_depth: int = 128,
        timeout_s: float | None = None,
        progress: bool = False,
    ) -> None:
        if prefetch_batches is None:
            prefetch_batches = max(4, 2 * num_workers)
        if prefetch_batches < 0 or num_workers < 0:
            raise InvalidArgumentError("prefetch_batches and num_workers must be >= 0")
        rank, world_size = distributed_defaults(rank, world_size)
        if not isinstance(source, Source):
            source = DatasetSource(source)
        self.source = source
        self.plan = RankPlan(
            len(source), batch_size, seed, rank, world_size, rank_remainder, drop_last, shuffle
        )
        self.transform, self.collate_fn = transform, collate_fn
        self.prefetch_batches, self.timeout_s, self.progress = prefetch_batches, timeout_s, progress
        self.pin_memory = pin_memory and cuda_available()
        self.pin_memory_note = pin_note(pin_memory, self.pin_memory)
        self._epoch, self._consumed = 0, 0
        self._next_epoch, self._next_start = 0, 0  # where the next submission starts
        self._pending: deque[tuple[int, int, int, concurrent.futures.Future[Assembled]]] = deque()
        self._epoch_cache: dict[int, np.ndarray] = {}
        self._stats = LoaderStats()
        self._owned_runtime = private_runtime(runtime, engine, queue_depth)
        self._runtime = runtime or self._owned_runtime or default_runtime()
        self.num_workers, self.base_seed = num_workers, base_seed_of(seed)
        try:
            self._fetcher, self.workers_note = build_fetcher(
                copy.copy(source),  # open() state (engine, files, caches) is per loader
                transform=transform,
                collate_fn=collate_fn,
                on_error=on_error,
                runtime=self._runtime,
                num_workers=num_workers,
                worker_type=worker_type,
                worker_init_fn=worker_init_fn,
                base_seed=self.base_seed,
                max_slabs=2 * (prefetch_batches + 2),
                finish=pin if self.pin_memory else None,
                context=mp_context(multiprocessing_context),
            )
        except BaseException:
            if self._owned_runtime is not None:
                self._owned_runtime.close()
            raise
        self._finalizer = weakref.finalize(self, close_fetcher, self._fetcher, self._owned_runtime)

    # ----------------------------------------------------------------- DataLoader surface
    @property
    def dataset(self) -> Any:
        """The Dataset the loader was given, else its source (DataLoader's ``.dataset``)."""
        return self.source.dataset if isinstance(self.source, DatasetSource) else self.source

    @property
    def batch_size(self) -> int:
        return self.plan.batch_size

    @property
    def drop_last(self) -> bool:
        return self.plan.drop_last

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._epoch

    def __len__(self) -> int:
        """Batches per epoch at this rank."""
        return len(self.plan)

    def __iter__(self) -> Iterator[Any]:
        if self._consumed >= self.plan.samples_per_epoch:
            self._epoch, self._consumed = self._epoch + 1, 0
        epoch = self._epoch
        bar = _progress_bar(self, epoch) if self.progress else None
        try:
            while self._epoch == epoch and self._consumed < self.plan.samples_per_epoch:
                yield self._next_batch()
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()

    def set_epoch(self, epoch: int) -> None:
        """Compatibility with DistributedSampler: jump to the start of ``epoch`` unless the loader
        is already in it (so calling it after a resume does not restart the epoch)."""
        if epoch < 0:
            raise InvalidArgumentError(f"epoch must be >= 0, got {epoch}")
        at_end = self._consumed >= self.plan.samples_per_epoch
        if epoch != self._epoch and not (at_end and epoch == self._epoch + 1):
            self._seek(epoch, 0)

    # ----------------------------------------------------------------- batches
    def _next_batch(self) -> Any:
        self._fill()
        epoch, start, count, future = self._pending.popleft()
        assert (epoch, start) == (self._epoch, self._consumed), "prefetch out of step"
        started_s = time.perf_counter()
        try:
            result = future.result(self.timeout_s)
        except concurrent.futures.TimeoutError:
            self._pending.appendleft((epoch, start, count, future))
            raise TimeoutError(f"no batch within {self.timeout_s} s") from None
        except BaseException:
            self._seek(self._epoch, self._consumed)  # a retry re-reads the failed batch
            raise
        waited_s = time.perf_counter() - started_s
        try:
            assembled = self._fetcher.complete(result)  # assembles here when num_workers=0
        except BaseException:
            self._seek(self._epoch, self._consumed)
            raise
        self._consumed += count
        self._stats.record(waited_s, assembled.samples, assembled.skipped, assembled.bytes_read)
        self._fill()
        return assembled.value

    def _fill(self) -> None:
        """Keep ``prefetch_batches + 1`` batches submitted, running on into the next epoch."""
        per_epoch = self.plan.samples_per_epoch
        while len(self._pending) <= self.prefetch_batches:
            if self._next_start >= per_epoch:
                self._next_epoch, self._next_start = self._next_epoch + 1, 0
            indices = self._indices(self._next_epoch)
            chunk = indices[self._next_start : self._next_start + self.plan.batch_size]
            future = self._fetcher.submit(chunk)
            self._pending.append((self._next_epoch, self._next_start, len(chunk), future))
            self._next_start += len(chunk)

    def _indices(self, epoch: int) -> np.ndarray:
        cached = self._epoch_cache.get(epoch)
        if cached is None:
            cached = self._epoch_cache[epoch] = self.plan.indices(epoch)
            for old in [e for e in self._epoch_cache if e < epoch - 1]:
                del self._epoch_cache[old]
        return cached

    def _seek(self, epoch: int, consumed: int) -> None:
        """Move to ``(epoch, consumed)``; batches prefetched for elsewhere are discarded."""
        for _, _, _, future in self._pending:
            future.cancel()
        self._pending.clear()
        self._epoch, self._consumed = epoch, consumed
        self._next_epoch, self._next_start = epoch, consumed

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Where the next batch comes from, plus what must match for a resume to be exact
        (with StatefulDataLoader's key names too: ``state.py``)."""
        return make_state(self.plan, self._epoch, self._consumed, self.base_seed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` (from ``state_dict`` of a loader over the same data and world;
        any ``num_workers``).

        Raises:
            InvalidArgumentError: another version, dataset size, world size or shuffle mode.
        """
        epoch, consumed = check_state(state, self.plan)
        if state["seed"] != self.plan.seed:
            self.plan = RankPlan(**{**self.plan.__dict__, "seed": int(state["seed"])})
            self._epoch_cache.clear()
        self._seek(epoch, consumed)

    def stats(self) -> dict[str, Any]:
        """Throughput and stalls at the consumer, engine counters, and the current position."""
        return {
            **self._stats.as_dict(),
            "epoch": self._epoch,
            "samples_consumed": self._consumed,
            "pin_memory": self.pin_memory_note,
            "workers": self.workers_note,
            "engine": self._fetcher.engine_stats(),
        }

    def reset_stats(self) -> None:
        self._stats.reset()

    # ----------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Stop prefetching, close files, give back the engine lease. Idempotent."""
        for _, _, _, future in self._pending:
            future.cancel()
        self._pending.clear()
        self._finalizer()

    def __enter__(self) -> ShuffledLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _progress_bar(loader: ShuffledLoader, epoch: int) -> Any:
    from tqdm import tqdm

    done = loader._consumed // loader.batch_size
    return tqdm(total=len(loader), initial=done, desc=f"epoch {epoch}", unit="batch")
