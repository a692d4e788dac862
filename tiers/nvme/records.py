"""RecordIO: moves object records (tiers.nvme.format) between memory and extent files.

A write stages the payload as a record in an aligned bounce buffer, writes it in one request
(O_DIRECT needs aligned memory, offsets and lengths, which a caller's buffer seldom is), and
fdatasyncs the file, so the record is durable when :meth:`RecordIO.write` returns. A read moves
the whole record into a bounce buffer in one request, checks it against its catalog entry, and
copies the asked range into the destination. Records above 1 GiB move as 1 GiB requests of one
batch (the kernel moves at most ~2 GiB per call). Copies and checksums of payloads of 1 MiB and
more run in a worker thread (numpy and zlib release the GIL) so the loop keeps serving others.

Concurrency: loop thread only. Each request holds its own bounce buffer. A read cancelled while
its I/O is in flight drops its buffer instead of recycling it: the engine may still be filling it.
Invariants: no byte reaches the caller before its record passed every check of
``nvme_format.check_payload``; a bounce buffer is in the cache or held by one request, not both.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from tiers.io.bounce import BounceBuffers
from tiers.io.buffers import aligned_empty, as_buffer
from tiers.io.engine import FileHandle, IOEngine
from tiers.io.errors import CorruptionError, InvalidArgumentError, StorageError
from tiers.nvme.catalog import CatalogEntry
from tiers.nvme.format import check_payload, record_bytes, write_record

__all__ = ["RecordIO", "writable_view"]

_CHUNK_BYTES = 1 << 30  # one request moves at most this
_OFFLOAD_BYTES = 1 << 20  # copies and CRCs of larger payloads run off the loop thread
_EMPTY = np.empty(0, np.uint8)


class RecordIO:
    """Record reads and writes through ``engine``, staged in reused bounce buffers."""

    def __init__(self, engine: IOEngine) -> None:
        self.engine = engine
        self.buffers = BounceBuffers()
        self.bytes_read = 0
        self.bytes_written = 0

    async def write(
        self, file: FileHandle, offset: int, payload: np.ndarray, version: int, key_hash: int
    ) -> int:
        """Write the record of ``payload`` at ``offset`` and fdatasync; returns the payload CRC.

        Must not be cancelled (callers shield it): the buffer goes back to the cache at the end.
        """
        total = record_bytes(payload.nbytes)
        buffer = self.buffers.take(total)
        try:
            record = buffer[:total]
            if payload.nbytes >= _OFFLOAD_BYTES:
                crc = await asyncio.to_thread(write_record, record, payload, version, key_hash)
            else:
                crc = write_record(record, payload, version, key_hash)
            await self._transfer(True, file, offset, record)
        finally:
            self.buffers.give(buffer)
        self.bytes_written += total
        await self.engine.fsync(file, datasync=True)
        return crc

    async def read(
        self,
        file: FileHandle,
        offset: int,
        entry: CatalogEntry,
        key_hash: int,
        range_offset: int,
        range_bytes: int,
        out: np.ndarray | None,
    ) -> np.ndarray:
        """Read the record at ``offset``, check it against ``entry``, and return ``range_bytes``
        payload bytes from ``range_offset``: copied into ``out`` (then returned), or, when
        ``out`` is None, as a new array.

        A new array is a view of the record buffer itself when it covers most of the record,
        which saves a copy and the page faults of a second fresh buffer.
        Raises: CorruptionError (truncated, or not the record ``entry`` describes),
        StorageError (the device failed the read).
        """
        total = record_bytes(entry.size_bytes)
        in_place = out is None and 2 * range_bytes >= total
        buffer = aligned_empty(total) if in_place else self.buffers.take(total)
        recycle = False
        try:
            record = buffer[:total]
            got = await self._transfer(False, file, offset, record)
            self.bytes_read += got
            if got < total:
                raise CorruptionError(
                    f"record truncated: {got} of {total} bytes before end of file",
                    file.path,
                    offset,
                )
            args = (record, file.path, offset, entry, key_hash)
            if entry.size_bytes >= _OFFLOAD_BYTES:
                payload = await asyncio.to_thread(_checked_payload, *args)
            else:
                payload = _checked_payload(*args)
            recycle = not in_place
        except (CorruptionError, StorageError):
            recycle = not in_place  # the engine finished with the buffer before this was raised
            raise
        finally:
            if recycle:
                self.buffers.give(buffer)
        part = payload[range_offset : range_offset + range_bytes]
        if in_place:
            return part
        result = np.empty(range_bytes, np.uint8) if out is None else out
        result[:] = part  # below 1 MiB or a small part of a big object: cheap
        return result

    async def _transfer(self, write: bool, file: FileHandle, offset: int, record: Any) -> int:
        """Move a whole record in one request (or 1 GiB requests of one batch); bytes moved."""
        n = record.nbytes
        if n <= _CHUNK_BYTES:
            if write:
                return await self.engine.write_from(file, offset, record)
            return await self.engine.read_into(file, offset, record)
        starts = np.arange(0, n, _CHUNK_BYTES, dtype=np.int64)
        lengths = np.minimum(_CHUNK_BYTES, n - starts)
        batch = self.engine.write_batch if write else self.engine.read_batch
        return int((await batch(file, record, offset + starts, lengths, starts)).sum())


def writable_view(into: Any, size_bytes: int) -> np.ndarray:
    """The first ``size_bytes`` of a caller's buffer as a uint8 array, checked before any I/O.

    Raises: InvalidArgumentError (read-only, too small, not a contiguous host buffer).
    """
    ref = as_buffer(into)
    if not ref.writable:
        raise InvalidArgumentError("`into` is read-only")
    if ref.size_bytes < size_bytes:
        raise InvalidArgumentError(f"`into` holds {ref.size_bytes} bytes; {size_bytes} needed")
    if not size_bytes:
        return _EMPTY
    return np.frombuffer(ref.memoryview(0, size_bytes), np.uint8)


def _checked_payload(
    record: np.ndarray, path: str, offset: int, entry: CatalogEntry, key_hash: int
) -> np.ndarray:
    return check_payload(
        record,
        path,
        offset,
        expect_key_hash=key_hash,
        expect_size_bytes=entry.size_bytes,
        expect_version=entry.version,
        expect_crc32=entry.crc32,
    )
