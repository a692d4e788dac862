"""Pieces of ParquetSource: the file object pyarrow decodes fetched spans through, and the
lazily decoded form of a row group's string and binary columns.

Concurrency: a ``FetchedSpans`` belongs to one decode call (one thread); a ``Strings`` is
read-only after construction, so any thread may index it.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa

__all__ = ["FetchedSpans", "Strings"]


class Strings:
    """A null-free string/binary column's offsets (Python ints) and value bytes (a view of the
    Arrow buffer). Converting a whole group with ``to_pylist`` costs ~0.13 us a row and happens
    on the first batch's critical path, while an epoch's first batches touch every group but
    take a few rows of each; ``self[row]`` decodes just that row, equal to ``to_pylist()[row]``."""

    __slots__ = ("_data", "_offsets", "_text")

    @staticmethod
    def fits(column: pa.ChunkedArray) -> bool:
        kind = column.type
        text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
        raw = pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
        return (text or raw) and column.null_count == 0

    def __init__(self, array: pa.Array) -> None:
        kind = array.type
        self._text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
        wide = pa.types.is_large_string(kind) or pa.types.is_large_binary(kind)
        _, offsets, data = array.buffers()
        width = np.int64 if wide else np.int32
        start = array.offset
        assert offsets is not None
        self._offsets = np.frombuffer(offsets, width)[start : start + len(array) + 1].tolist()
        self._data = memoryview(data).cast("B") if data is not None else memoryview(b"")

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, row: int) -> str | bytes:
        offsets = self._offsets
        piece = self._data[offsets[row] : offsets[row + 1]]
        return str(piece, "utf-8") if self._text else bytes(piece)

    def tolist(self) -> list[str | bytes]:
        return [self[row] for row in range(len(self))]

    @property
    def text(self) -> bool:
        return self._text

    def piece(self, row: int) -> memoryview:
        """Row ``row``'s value bytes, undecoded (a view of the Arrow buffer)."""
        return self._data[self._offsets[row] : self._offsets[row + 1]]


class FetchedSpans(io.RawIOBase):
    """A read-only file that holds only the spans fetched through the engine."""

    def __init__(self, pieces: dict[int, memoryview], name: str, size_bytes: int) -> None:
        self._pieces = sorted(pieces.items())
        self._position = 0
        self._name = name
        self._size_bytes = size_bytes

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        ends = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size_bytes}
        base = ends[whence]
        self._position = base + offset
        return self._position

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        want = len(buffer)
        for start, piece in self._pieces:
            if start <= self._position and self._position + want <= start + len(piece):
                at = self._position - start
                buffer[:want] = piece[at : at + want]
                self._position += want
                return want
        raise OSError(f"{self._name}: read of {want} bytes at {self._position} was not prefetched")
