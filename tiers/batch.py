"""IOBatch: a batch of file I/O requests as parallel numpy arrays, the unit every engine executes.

Requests are validated here, once, before any reaches the kernel (alignment for O_DIRECT, bounds,
writability), so engines only move bytes. Keeping a batch as arrays lets the io_uring engine fill
all of its submission entries in one vectorised step.

Concurrency: a batch is built by the caller, executed by one engine, and read back by the
caller after completion; it is never shared between engines.
Invariants: ``results[i]`` is the number of bytes transferred by request ``i`` once the batch
is done; ``errors`` maps request index to the exception that ended it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from tiers.buffers import BufferRef, as_buffer
from tiers.errors import AlignmentError, EngineClosedError, InvalidArgumentError

if TYPE_CHECKING:
    from tiers.engine import FileHandle

__all__ = ["IOBatch", "Op", "ReadRequest", "WriteRequest"]


class Op(IntEnum):
    READ = 0
    WRITE = 1
    FSYNC = 2
    FDATASYNC = 3


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """Read ``len(buffer)`` bytes of ``file`` at ``offset_bytes`` into the caller's ``buffer``."""

    file: FileHandle
    offset_bytes: int
    buffer: Any


@dataclass(frozen=True, slots=True)
class WriteRequest:
    """Write all of the caller's ``buffer`` to ``file`` at ``offset_bytes``."""

    file: FileHandle
    offset_bytes: int
    buffer: Any


class IOBatch:
    """Parallel arrays, one row per request: op, file, address, length, offset."""

    __slots__ = (
        "addresses",
        "errors",
        "file_counts",
        "files",
        "future",
        "lengths",
        "offsets",
        "ops",
        "owners",
        "pending",
        "results",
    )

    def __init__(
        self,
        ops: np.ndarray,
        files: list[FileHandle],
        addresses: np.ndarray,
        lengths: np.ndarray,
        offsets: np.ndarray,
        owners: list[Any],
    ) -> None:
        self.ops = ops  # uint8[n], Op values
        self.files = files  # one per row; shared objects for a single-file batch
        self.addresses = addresses  # uint64[n]
        self.lengths = lengths  # int64[n]
        self.offsets = offsets  # int64[n], file offsets
        self.owners = owners  # keeps the caller's buffers alive while I/O is in flight
        self.results = np.zeros(len(ops), dtype=np.int64)
        self.errors: dict[int, BaseException] = {}
        self.future: Any = None  # set by IOEngine.run: resolved when the batch is done
        self.file_counts: dict[Any, int] = {}  # requests per file, for draining on close
        self.pending = 0  # engine-private: requests not yet finished

    def __len__(self) -> int:
        return len(self.ops)

    @classmethod
    def from_requests(cls, requests: list[ReadRequest | WriteRequest]) -> IOBatch:
        n = len(requests)
        ops = np.empty(n, np.uint8)
        addresses = np.empty(n, np.uint64)
        lengths = np.empty(n, np.int64)
        offsets = np.empty(n, np.int64)
        owners: list[Any] = []
        for i, request in enumerate(requests):
            is_read = isinstance(request, ReadRequest)
            if not is_read and not isinstance(request, WriteRequest):
                raise InvalidArgumentError(f"not an I/O request: {type(request).__name__}")
            ref = as_buffer(request.buffer)
            if is_read and not ref.writable:
                raise InvalidArgumentError(f"request {i}: read into a read-only buffer")
            ops[i] = Op.READ if is_read else Op.WRITE
            addresses[i] = ref.address
            lengths[i] = ref.size_bytes
            offsets[i] = request.offset_bytes
            owners.append(ref.owner)
        batch = cls(ops, [r.file for r in requests], addresses, lengths, offsets, owners)
        batch.validate()
        return batch

    @classmethod
    def for_one_buffer(
        cls,
        op: Op,
        file: FileHandle,
        buffer: Any,
        file_offsets: np.ndarray,
        lengths: np.ndarray,
        buffer_offsets: np.ndarray | None,
    ) -> IOBatch:
        """Many requests on one file, each into (or from) a slice of one buffer; vectorised."""
        ref: BufferRef = as_buffer(buffer)
        if op == Op.READ and not ref.writable:
            raise InvalidArgumentError("read into a read-only buffer")
        file_offsets = np.asarray(file_offsets, dtype=np.int64).reshape(-1)
        n = len(file_offsets)
        lengths = np.broadcast_to(np.asarray(lengths, dtype=np.int64), (n,)).copy()
        if buffer_offsets is None:
            buffer_offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        buffer_offsets = np.asarray(buffer_offsets, dtype=np.int64).reshape(-1)
        if len(buffer_offsets) != n:
            raise InvalidArgumentError("buffer_offsets and file_offsets differ in length")
        if n and (buffer_offsets.min() < 0 or (buffer_offsets + lengths).max() > ref.size_bytes):
            raise InvalidArgumentError(
                f"a request runs past the end of the {ref.size_bytes}-byte buffer"
            )
        addresses = buffer_offsets.astype(np.uint64) + np.uint64(ref.address)
        ops = np.full(n, op, np.uint8)
        batch = cls(ops, [file] * n, addresses, lengths, file_offsets.copy(), [ref.owner])
        batch.validate()
        return batch

    @classmethod
    def for_sync(cls, file: FileHandle, datasync: bool) -> IOBatch:
        op = Op.FDATASYNC if datasync else Op.FSYNC
        zeros = np.zeros(1, np.int64)
        return cls(np.full(1, op, np.uint8), [file], np.zeros(1, np.uint64), zeros, zeros, [])

    def validate(self) -> None:
        """Reject bad requests before any is issued (so a batch fails whole, not half-done)."""
        n = len(self)
        if not n:
            return
        if self.offsets.min() < 0:
            raise InvalidArgumentError(f"negative file offset {int(self.offsets.min())}")
        if self.lengths.min() < 0:
            raise InvalidArgumentError("negative length")
        if self.lengths.max() > 0x7FFFF000:
            raise InvalidArgumentError("a single request may move at most 2 GiB - 4 KiB")
        first = self.files[0]
        single_file = all(f is first for f in self.files)
        for file in (first,) if single_file else dict.fromkeys(self.files):
            if file.closed:
                raise EngineClosedError(f"file {file.path!r} is closed")
        writes = self.ops == Op.WRITE
        if writes.any():
            for i in np.flatnonzero(writes)[: 1 if single_file else None]:
                if not self.files[i].writable:
                    raise InvalidArgumentError(f"{self.files[i].path!r} was not opened for writing")
        self._check_alignment(single_file)

    def _check_alignment(self, single_file: bool) -> None:
        if single_file:
            align = self.files[0].alignment_bytes if self.files[0].direct else 0
            if not align:
                return
            masks = np.full(len(self), align - 1, np.int64)
        else:
            masks = np.array(
                [(f.alignment_bytes - 1) if f.direct else 0 for f in self.files], np.int64
            )
        addresses = self.addresses.astype(np.int64)
        bad = ((self.offsets | self.lengths | addresses) & masks) != 0
        bad &= self.ops <= Op.WRITE
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise AlignmentError(
                f"request {i} on O_DIRECT file {self.files[i].path!r}: offset {self.offsets[i]}, "
                f"length {self.lengths[i]} and buffer address {int(self.addresses[i]):#x} must "
                f"all be multiples of {self.files[i].alignment_bytes} bytes"
            )
