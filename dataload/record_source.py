"""Record sources: raw fixed-size record files and tierkit record files (``record_format.py``).

Both know every sample's file offset and size up front (arithmetic, or the record file's
index), so a batch is one ``read_batch`` into one slab: all requests issued together, completing
in any order, sample ``j`` landing at a known place in the slab (so the batch is in sampler
order without any sorting).

With ``direct=True`` the file is opened O_DIRECT: no page-cache copy and no cache pollution for
datasets larger than RAM. Records that are not 4 KiB-aligned are then read as the aligned span
around them (more bytes, the same single submission).

Concurrency: ``read`` may run concurrently with itself on the engine's loop; nothing here is
mutated after ``open``.
"""

from __future__ import annotations

import os
import zlib

import numpy as np

from dataload.errors import CorruptSampleError, SourceFormatError
from dataload.record_format import HEADER_SIZE_BYTES, RecordHeader, parse_index
from dataload.slabs import SlabPool
from dataload.source import FileSource, SampleBatch, sample_errors_from
from tiers.io import (
    PAGE_SIZE_BYTES,
    FileHandle,
    InvalidArgumentError,
    IOEngine,
    StorageError,
    map_os_errors,
)

__all__ = ["FixedSizeSource", "RecordFileSource"]

_ALIGN = PAGE_SIZE_BYTES


class _OffsetSource(FileSource):
    """Shared reading logic; subclasses fill ``_offsets``/``_sizes`` or the fixed geometry."""

    def __init__(self, path: str | os.PathLike[str], direct: bool) -> None:
        self.path = self.name = os.fspath(path)
        self.direct = direct
        self._file: FileHandle | None = None
        self._engine: IOEngine | None = None
        self._base = 0  # fixed geometry: offset of record 0 and distance between records
        self._stride = 0
        self._offsets: np.ndarray | None = None  # variable geometry
        self._sizes: np.ndarray | None = None
        self._crcs: np.ndarray | None = None  # set when checksums are to be verified

    def _locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray | int]:
        if self._offsets is None:
            return self._base + indices * self._stride, int(self.sample_size_bytes or 0)
        return self._offsets[indices], self._sizes[indices]  # type: ignore[index]

    async def read(self, indices: np.ndarray, slabs: SlabPool) -> SampleBatch:
        indices = self.check_indices(indices)
        if self._file is None or self._engine is None:
            raise InvalidArgumentError(f"{self.name}: source is not open")
        offsets, sizes = self._locate(indices)
        if isinstance(sizes, int) and (not self.direct or not (offsets[0] | sizes) % _ALIGN):
            return await self._read_regular(indices, offsets, sizes, slabs)
        sizes = np.broadcast_to(np.asarray(sizes, np.int64), indices.shape)
        starts_in_file = offsets
        if self.direct:  # widen to the aligned span around each record
            starts_in_file = offsets // _ALIGN * _ALIGN
            lengths = -(-(offsets + sizes) // _ALIGN) * _ALIGN - starts_in_file
        else:
            lengths = sizes
        places = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        data = slabs.acquire(int(lengths.sum()))
        got, failure = await self._issue(data, starts_in_file, lengths, places)
        batch = SampleBatch(indices, data, places + (offsets - starts_in_file), sizes.copy())
        needed = offsets + sizes - starts_in_file  # an aligned span may run past EOF harmlessly
        batch.errors = sample_errors_from(failure, self.name, indices, needed, got)
        batch.bytes_read = int(got.sum())
        self._verify(batch)
        return batch

    async def _read_regular(
        self, indices: np.ndarray, offsets: np.ndarray, size: int, slabs: SlabPool
    ) -> SampleBatch:
        """The hot path: equal records packed back to back, one vectorised submission."""
        n = len(indices)
        data = slabs.acquire(n * size)
        got, failure = await self._issue(data, offsets, size, None)
        places = np.arange(0, n * size, size, dtype=np.int64) if size else np.zeros(n, np.int64)
        batch = SampleBatch(indices, data, places, np.full(n, size, np.int64), packed=True)
        if failure is not None or got.min() < size:
            expected = np.full(n, size, np.int64)
            batch.errors = sample_errors_from(failure, self.name, indices, expected, got)
        batch.bytes_read = int(got.sum())
        self._verify(batch)
        return batch

    async def _issue(
        self,
        data: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray | int,
        places: np.ndarray | None,
    ) -> tuple[np.ndarray, StorageError | None]:
        """Bytes read per request (-1 where it failed), and the batch's error if any."""
        assert self._engine is not None and self._file is not None
        try:
            got = await self._engine.read_batch(self._file, data, offsets, lengths, places)
        except StorageError as exc:
            results = exc.batch_results or []
            return np.array([r if isinstance(r, int) else -1 for r in results], np.int64), exc
        return got, None

    def _verify(self, batch: SampleBatch) -> None:
        if self._crcs is None:
            return
        for position in range(len(batch)):
            if position in batch.errors:
                continue
            index = int(batch.indices[position])
            if zlib.crc32(batch.sample(position)) != int(self._crcs[index]):
                batch.errors[position] = CorruptSampleError(self.name, index, "checksum mismatch")


class FixedSizeSource(_OffsetSource):
    """A headerless file of equal records: record ``i`` at ``header_bytes + i * record_size``.

    Args:
        record_size_bytes: the size of every record.
        header_bytes: bytes to skip at the start of the file.
        dtype, shape: how the default collate views one record (default: uint8 bytes).
        direct: O_DIRECT reads (best when offsets and size are multiples of 4 KiB).
    Raises:
        FileMissingError: no such file. SourceFormatError: the size is not a whole number of
        records (a truncated file).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        record_size_bytes: int,
        *,
        header_bytes: int = 0,
        dtype: np.typing.DTypeLike = np.uint8,
        shape: tuple[int, ...] | None = None,
        direct: bool = False,
    ) -> None:
        super().__init__(path, direct)
        if record_size_bytes <= 0 or header_bytes < 0:
            raise InvalidArgumentError("record size must be positive and the header >= 0")
        with map_os_errors(self.path):
            size_bytes = os.stat(self.path).st_size
        self._count, extra = divmod(size_bytes - header_bytes, record_size_bytes)
        if extra or self._count < 0:
            raise SourceFormatError(
                self.name,
                f"truncated: {size_bytes} bytes is not {header_bytes} + a whole number of "
                f"{record_size_bytes}-byte records",
            )
        self._base, self._stride = header_bytes, record_size_bytes
        self.sample_size_bytes = record_size_bytes
        self.sample_dtype = np.dtype(dtype)
        self.sample_shape = shape or (record_size_bytes // self.sample_dtype.itemsize,)
        if int(np.prod(self.sample_shape)) * self.sample_dtype.itemsize != record_size_bytes:
            raise InvalidArgumentError(f"shape {shape} of {dtype} is not {record_size_bytes} bytes")

    def __len__(self) -> int:
        return self._count


class RecordFileSource(_OffsetSource):
    """A tierkit record file (fixed or variable records), written by :class:`RecordWriter`.

    ``verify=True`` checks each record's CRC-32 after reading (~10 us per 32 KiB).
    ``dtype``/``shape`` apply to fixed-size files only (as in :class:`FixedSizeSource`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        verify: bool = False,
        direct: bool = False,
        dtype: np.typing.DTypeLike = np.uint8,
        shape: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__(path, direct)
        with map_os_errors(self.path), open(self.path, "rb") as file:
            size_bytes = os.fstat(file.fileno()).st_size
            header = RecordHeader.unpack(file.read(HEADER_SIZE_BYTES), self.name, size_bytes)
            file.seek(header.index_offset)
            raw_index = file.read(header.index_size_bytes)
        offsets, sizes, crcs = parse_index(raw_index, header, self.name)
        self.header = header
        self._crcs = crcs if verify else None
        if header.fixed:
            self._base, self._stride = header.data_offset, header.stride_bytes
            self.sample_size_bytes = header.record_size_bytes
            self.sample_dtype = np.dtype(dtype)
            self.sample_shape = shape or (header.record_size_bytes // self.sample_dtype.itemsize,)
        else:
            self._offsets, self._sizes = offsets, sizes

    def __len__(self) -> int:
        return self.header.count
