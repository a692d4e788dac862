"""read_bare: one ``NvmeTier.get`` of a whole bare record as the engine's own single read.

Why: gathered gets (tiers.nvme.reads) share one submission but also one completion: the batch
settles when its last read lands, so every task that joined it resumes at once, runs its
DRAM hits, and misses again at once; the loop thread then idles for the device's round trip
while all of them wait, and pays a gathering task, staging offsets, an ``IOBatch`` and its
checks (~220 us of CPU per gathered batch here) on top. On an engine that gathers single
requests itself (``IOEngine.gathers_singles``: io_uring), a get of a bare record (a whole
number of pages, no header, no chunks: most objects of 4 KiB and up) is one ``read_into``
instead: the engine still shares the submission between the gets of one loop pass, but each
get resumes when its own read lands, so callers drift apart and their CPU work overlaps the
device's. Measured on the Zipf store load (8 tasks, 64 KiB objects): see benchmarks/RESULTS.md.

The record lands in a page-aligned staging buffer from the runtime's cache (O_DIRECT needs the
alignment; a caller's buffer rarely has it), is checked against its catalog entry with the same
``format.check_bare`` as every other read, and only then copied to the caller's destination.

Cancellation: a get cancelled while its read is in flight leaves ``into`` untouched (the copy
is after the await) and does not recycle the staging buffer: the engine's single-request record
keeps it alive until the kernel is done with it.

Concurrency: loop thread only. Invariants: the caller pinned the record's extent before calling
(no await in between since it read the catalog) and unpins it after; bytes reach ``out`` only
once the record passed its check.
"""

from __future__ import annotations

import numpy as np

from tiers.io import aligned_empty
from tiers.io.buffers import array_address
from tiers.io.engine import FileHandle
from tiers.io.errors import CorruptionError, StorageError
from tiers.nvme.checksums import crc32_at
from tiers.nvme.format import check_bare
from tiers.nvme.records import RecordIO

__all__ = ["read_bare"]


async def read_bare(
    records: RecordIO,
    file: FileHandle,
    offset_bytes: int,
    size_bytes: int,
    crc32: int,
    out: np.ndarray | None,
) -> np.ndarray:
    """The ``size_bytes`` payload of the bare record at ``offset_bytes`` of ``file``, checked
    against ``crc32``: copied into ``out`` (a writable uint8 view of at least that size, then
    returned) or, without one, as a fresh page-aligned array.

    Raises: CorruptionError (truncated, or a checksum that is not the entry's), StorageError
    (the device failed the read), EngineClosedError.
    """
    fresh = out is None
    stage = aligned_empty(size_bytes) if fresh else records.buffers.take(size_bytes)
    recycle = False
    try:
        # the cached buffer itself when its size class is exact (64 KiB, say): the engine finds
        # a recycled buffer's address by its id, a fresh slice's through numpy (~1 us)
        target = stage if stage.nbytes == size_bytes else stage[:size_bytes]
        moved = await records.engine.read_into(file, offset_bytes, target)
        recycle = not fresh  # the kernel is done with the buffer from here on
        records.bytes_read += moved
        payload = stage[:size_bytes]
        # the CRC at the address the engine already knows (``ctypes.data`` costs ~0.8 us);
        # anything but a whole record with the entry's CRC goes to check_bare, which raises
        if moved < size_bytes or crc32_at(payload, array_address(stage)) != crc32:
            payload = check_bare(
                stage[:moved], file.path, offset_bytes, expect_size_bytes=size_bytes,
                expect_crc32=crc32,
            )  # fmt: skip
        if out is None:
            return payload
        out[:size_bytes] = payload
        return out
    except (CorruptionError, StorageError):
        recycle = not fresh
        raise
    finally:
        if recycle:
            records.buffers.give(stage)
