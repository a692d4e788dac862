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

from tiers.io.buffers import BufferRef, as_buffer
from tiers.io.errors import AlignmentError, EngineClosedError, InvalidArgumentError

if TYPE_CHECKING:
    from tiers.io.engine import FileHandle

__all__ = ["FDATASYNC", "FSYNC", "READ", "WRITE", "IOBatch", "Op", "ReadRequest", "WriteRequest"]


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


READ, WRITE, FSYNC, FDATASYNC = (int(op) for op in Op)  # plain ints for the hot path
_MAX_REQUEST_BYTES = 0x7FFFF000  # Linux moves at most this much in one read/write


class IOBatch:
    """Parallel arrays, one row per request: op, file, address, length, offset.

    ``op`` and ``file`` are the batch-wide op and file when every row shares them (the common
    case, which engines serve without per-row work), else -1 and None.
    """

    __slots__ = (
        "addresses",
        "base",
        "errors",
        "file",
        "file_counts",
        "files",
        "future",
        "lengths",
        "offsets",
        "op",
        "ops",
        "owners",
        "pending",
        "regular",
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
        op: int | None = None,
        file: FileHandle | None = None,
    ) -> None:
        self.ops = ops  # uint8[n], Op values
        self.files = files  # one per row; shared objects for a single-file batch
        self.addresses = addresses  # uint64[n]
        self.lengths = lengths  # int64[n]
        self.offsets = offsets  # int64[n], file offsets
        self.owners = owners  # keeps the caller's buffers alive while I/O is in flight
        if op is None:
            op = int(ops[0]) if len(ops) and (ops == ops[0]).all() else -1
        if file is None and files and all(f is files[0] for f in files):
            file = files[0]
        self.op = op
        self.file = file
        self.results = np.zeros(len(ops), dtype=np.int64)
        self.errors: dict[int, BaseException] = {}
        self.future: Any = None  # set by IOEngine.run: resolved when the batch is done
        self.file_counts: dict[Any, int] = {}  # requests per file, for draining on close
        self.pending = 0  # engine-private: requests not yet finished
        self.base: BufferRef | None = None  # the one buffer every row lies in, when known
        self.regular = False  # rows are equal slices packed back to back in ``base``

    def __len__(self) -> int:
        return len(self.ops)

    @classmethod
    def from_requests(cls, requests: list[ReadRequest | WriteRequest]) -> IOBatch:
        n = len(requests)
        if not n:
            raise InvalidArgumentError("an empty batch")
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
            ops[i] = READ if is_read else WRITE
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
        op: int,
        file: FileHandle,
        buffer: Any,
        file_offsets: np.ndarray,
        lengths: np.ndarray | int,
        buffer_offsets: np.ndarray | None,
    ) -> IOBatch:
        """Many requests on one file, each into (or from) a slice of one buffer; vectorised."""
        ref: BufferRef = as_buffer(buffer)
        if op == READ and not ref.writable:
            raise InvalidArgumentError("read into a read-only buffer")
        offsets = np.array(file_offsets, dtype=np.int64, copy=True).reshape(-1)
        n = len(offsets)
        if not n:
            raise InvalidArgumentError("an empty batch")
        regular = isinstance(lengths, int | np.integer) and buffer_offsets is None
        if regular:
            size = int(lengths)  # the common case: equal slices packed back to back
            if size < 0 or n * size > ref.size_bytes:
                raise InvalidArgumentError(
                    f"{n} requests of {size} bytes do not fit the {ref.size_bytes}-byte buffer"
                )
            lengths = np.full(n, size, np.int64)
            if size:
                end = ref.address + n * size
                addresses = np.arange(ref.address, end, size, dtype=np.uint64)
            else:
                addresses = np.full(n, ref.address, np.uint64)
        else:
            lengths = np.broadcast_to(np.asarray(lengths, dtype=np.int64), (n,)).copy()
            if buffer_offsets is None:
                buffer_offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
            buffer_offsets = np.asarray(buffer_offsets, dtype=np.int64).reshape(-1)
            if len(buffer_offsets) != n:
                raise InvalidArgumentError("buffer_offsets and file_offsets differ in length")
            if buffer_offsets.min() < 0 or (buffer_offsets + lengths).max() > ref.size_bytes:
                raise InvalidArgumentError(
                    f"a request runs past the end of the {ref.size_bytes}-byte buffer"
                )
            addresses = buffer_offsets.astype(np.uint64) + np.uint64(ref.address)
        ops = np.full(n, op, np.uint8)
        batch = cls(ops, [file] * n, addresses, lengths, offsets, [ref.owner], op, file)
        batch.base = ref
        batch.regular = regular
        batch.validate()
        return batch

    @classmethod
    def for_sync(cls, file: FileHandle, datasync: bool) -> IOBatch:
        op = FDATASYNC if datasync else FSYNC
        zeros = np.zeros(1, np.int64)
        return cls(
            np.full(1, op, np.uint8), [file], np.zeros(1, np.uint64), zeros, zeros, [], op, file
        )

    def validate(self) -> None:
        """Reject bad requests before any is issued (so a batch fails whole, not half-done)."""
        file = self.file
        if file is not None and self.op >= 0:  # the common case, with one reduction
            if file.closed:
                raise EngineClosedError(f"file {file.path!r} is closed")
            if self.op == WRITE and not file.writable:
                raise InvalidArgumentError(f"{file.path!r} was not opened for writing")
            merged = int(np.bitwise_or.reduce(self.offsets | self.lengths))
            if merged < 0:  # a negative offset or length sets the sign bit of the OR
                raise InvalidArgumentError("negative file offset or length")
            if not self.regular:
                self._check_limits()
            elif self.lengths[0] > _MAX_REQUEST_BYTES:
                raise InvalidArgumentError("a single request may move at most 2 GiB - 4 KiB")
            if file.direct and self.op <= WRITE:
                mask = file.alignment_bytes - 1
                # regular: address i is base + i * size, so base, size and offsets decide
                if not self.regular or (merged | int(self.addresses[0])) & mask:
                    self._check_alignment()
            return
        self._check_limits()
        files = (file,) if file is not None else tuple(dict.fromkeys(self.files))
        for f in files:
            if f.closed:
                raise EngineClosedError(f"file {f.path!r} is closed")
        for i in np.flatnonzero(self.ops == WRITE).tolist():
            if not self.files[i].writable:
                raise InvalidArgumentError(f"{self.files[i].path!r} was not opened for writing")
        if any(f.direct for f in files):
            self._check_alignment()

    def _check_limits(self) -> None:
        if self.offsets.min() < 0:
            raise InvalidArgumentError(f"negative file offset {int(self.offsets.min())}")
        if self.lengths.min() < 0:
            raise InvalidArgumentError("negative length")
        if self.lengths.max() > _MAX_REQUEST_BYTES:
            raise InvalidArgumentError("a single request may move at most 2 GiB - 4 KiB")

    def _check_alignment(self) -> None:
        if self.file is not None:
            mask = self.file.alignment_bytes - 1
            merged = np.bitwise_or.reduce(
                self.offsets | self.lengths | self.addresses.view(np.int64)
            )
            if not int(merged) & mask or self.op >= FSYNC:
                return
            masks: np.ndarray | int = mask
        else:
            masks = np.array(
                [(f.alignment_bytes - 1) if f.direct else 0 for f in self.files], np.int64
            )
        bad = ((self.offsets | self.lengths | self.addresses.view(np.int64)) & masks) != 0
        bad &= self.ops <= WRITE
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise AlignmentError(
                f"request {i} on O_DIRECT file {self.files[i].path!r}: offset {self.offsets[i]}, "
                f"length {self.lengths[i]} and buffer address {int(self.addresses[i]):#x} must "
                f"all be multiples of {self.files[i].alignment_bytes} bytes"
            )
