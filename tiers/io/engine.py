"""IOEngine: the async, batched file I/O interface every tierkit byte moves through.

An engine reads and writes at file offsets into *caller-owned* buffers (numpy arrays,
memoryviews, bytearrays, torch CPU tensors); it never allocates the caller's data buffers.
Subclasses implement four hooks (``_attach``, ``_detach``, ``_start``, ``_shutdown``); this base
class owns validation, the file table, draining, and turning per-request failures into errors.

Semantics shared by every engine (checked by ``tiers.testing.engine_contract.EngineContract``):
  * a read fills its whole buffer unless end of file comes first: short transfers are resumed,
    and the result is the number of bytes read (less than asked only at EOF);
  * a write moves its whole buffer or raises;
  * a batch finishes every request before it returns or raises, so the caller's buffers are never
    touched after the call ends; the first failure is raised with ``batch_results`` attached;
  * ``aclose`` refuses new requests, lets accepted ones finish, then releases everything.

Concurrency: an engine belongs to the asyncio loop that first uses it; call it only from that
loop's thread. Any number of batches may be in flight at once.
"""

from __future__ import annotations

import abc
import asyncio
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from tiers.io.batch import READ, WRITE, IOBatch, ReadRequest, WriteRequest
from tiers.io.buffers import PAGE_SIZE_BYTES
from tiers.io.env import Env, default_env
from tiers.io.errors import (
    DirectIOUnsupportedError,
    EngineClosedError,
    InvalidArgumentError,
    UnexpectedEOFError,
    map_os_errors,
)

__all__ = ["FileHandle", "IOEngine"]


class FileHandle:
    """An open file of one engine. Obtain with :meth:`IOEngine.open`; close with ``close_file``."""

    __slots__ = (
        "_drained",
        "alignment_bytes",
        "closed",
        "direct",
        "fd",
        "inflight",
        "path",
        "slot",
        "writable",
    )

    def __init__(self, path: str, fd: int, direct: bool, writable: bool, alignment_bytes: int):
        self.path = path
        self.fd = fd
        self.direct = direct
        self.writable = writable
        self.alignment_bytes = alignment_bytes
        self.slot = -1  # engine-private index (io_uring registered-file slot)
        self.closed = False
        self.inflight = 0  # requests of this file in flight; guarded by the loop thread
        self._drained: list[asyncio.Future[None]] = []

    def __repr__(self) -> str:
        flags = ("direct," if self.direct else "") + ("rw" if self.writable else "r")
        return f"FileHandle({self.path!r}, fd={self.fd}, {flags})"


class IOEngine(abc.ABC):
    """Base of UringEngine, ThreadEngine, GdsEngine (and the FaultyEngine wrapper)."""

    name: str = "abstract"
    supports_direct_io: bool = True
    # single read_into/write_from calls of one loop pass share a submission, and each settles
    # on its own completion (UringEngine): callers may issue singles instead of batching
    gathers_singles: bool = False

    def __init__(self, queue_depth: int = 128, env: Env | None = None) -> None:
        if queue_depth <= 0:
            raise InvalidArgumentError(f"queue_depth must be positive, got {queue_depth}")
        self.queue_depth = queue_depth
        self.env = env or default_env
        self._files: set[FileHandle] = set()
        self._closing = False
        self._inflight_batches = 0
        self._drained: list[asyncio.Future[None]] = []
        self.counters = {
            "batches": 0,
            "requests": 0,
            "bytes_read": 0,
            "bytes_written": 0,
            "errors": 0,
            "short_transfers_resumed": 0,
        }

    # ----------------------------------------------------------------- subclass hooks
    @abc.abstractmethod
    def _start(self, batch: IOBatch) -> None:
        """Start every request of ``batch`` without blocking; fill ``batch.results`` and
        ``batch.errors`` (per-request OS errors are recorded, not raised); then call
        ``self._complete(batch)`` from the loop thread exactly once, when none is in flight."""

    def _attach(self, file: FileHandle) -> None:  # noqa: B027  (optional hook)
        """Called after a file is opened (e.g. to register it with the kernel ring)."""

    def _detach(self, file: FileHandle) -> None:  # noqa: B027  (optional hook)
        """Called before a file's descriptor is closed."""

    def _own_buffer(self, buffer: Any) -> Any:
        """Hook: turn a buffer this engine accepts but ``as_buffer`` does not (GdsEngine: a CUDA
        tensor) into a BufferRef. The default passes the buffer through."""
        return buffer

    def _own_request(self, request: ReadRequest | WriteRequest) -> ReadRequest | WriteRequest:
        if not isinstance(request, ReadRequest | WriteRequest):
            return request  # IOBatch.from_requests reports it
        buffer = self._own_buffer(request.buffer)
        if buffer is request.buffer:
            return request
        return type(request)(request.file, request.offset_bytes, buffer)

    async def _shutdown(self) -> None:  # noqa: B027  (optional hook)
        """Release engine resources; nothing is in flight when called."""

    # ----------------------------------------------------------------- files
    async def open(
        self,
        path: str | os.PathLike[str],
        *,
        write: bool = False,
        create: bool = False,
        truncate: bool = False,
        direct: bool = False,
        alignment_bytes: int = PAGE_SIZE_BYTES,
    ) -> FileHandle:
        """Open ``path`` for this engine.

        Args:
            write: open read-write (reads are always allowed).
            create / truncate: O_CREAT / O_TRUNC (both imply ``write``).
            direct: O_DIRECT; every request must then be aligned to ``alignment_bytes``.

        Raises:
            DirectIOUnsupportedError: the filesystem refuses O_DIRECT.
            FileMissingError, PermissionDeniedError, StorageError: the OS refused the open.
        """
        self._check_open()
        path = os.fspath(path)
        writable = write or create or truncate
        flags = os.O_RDWR if writable else os.O_RDONLY
        flags |= (os.O_CREAT if create else 0) | (os.O_TRUNC if truncate else 0)
        if direct:
            if not self.supports_direct_io or not self.env.direct_flag():
                raise DirectIOUnsupportedError(path)
            flags |= self.env.direct_flag()
        try:
            with map_os_errors(path):
                fd = self.env.open(path, flags)
        except InvalidArgumentError:
            raise
        except OSError as exc:
            if direct and exc.errno == 22:  # EINVAL: the filesystem has no O_DIRECT
                raise DirectIOUnsupportedError(path) from exc
            raise
        file = FileHandle(path, fd, direct, writable, alignment_bytes)
        try:
            self._attach(file)
        except BaseException:
            self.env.close(fd)
            raise
        self._files.add(file)
        return file

    async def close_file(self, file: FileHandle) -> None:
        """Close ``file`` once its in-flight requests finish; later requests on it fail."""
        if file.closed:
            return
        file.closed = True  # refuse new requests at once
        while file.inflight:
            waiter = asyncio.get_running_loop().create_future()
            file._drained.append(waiter)
            await waiter
        self._detach(file)
        self._files.discard(file)
        with map_os_errors(file.path):
            self.env.close(file.fd)

    async def preallocate(self, file: FileHandle, offset_bytes: int, size_bytes: int) -> None:
        """Reserve ``[offset_bytes, offset_bytes + size_bytes)`` of ``file`` (posix_fallocate).

        Runs in a worker thread but counts as a request of ``file``, so ``close_file`` and
        ``aclose`` wait for it: the descriptor is never closed (and its number reused) under it.
        """
        self._check_open()
        if file.closed:
            raise EngineClosedError(f"file {file.path!r} is closed")
        if offset_bytes < 0 or size_bytes <= 0:
            raise InvalidArgumentError(f"bad preallocation range {offset_bytes}+{size_bytes}")
        file.inflight += 1
        work = asyncio.ensure_future(
            asyncio.to_thread(self.env.allocate, file.fd, offset_bytes, size_bytes)
        )
        work.add_done_callback(lambda _: self._settle(file, 1))  # even if the caller is cancelled
        with map_os_errors(file.path, offset_bytes):
            await asyncio.shield(work)

    def file_size(self, file: FileHandle) -> int:
        """Current size of ``file`` in bytes."""
        with map_os_errors(file.path):
            return self.env.file_size(file.fd)

    # ----------------------------------------------------------------- I/O
    async def submit(self, requests: Sequence[ReadRequest | WriteRequest]) -> list[int]:
        """Issue ``requests`` together; they complete in any order.

        Returns:
            Bytes moved per request, in request order (a read returns less only at EOF).
        Raises:
            InvalidArgumentError/AlignmentError before anything is issued; the first
            StorageError after all requests finished (``batch_results`` holds each outcome).
        """
        batch = IOBatch.from_requests([self._own_request(r) for r in requests])
        await self.run(batch)
        return batch.results.tolist()

    async def read_into(self, file: FileHandle, offset_bytes: int, buffer: Any) -> int:
        """Read into all of ``buffer`` from ``offset_bytes``; returns bytes read (short = EOF)."""
        return (await self.submit([ReadRequest(file, offset_bytes, buffer)]))[0]

    async def read_exactly_into(self, file: FileHandle, offset_bytes: int, buffer: Any) -> None:
        """Like read_into, but reaching EOF first raises UnexpectedEOFError."""
        batch = IOBatch.from_requests([ReadRequest(file, offset_bytes, self._own_buffer(buffer))])
        await self.run(batch)
        if batch.results[0] != batch.lengths[0]:
            raise UnexpectedEOFError(
                61,
                "end of file before the buffer was full",
                file.path,
                offset_bytes + int(batch.results[0]),
            )

    async def write_from(self, file: FileHandle, offset_bytes: int, buffer: Any) -> int:
        """Write all of ``buffer`` at ``offset_bytes``; returns the bytes written."""
        return (await self.submit([WriteRequest(file, offset_bytes, buffer)]))[0]

    async def read_batch(
        self,
        file: FileHandle,
        buffer: Any,
        file_offsets: np.ndarray,
        lengths: np.ndarray | int,
        buffer_offsets: np.ndarray | None = None,
    ) -> np.ndarray:
        """Vectorised batch: request ``i`` reads ``lengths[i]`` bytes at ``file_offsets[i]`` into
        ``buffer[buffer_offsets[i]:]`` (packed back to back when ``buffer_offsets`` is None).

        Returns: int64[n] bytes read per request.
        """
        batch = IOBatch.for_one_buffer(
            READ, file, self._own_buffer(buffer), file_offsets, lengths, buffer_offsets
        )
        await self.run(batch)
        return batch.results

    async def write_batch(
        self,
        file: FileHandle,
        buffer: Any,
        file_offsets: np.ndarray,
        lengths: np.ndarray | int,
        buffer_offsets: np.ndarray | None = None,
    ) -> np.ndarray:
        """Vectorised batch of writes, the mirror of :meth:`read_batch`."""
        batch = IOBatch.for_one_buffer(
            WRITE, file, self._own_buffer(buffer), file_offsets, lengths, buffer_offsets
        )
        await self.run(batch)
        return batch.results

    async def fsync(self, file: FileHandle, *, datasync: bool = False) -> None:
        """Make every completed write to ``file`` durable (fdatasync when ``datasync``)."""
        await self.run(IOBatch.for_sync(file, datasync))

    async def run(self, batch: IOBatch) -> None:
        """Execute a validated batch and raise its first error, if any.

        Cancelling the caller does not cancel the I/O: it runs to completion (the engine keeps
        the buffers alive and the accounting straight), and ``aclose`` still waits for it.
        """
        self._check_open()
        if batch.file is not None:
            counts: dict[FileHandle, int] = {batch.file: len(batch)}
        else:
            counts = Counter(batch.files)
        for file, count in counts.items():
            if file.closed:
                raise EngineClosedError(f"file {file.path!r} is closed")
            file.inflight += count
        self._inflight_batches += 1
        batch.future = asyncio.get_running_loop().create_future()
        batch.file_counts = counts
        try:
            self._start(batch)
        except BaseException:
            self._complete(batch)
            raise
        await batch.future
        if batch.errors:
            self._raise_first_error(batch)

    def _settle(self, file: FileHandle, count: int) -> None:
        """``count`` requests on ``file`` are no longer in flight: wake its drain waiters."""
        file.inflight -= count
        if not file.inflight:
            wake_all(file._drained)

    def _settle_batch(self, requests: int) -> None:
        """A batch (or a gathered single request) finished: count it, wake engine drains."""
        self._inflight_batches -= 1
        if not self._inflight_batches:
            wake_all(self._drained)
        self.counters["batches"] += 1
        self.counters["requests"] += requests

    def _complete(self, batch: IOBatch) -> None:
        """Called by the engine, in the loop thread, once no request of ``batch`` is in flight."""
        if not batch.future.done():  # the caller resumes before anyone waiting for a drain
            batch.future.set_result(None)
        for file, count in batch.file_counts.items():
            self._settle(file, count)
        self._settle_batch(len(batch))
        counters = self.counters
        if batch.op == READ:
            counters["bytes_read"] += int(batch.results.sum())
        elif batch.op == WRITE:
            counters["bytes_written"] += int(batch.results.sum())
        elif batch.op == -1:
            reads = batch.ops == READ
            counters["bytes_read"] += int(batch.results[reads].sum())
            counters["bytes_written"] += int(batch.results[~reads].sum())
        counters["errors"] += len(batch.errors)

    def _raise_first_error(self, batch: IOBatch) -> None:
        first = min(batch.errors)
        outcome: list[int | BaseException] = list(batch.results.tolist())
        for index, error in batch.errors.items():
            outcome[index] = error
        error = batch.errors[first]
        if hasattr(error, "batch_results"):
            error.batch_results = outcome
        raise error

    # ----------------------------------------------------------------- lifecycle
    def _check_open(self) -> None:
        if self._closing:
            raise EngineClosedError(f"{self.name} engine is closed")

    @property
    def closed(self) -> bool:
        return self._closing

    async def aclose(self) -> None:
        """Refuse new requests, wait for accepted ones, close every file, free resources."""
        if self._closing:
            return
        self._closing = True
        while self._inflight_batches:
            waiter = asyncio.get_running_loop().create_future()
            self._drained.append(waiter)
            await waiter
        for file in list(self._files):
            await self.close_file(file)
        await self._shutdown()

    async def __aenter__(self) -> IOEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def stats(self) -> dict[str, Any]:
        """Counters since creation, plus the engine's name and queue depth."""
        return {"engine": self.name, "queue_depth": self.queue_depth, **self.counters}


def wake_all(waiters: list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
    waiters.clear()
