"""SearchGatherer: small searches from many concurrent callers answered in shared batches.

Most callers (a REST handler per request, an agent per question) search one query at a time,
many at once. One search per call pays a head scan setup, a submission and a top-k each; a
batch pays them once and reads a list two of its queries need once. So a small search joins a
queue, and a batch takes every queued query with the same settings.

The wait is bounded without a timer: a caller who finds a batch slot free and nobody queued
runs at once, alone (a lone caller's latency is unchanged); otherwise it queues, and the queue
is taken by the next batch as soon as one of the ``max_in_flight`` slots frees, so no caller
waits for more than the batches ahead of it. Callers that arrive while batches run are exactly
the ones a batch can share: the busier the index, the larger its batches.

A batch's answers are at least as good as each query alone: a query scores its own lists plus,
free of I/O, those its batch mates read (search.py, shared lists).

Thread-safety: one event loop (the index's). A caller cancelled while queued is dropped from its
batch's answers; a batch that fails fails every caller in it with the same error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["SearchGatherer"]

# (queries [Q, dim], k, params) -> (ids [Q, k], internal distances [Q, k], skipped lists)
Answer = tuple[np.ndarray, np.ndarray, np.ndarray]
RunBatch = Callable[[np.ndarray, int, Any], Awaitable[Answer]]


@dataclass
class _Waiting:
    queries: np.ndarray
    k: int
    future: asyncio.Future[Answer]


@dataclass
class _Queue:
    waiting: list[_Waiting] = field(default_factory=list)
    queries: int = 0


class SearchGatherer:
    """Runs ``run(queries, k, params)`` on batches of the queued callers' queries."""

    def __init__(self, run: RunBatch, max_batch_queries: int = 256, max_in_flight: int = 2):
        self._run = run
        self.max_batch_queries = max_batch_queries
        self.max_in_flight = max_in_flight
        self._in_flight = 0
        self._queues: dict[Any, _Queue] = {}  # by params: a batch shares one setting
        self._tasks: set[asyncio.Future[None]] = set()
        self.batches = 0
        self.gathered_queries = 0  # queries answered in a batch with other callers' queries

    async def search(self, queries: np.ndarray, k: int, params: Any) -> Answer:
        """The answer of ``queries`` (prepared, [Q, dim]) as if searched alone, or better."""
        if self._in_flight < self.max_in_flight and not self._queues:
            self._in_flight += 1
            try:
                return await self._run(queries, k, params)
            finally:
                self._in_flight -= 1
                self._start_batches()
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        queue = self._queues.setdefault(params, _Queue())
        queue.waiting.append(_Waiting(queries, k, future))
        queue.queries += len(queries)
        self._start_batches()
        return await future

    def _start_batches(self) -> None:
        while self._in_flight < self.max_in_flight and self._queues:
            params = next(iter(self._queues))
            taken = self._take(params)
            if taken:
                self._in_flight += 1
                task = asyncio.ensure_future(self._batch(taken, params))
                self._tasks.add(task)  # the loop keeps only a weak reference to a task
                task.add_done_callback(self._tasks.discard)

    def _take(self, params: Any) -> list[_Waiting]:
        """Queued callers of ``params`` up to ``max_batch_queries`` queries (at least one)."""
        queue = self._queues[params]
        taken: list[_Waiting] = []
        count = 0
        while queue.waiting and (
            not taken or count + len(queue.waiting[0].queries) <= self.max_batch_queries
        ):
            waiting = queue.waiting.pop(0)
            queue.queries -= len(waiting.queries)
            if not waiting.future.cancelled():
                taken.append(waiting)
                count += len(waiting.queries)
        if not queue.waiting:
            del self._queues[params]
        return taken

    async def _batch(self, taken: list[_Waiting], params: Any) -> None:
        try:
            queries = np.concatenate([w.queries for w in taken])
            k = max(w.k for w in taken)
            ids, dist, skipped = await self._run(queries, k, params)
        except BaseException as exc:  # every caller of the batch gets it
            for waiting in taken:
                if not waiting.future.done():
                    waiting.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            self.batches += 1
            if len(taken) > 1:
                self.gathered_queries += len(queries)
            first = 0
            for waiting in taken:
                rows = slice(first, first + len(waiting.queries))
                first = rows.stop
                if not waiting.future.done():
                    answer = (ids[rows, : waiting.k], dist[rows, : waiting.k], skipped)
                    waiting.future.set_result(answer)
        finally:
            self._in_flight -= 1
            self._start_batches()
