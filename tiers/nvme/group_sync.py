"""GroupSync: concurrent puts to one extent file share one fdatasync.

A put is durable once its record's write completed and an fdatasync of the file *started after
that* completed. ``sync(file)`` returns at that point. Callers that arrive while an fdatasync of
the file is running cannot use it (it may have started before their write finished), so they
all join the *next* one, which starts as soon as the running one ends: N concurrent puts to a
file cost about two fdatasyncs, not N. Callers that arrive when none is running start one at
once, so a lone put waits for exactly one fdatasync, as before.

A failed fdatasync (EIO, a dead engine) fails every caller that joined it: none of their
records is known to be durable, and each put undoes itself. The next caller starts afresh.

Concurrency: loop thread only; one driver task per file while callers wait.
Invariants: every fdatasync a caller waits for was issued after that caller joined; ``syncs``
counts the fdatasyncs issued.
"""

from __future__ import annotations

import asyncio

from tiers.io.engine import FileHandle, IOEngine

__all__ = ["GroupSync"]


class _FileState:
    __slots__ = ("driver", "next")

    def __init__(self) -> None:
        self.next: asyncio.Future[None] | None = None  # the fdatasync new callers join
        self.driver: asyncio.Task[None] | None = None


class GroupSync:
    """Shared fdatasyncs of the files of one engine."""

    def __init__(self, engine: IOEngine) -> None:
        self.engine = engine
        self.syncs = 0  # fdatasyncs issued
        self.waits = 0  # sync() calls served
        self._files: dict[FileHandle, _FileState] = {}

    async def sync(self, file: FileHandle) -> None:
        """Return once every write to ``file`` completed before this call is durable.

        Raises: what the fdatasync raised (StorageError, EngineClosedError).
        """
        state = self._files.get(file)
        if state is None:
            state = self._files[file] = _FileState()
        if state.next is None:
            state.next = asyncio.get_running_loop().create_future()
        joined = state.next
        if state.driver is None or state.driver.done():
            state.driver = asyncio.ensure_future(self._drive(file, state))
        self.waits += 1
        await asyncio.shield(joined)

    async def _drive(self, file: FileHandle, state: _FileState) -> None:
        while state.next is not None:
            current, state.next = state.next, None  # later callers join the one after
            self.syncs += 1
            try:
                await self.engine.fsync(file, datasync=True)
            except asyncio.CancelledError:
                current.cancel()
                raise
            except Exception as exc:  # handed to every caller that joined
                if not current.done():
                    current.set_exception(exc)
                    current.exception()  # retrieved: callers may all have been cancelled
                continue
            if not current.done():
                current.set_result(None)
        if self._files.get(file) is state and state.next is None:
            del self._files[file]  # nothing waits: no state kept per idle file

    def forget(self, file: FileHandle) -> None:
        """Drop the state of a closed file."""
        self._files.pop(file, None)
