"""RecordWriter: builds tierkit record files (the format in ``record_format.py``).

Writing is sequential and buffered through plain file I/O (it is not the loader's hot path);
``close`` writes the index, fsyncs, then writes the real header and fsyncs again, so a crash
leaves a file the reader refuses instead of a silently short one.

Concurrency: one writer per file, used from one thread.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from dataload.record_format import (
    FLAG_FIXED,
    HEADER_SIZE_BYTES,
    RecordHeader,
)
from tiers.io import EngineClosedError, InvalidArgumentError, map_os_errors

__all__ = ["RecordWriter", "write_records"]


class RecordWriter:
    """Append records, then ``close()`` (or use as a context manager).

    Args:
        path: the file to create (replaced if it exists).
        record_size_bytes: set for a fixed-size file; every record must then have this size.
        alignment_bytes: every record starts at a multiple of this (4096 lets readers use
            O_DIRECT when the record size is a multiple of 4096 too). Gaps are zero-filled.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        record_size_bytes: int | None = None,
        alignment_bytes: int = 1,
    ) -> None:
        if alignment_bytes <= 0 or alignment_bytes & (alignment_bytes - 1):
            raise InvalidArgumentError(f"alignment must be a power of two, got {alignment_bytes}")
        if record_size_bytes is not None and record_size_bytes <= 0:
            raise InvalidArgumentError(f"record size must be positive, got {record_size_bytes}")
        self.path = os.fspath(path)
        self.record_size_bytes = record_size_bytes
        self.alignment_bytes = alignment_bytes
        with map_os_errors(self.path):
            self._file = open(self.path, "wb")  # noqa: SIM115  (closed in close())
        self._data_offset = _align_up(HEADER_SIZE_BYTES, alignment_bytes)
        self._file.write(bytes(self._data_offset))  # header placeholder: bad magic until close
        self._position = self._data_offset
        self._offsets: list[int] = []
        self._sizes: list[int] = []
        self._crcs: list[int] = []

    def __len__(self) -> int:
        return len(self._offsets)

    def write(self, record: Any) -> int:
        """Append one record (bytes-like or a C-contiguous numpy array); returns its index."""
        if self._file.closed:
            raise EngineClosedError(f"writer of {self.path!r} is closed")
        if isinstance(record, np.ndarray):
            record = np.ascontiguousarray(record)
        data = memoryview(record)
        size = data.nbytes
        if self.record_size_bytes is not None and size != self.record_size_bytes:
            raise InvalidArgumentError(
                f"record {len(self)} has {size} bytes; this file's records have "
                f"{self.record_size_bytes}"
            )
        start = _align_up(self._position, self.alignment_bytes)
        with map_os_errors(self.path, start):
            if start > self._position:
                self._file.write(bytes(start - self._position))
            self._file.write(data.cast("B") if size else b"")
        self._offsets.append(start)
        self._sizes.append(size)
        self._crcs.append(zlib.crc32(data))
        self._position = start + size
        return len(self._offsets) - 1

    def close(self) -> None:
        """Write the index and the header, fsync, close. Idempotent."""
        if self._file.closed:
            return
        fixed = self.record_size_bytes is not None
        index = b"" if fixed else _i64(self._offsets) + _i64(self._sizes)
        index += np.asarray(self._crcs, "<u4").tobytes()
        index += zlib.crc32(index).to_bytes(4, "little")
        index_offset = _align_up(self._position, 8)
        header = RecordHeader(
            flags=FLAG_FIXED if fixed else 0,
            alignment_bytes=self.alignment_bytes,
            count=len(self._offsets),
            record_size_bytes=self.record_size_bytes or 0,
            data_offset=self._data_offset,
            index_offset=index_offset,
            index_size_bytes=len(index),
        )
        with map_os_errors(self.path), self._file as file:
            file.write(bytes(index_offset - self._position) + index)
            file.flush()
            os.fsync(file.fileno())
            file.seek(0)
            file.write(header.pack())
            file.flush()
            os.fsync(file.fileno())

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_records(
    path: str | os.PathLike[str],
    records: Iterable[Any],
    record_size_bytes: int | None = None,
    alignment_bytes: int = 1,
) -> Path:
    """Write every record of ``records`` to a new record file at ``path``; returns the path."""
    with RecordWriter(path, record_size_bytes, alignment_bytes) as writer:
        for record in records:
            writer.write(record)
    return Path(path)


def _align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def _i64(values: list[int]) -> bytes:
    return np.asarray(values, "<i8").tobytes()
