"""PutGather: concurrent single puts of one NvmeTier written together, as one put_many.

Callers who never heard of put_many still get its costs. A put that arrives while fewer than
``max_groups`` groups are being written starts a group at once (a lone put waits for what it
waited for before: one write, one fdatasync, one commit); puts that arrive while ``max_groups``
groups are in flight queue, and the first group to end starts the next with the queued puts, in
order, up to ``max_group_bytes`` (so one group's staging copy and CRCs stay short). NvmeWrites
sends only small puts here: puts of 1 MiB and more go alone, as several in flight beat one
large write.
So 64 tasks each awaiting ``put`` cost a few writes, fdatasyncs and catalog commits per round
instead of 64 of each (before, they shared the fdatasyncs and commits but not the writes, the
allocations or the Python of a put, ~200 us of CPU each).

A group is one call of ``write(items, owners)`` (NvmeWrites._put_items): its records commit in
one transaction, so after a crash all of a group's puts are there or none; none of them was
acknowledged before its commit. Errors:

* CapacityError is a group's, not any one put's: its puts are then written one by one, in the
  order they came, so each caller hears its own answer (a put that fits alone still succeeds);
* any other error (the device, the catalog, a closed engine) fails every put of the group, as a
  failed shared fdatasync always has.

A caller cancelled while its group runs leaves the group alone (as a shielded put did): the put
may still commit. Two puts of one key in a group: the later one is written, both are acknowledged.

Concurrency: loop thread only. Invariants: every queued put is in exactly one later group; the
tier's OpGuard counts each group in flight from the moment it is started, so a close drains it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np

from tiers.io.errors import CapacityError
from tiers.storage.op_guard import OpGuard

__all__ = ["PutGather"]

Write = Callable[[dict[str, np.ndarray], list[Any]], Coroutine[Any, Any, None]]
_Put = tuple[str, np.ndarray, Any, "asyncio.Future[None]"]


class PutGather:
    """Groups of the concurrent ``put``s of one tier; ``groups`` counts the groups written."""

    def __init__(
        self, write: Write, ops: OpGuard, max_groups: int = 2, max_group_bytes: int = 8 << 20
    ) -> None:
        self._write = write
        self._ops = ops
        self._max_groups = max_groups
        self._max_group_bytes = max_group_bytes
        self._queue: list[_Put] = []
        self._running: set[asyncio.Task[None]] = set()
        self.groups = 0

    async def put(self, key: str, payload: np.ndarray, owner: Any) -> None:
        """Write ``payload`` under ``key`` with the puts gathered meanwhile; returns once durable.

        Raises: what the group's write raised (see the module docstring for CapacityError).
        """
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((key, payload, owner, future))
        while self._queue and len(self._running) < self._max_groups:
            self._start()
        await future

    def _start(self) -> None:
        queue, size = self._queue, 0
        taken = 0
        while taken < len(queue) and (
            not taken or size + queue[taken][1].nbytes <= self._max_group_bytes
        ):
            size += queue[taken][1].nbytes
            taken += 1
        batch, self._queue = queue[:taken], queue[taken:]
        self._ops.enter()  # counted now: a close that starts before the task runs waits for it
        task = asyncio.ensure_future(self._run(batch))
        self._running.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._ops.leave()
        while self._queue and len(self._running) < self._max_groups:
            self._start()

    async def _run(self, batch: list[_Put]) -> None:
        self.groups += 1
        try:
            await self._write_group(batch)
        finally:
            for put in batch:  # only if this task itself was cancelled (the loop is closing)
                if not put[3].done():
                    put[3].cancel()

    async def _write_group(self, batch: list[_Put]) -> None:
        items = {key: payload for key, payload, _, _ in batch}
        try:
            await self._write(items, [owner for _, _, owner, _ in batch])
        except CapacityError as exc:
            if len(batch) == 1:
                _settle(batch[0][3], exc)
                return
            for key, payload, owner, future in batch:  # each put's own answer
                try:
                    await self._write({key: payload}, [owner])
                except Exception as alone:
                    _settle(future, alone)
                else:
                    _settle(future, None)
            return
        except Exception as exc:
            for put in batch:
                _settle(put[3], exc)
            return
        for put in batch:
            _settle(put[3], None)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():  # its caller was cancelled
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
