"""CrashLog: the writes not yet made durable by fsync, kept so a simulated power cut can undo them.

A power cut loses what the page cache held and the disk did not. :class:`CrashLog` models that
per file (keyed by real path, so it outlives the handles that wrote): for every write completed
since the file's last fsync it keeps the offset, the bytes the write overwrote and the bytes it
wrote, plus the file size at that fsync. :meth:`CrashLog.restore` rebuilds the durable image (undo
the writes in reverse order, truncate to the synced size) and can then re-apply a random subset
of the unsynced writes, each one whole and in order (a disk that got some of them out in time).

Old bytes are read with plain ``os.pread`` on a separate buffered descriptor just before the
write is issued, in the loop thread. That costs a blocking read and a copy per write, which is
fine for a test tool and wrong for anything else.

Model limits: exact for sequential writes and for concurrent writes that do not overlap (the
order of overlapping concurrent writes is undefined on a real disk too). Opening with create or
truncate counts as durable at once (synchronous metadata). A size change made outside the engine
(ftruncate, fallocate) is picked up only by an fsync issued while no write to the file is in
flight.

Concurrency: loop thread only (the owning FaultyEngine calls it from there).
Invariants: ``_FileLog.writes`` holds completed, unsynced writes in completion order; a file's
size is never below its ``synced_size`` while the engine is alive (engines only grow files).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

__all__ = ["CrashLog", "PowerCutReport", "UnsyncedWrite"]


@dataclass(slots=True)
class UnsyncedWrite:
    """One write since the last fsync. ``new`` is None when the write failed (undo only)."""

    offset_bytes: int
    old: bytes
    new: bytes | None

    @property
    def span(self) -> tuple[int, int]:
        """(offset, length) of the bytes the write asked to change."""
        return (self.offset_bytes, len(self.new or b""))


@dataclass(slots=True)
class _FileLog:
    synced_size: int
    writes: list[UnsyncedWrite] = field(default_factory=list)
    inflight: int = 0  # writes issued, not yet completed


@dataclass(frozen=True)
class PowerCutReport:
    """What a power cut did, per real path: the (offset, length) of unsynced writes it kept
    (re-applied after the cut) and of those it dropped, in the order they were written."""

    kept: dict[str, list[tuple[int, int]]]
    dropped: dict[str, list[tuple[int, int]]]


class CrashLog:
    """Unsynced writes per file, and the durable size of each file that has any."""

    def __init__(self) -> None:
        self._files: dict[str, _FileLog] = {}

    @staticmethod
    def key(path: str) -> str:
        return os.path.realpath(path)

    def forget(self, path: str) -> None:
        """The file was truncated on open: that is durable, so earlier writes no longer matter."""
        log = self._files.get(self.key(path))
        if log is not None:
            log.writes.clear()
            log.synced_size = 0

    def begin_writes(self, items: list[tuple[str, int, bytes]]) -> list[UnsyncedWrite]:
        """Before writes are issued: capture the bytes each will overwrite.

        ``items`` are (path, offset, new bytes); returns one pending record per item, to hand
        to :meth:`end_write` once the write finished.
        """
        pending: list[UnsyncedWrite] = []
        descriptors: dict[str, int] = {}
        try:
            for path, offset, new in items:
                key = self.key(path)
                fd = descriptors.get(key)
                if fd is None:
                    fd = descriptors[key] = os.open(key, os.O_RDONLY | os.O_CLOEXEC)
                if key not in self._files:  # nothing unsynced: the current size is durable
                    self._files[key] = _FileLog(os.fstat(fd).st_size)
                pending.append(UnsyncedWrite(offset, _pread_all(fd, len(new), offset), new))
        finally:
            for fd in descriptors.values():
                os.close(fd)
        # counted only once every capture worked, so a failed capture leaves nothing in flight
        for path, _, _ in items:
            self._files[self.key(path)].inflight += 1
        return pending

    def end_write(self, path: str, write: UnsyncedWrite, succeeded: bool) -> None:
        """A write issued after :meth:`begin_writes` finished (a failed one may be torn)."""
        log = self._files[self.key(path)]
        log.inflight -= 1
        if not succeeded:
            write.new = None
        log.writes.append(write)

    def begin_sync(self, path: str) -> tuple[int, int | None] | None:
        """Before an fsync is issued: note which writes it covers (those already completed)."""
        log = self._files.get(self.key(path))
        if log is None:
            return None
        # With no write in flight the current size is exactly what this fsync makes durable.
        size = os.stat(self.key(path)).st_size if not log.inflight else None
        return (len(log.writes), size)

    def end_sync(self, path: str, token: tuple[int, int | None] | None) -> None:
        """The fsync begun with ``token`` succeeded: the writes it covered are durable."""
        log = self._files.get(self.key(path))
        if token is None or log is None:
            return
        covered, size = token
        durable, log.writes[:covered] = log.writes[:covered], []
        if size is not None:
            log.synced_size = size
        else:
            ends = [w.offset_bytes + len(w.new) for w in durable if w.new is not None]
            log.synced_size = max([log.synced_size, *ends])
        if not log.writes and not log.inflight:
            del self._files[self.key(path)]

    def restore(self, rng: random.Random, keep: str) -> PowerCutReport:
        """Put every file back to its last-fsynced image; with ``keep="random"`` then re-apply
        each successful unsynced write with probability 1/2. Nothing may be in flight."""
        kept: dict[str, list[tuple[int, int]]] = {}
        dropped: dict[str, list[tuple[int, int]]] = {}
        for key, log in self._files.items():
            assert not log.inflight, "restore with writes in flight"
            try:
                fd = os.open(key, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # deleted since: nothing left to restore
            try:
                for write in reversed(log.writes):
                    _pwrite_all(fd, write.old, write.offset_bytes)
                os.ftruncate(fd, log.synced_size)
                for write in log.writes:
                    if write.new is None:
                        continue  # a failed write: undone above, never re-applied
                    if keep == "random" and rng.random() < 0.5:
                        _pwrite_all(fd, write.new, write.offset_bytes)
                        kept.setdefault(key, []).append(write.span)
                    else:
                        dropped.setdefault(key, []).append(write.span)
                os.fsync(fd)
            finally:
                os.close(fd)
        self._files.clear()
        return PowerCutReport(kept, dropped)


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    """Up to ``length`` bytes at ``offset``; fewer only at end of file."""
    chunks: list[bytes] = []
    while length > 0:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            break
        chunks.append(chunk)
        length -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        moved = os.pwrite(fd, view, offset)
        view, offset = view[moved:], offset + moved
