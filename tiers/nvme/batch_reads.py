"""read_batch: get_many's records planned, moved and checked over arrays, in one submission.

Why: planning a RecordRead per key, then a staging copy and a checked view per record, cost
~25 us of Python per object, more than a 4 KiB read takes the device. Here the catalog entries
of a batch become one int64 table; record kinds and sizes, staging offsets and the engine rows
are computed by numpy, the rows go to the engine as one IOBatch (one extent file: the engine's
compiled path), and each record costs one CRC-32 call and, when staged, one copy.

With ``byte_ranges`` each key may ask for a range: a bare or header record is still read and
checked whole, a chunked record (tiers.nvme.chunks) only in the window of chunks that covers the
range, so a layer of a 64 MiB block moves as one request of its own size.

A whole-page (bare) object, or a chunked record's range that is exactly its window, whose
destination is a page-aligned numpy array is read straight into it: no staging and no copy. Its
bytes are checked there, after the read; a failed check raises as before, but the destination
then holds the unchecked bytes (a failed get leaves its destination's contents unspecified). A
header record, and a bare one with another destination (unaligned, or overlapping another
destination of the batch), is staged in one aligned buffer and copied out after its check.

Cancellation: while the caller's buffers take part, a cancelled ``read_batch`` waits for the
engine to finish the batch before the CancelledError goes on (``_to_the_end``), so no
destination is written after the call ended; a staging-only read is dropped at once (its buffer
is not recycled: the engine may still fill it).

Concurrency: loop thread only; the checks of large batches run on the runtime's CPU executor.
Invariants: every record is checked against its catalog entry before its bytes are returned;
each extent read is pinned (ExtentSpace) from planning until its I/O ends.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import itertools
import operator
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiers.io.batch import READ, IOBatch
from tiers.io.buffers import aligned_empty, array_address
from tiers.io.engine import FileHandle
from tiers.io.errors import CorruptionError, EngineClosedError, StorageError
from tiers.nvme.batch_checks import LandedBatch, check_batch
from tiers.nvme.catalog import CatalogEntry
from tiers.nvme.chunks import window
from tiers.nvme.format import HEADER_BYTES, RECORD_ALIGNMENT_BYTES
from tiers.nvme.records import RecordIO, writable_view
from tiers.nvme.space import FILE_STRIDE_BYTES, ExtentSpace
from tiers.storage.tier import ByteRange, resolve_range

__all__ = ["read_batch"]

_MAX_RECORD_BYTES = 1 << 30  # larger records take RecordIO's path (requests of 1 GiB)
# Checks of more bytes than this run on the CPU executor. A batch's CRCs take one compiled call
# (~27 GB/s): 32 x 64 KiB checked inline is ~80 us, and handing it to a thread cost the 64 KiB
# get_many a quarter of its rate; 16 MiB keeps the loop's pauses under ~1 ms.
_OFFLOAD_BYTES = 16 << 20
_PAGE_MASK = RECORD_ALIGNMENT_BYTES - 1
_BASE = operator.itemgetter(0, 1, 2, 3, 4)  # an entry without its chunk extension
_NO_STAGE = np.empty(0, np.uint8)  # the staging buffer of a batch read wholly in place
_address_of = ctypes.addressof
# a writable array's address in 0.3 us, a third of __array_interface__'s cost
_char_over: Callable[[Any], Any] = ctypes.c_char.from_buffer


async def read_batch(
    records: RecordIO,
    space: ExtentSpace,
    keys: list[str],
    entries: list[CatalogEntry],
    outs: list[Any] | None,
    bare_from: int,
    byte_ranges: list[ByteRange | None] | None = None,
) -> list[Any] | None:
    """The objects (or ``byte_ranges``) of ``entries`` (of ``keys``), each in its ``outs``
    destination (returned as given) or, without ``outs``, as a view of a fresh buffer; None
    when a record is too large for this path (the caller takes RecordIO's).

    Raises: InvalidArgumentError (a bad range, then a bad destination: before any I/O),
    CorruptionError, StorageError, EngineClosedError; for the first key, in order, that fails.
    """
    m = len(entries)
    # file, offset, size, crc32, version per row; fromiter: a third of np.array's time
    table = np.fromiter(
        itertools.chain.from_iterable(map(_BASE, entries)), np.int64, 5 * m
    ).reshape(m, 5)
    sizes = table[:, 2]
    extensions = [entry[5] for entry in entries]
    chunked = np.fromiter(map(len, extensions), np.int64, m) > 0
    bare = ~chunked & (table[:, 4] >= bare_from) & (sizes > 0) & ((sizes & _PAGE_MASK) == 0)
    totals = np.where(bare, sizes, (sizes + (HEADER_BYTES + _PAGE_MASK)) & ~_PAGE_MASK)
    if int(totals.max()) > _MAX_RECORD_BYTES:
        return None
    spans = _Spans.whole(sizes, bare)
    if byte_ranges is not None or chunked.any():
        spans = _Spans.plan(sizes, bare, chunked, extensions, byte_ranges, totals)
    # where each row's bytes go: its destination (read in place) or, for now 0, staged
    addresses = np.zeros(m, np.int64)
    if outs is not None:
        addresses = _destinations(outs, spans.range_bytes, spans.in_place)
    direct = addresses != 0
    staged_totals = np.where(direct, 0, totals)
    starts = np.cumsum(staged_totals) - staged_totals
    staged_bytes = int(staged_totals.sum())
    # results are views of a fresh buffer where a key has no destination, else one from the cache
    fresh = outs is None or any(out is None for out in outs)
    stage = _NO_STAGE
    if fresh:
        stage = aligned_empty(max(staged_bytes, 1))
    elif staged_bytes:
        stage = records.buffers.take(staged_bytes)
    if staged_bytes:
        addresses = np.where(direct, addresses, starts + _address_of(_char_over(stage)))
    files, file = _files(space, table[:, 0])
    batch = IOBatch(
        np.full(m, READ, np.uint8),
        files,
        addresses.astype(np.uint64),
        totals,
        np.ascontiguousarray(table[:, 1] + spans.window_starts),
        [stage, outs],
        READ,
        file,
    )
    batch.validate()
    pinned = space.pin_batch(table[:, 0] * FILE_STRIDE_BYTES + table[:, 1])
    recycle = False
    try:
        try:
            await _run(records, batch, shielded=bool(direct.any()))
        finally:
            space.unpin_batch(pinned)
        records.bytes_read += int(batch.results.sum())
        landed = LandedBatch(
            keys, table, bare, totals, starts, addresses, direct, batch.results, files, stage, outs,
            chunked, extensions, spans.first_chunks, spans.window_starts, spans.range_offsets,
            spans.range_bytes,
        )  # fmt: skip
        check = functools.partial(check_batch, landed)
        if int(totals.sum()) >= _OFFLOAD_BYTES:
            results = await records.run_cpu(check)
        else:
            results = check()
        recycle = not fresh
        return results
    except (CorruptionError, StorageError):
        recycle = not fresh  # the engine and the checks are done with the buffer
        raise
    finally:
        if recycle and stage is not _NO_STAGE:  # not after a cancellation: still in use
            records.buffers.give(stage)


@dataclass(frozen=True, slots=True)
class _Spans:
    """Per row: the asked range (``range_offsets``, ``range_bytes``), the window read
    (``window_starts`` in the record, the lengths are ``totals``), a chunked record's first
    chunk read, and whether the read may land in the destination itself (``in_place``)."""

    range_offsets: np.ndarray
    range_bytes: np.ndarray
    window_starts: np.ndarray
    first_chunks: np.ndarray
    in_place: np.ndarray

    @classmethod
    def whole(cls, sizes: np.ndarray, bare: np.ndarray) -> _Spans:
        zeros = np.zeros(len(sizes), np.int64)
        return cls(zeros, sizes, zeros, zeros, bare)

    @classmethod
    def plan(
        cls,
        sizes: np.ndarray,
        bare: np.ndarray,
        chunked: np.ndarray,
        extensions: list[bytes],
        byte_ranges: list[ByteRange | None] | None,
        totals: np.ndarray,
    ) -> _Spans:
        """Resolve the ranges (raising for the first bad one) and each chunked row's window;
        sets a chunked row's ``totals`` to its window's length."""
        m = len(sizes)
        offsets, lengths = np.zeros(m, np.int64), sizes.copy()
        if byte_ranges is not None:
            for i, (size, span) in enumerate(zip(sizes.tolist(), byte_ranges, strict=True)):
                if span is not None:
                    offsets[i], lengths[i] = resolve_range(size, span)
        starts, firsts = np.zeros(m, np.int64), np.zeros(m, np.int64)
        for i in np.flatnonzero(chunked).tolist():
            size, log2 = int(sizes[i]), extensions[i][2]
            firsts[i], starts[i], totals[i] = window(size, log2, int(offsets[i]), int(lengths[i]))
        # in place: the read is exactly the asked bytes (a whole bare record, an exact window)
        exact = (offsets == starts) & (lengths == totals)
        in_place = (bare & (lengths == sizes)) | (chunked & exact)
        return cls(offsets, lengths, starts, firsts, in_place)


def _destinations(outs: list[Any], sizes: np.ndarray, in_place: np.ndarray) -> np.ndarray:
    """Check each destination (room for its row's ``sizes`` bytes), raising for the first bad
    one (before any I/O); returns per row the address of a page-aligned numpy destination
    that takes its row's read itself (``in_place`` rows only), else 0 (staged); all 0 when
    any destination read in place shares a byte with another destination."""
    sizes_l = sizes.tolist()
    found = [0] * len(outs)
    views: dict[int, np.ndarray] = {}  # the staged destinations, checked
    for i, (out, whole) in enumerate(zip(outs, in_place.tolist(), strict=True)):
        if out is None:
            continue  # a view of the staging buffer
        if whole and type(out) is np.ndarray and out.nbytes >= sizes_l[i]:
            flags = out.flags
            if flags.c_contiguous and flags.writeable:
                found[i] = array_address(out)  # remembered for views: ~0.2 us, not ~0.5
            else:
                writable_view(out, sizes_l[i])  # the error a get raises
        else:
            views[i] = writable_view(out, sizes_l[i])
    spans = np.array(found, np.int64)
    addresses = spans.copy()
    addresses[(addresses & _PAGE_MASK) != 0] = 0
    direct = addresses != 0
    if not direct.any():
        return addresses
    # a staged destination is written by the checks, after every read landed: one sharing
    # bytes with a destination read in place would overwrite that record before its check
    for i, view in views.items():
        spans[i] = view.__array_interface__["data"][0] if view.nbytes else 0
    taken = (spans != 0) & (sizes > 0)
    if _overlap(spans[taken], sizes[taken]):
        addresses[:] = 0  # destinations share bytes: staged, copied in key order as before
    return addresses


def _overlap(addresses: np.ndarray, sizes: np.ndarray) -> bool:
    if int(sizes.min()) == int(sizes.max()):  # the common batch: one sort, no gathers
        ordered = np.sort(addresses)
        return bool((np.diff(ordered) < int(sizes[0])).any())
    order = np.argsort(addresses, kind="stable")
    ends = addresses[order] + sizes[order]
    return bool((ends[:-1] > addresses[order][1:]).any())


def _files(space: ExtentSpace, indexes: np.ndarray) -> tuple[list[FileHandle], FileHandle | None]:
    """Each row's extent file, and the batch's one file when all rows share it."""
    first = int(indexes[0])
    if int(indexes.min()) == int(indexes.max()):
        file = space.files.get(first)
        if file is None:
            raise EngineClosedError("the tier's extent files are closed")
        return [file] * len(indexes), file
    files = [space.files.get(index) for index in indexes.tolist()]
    if any(f is None for f in files):
        raise EngineClosedError("the tier's extent files are closed")
    return files, None  # type: ignore[return-value]


async def _run(records: RecordIO, batch: IOBatch, *, shielded: bool) -> None:
    """Run ``batch``; ``shielded``: it writes callers' buffers, so a cancelled caller waits
    until the engine is done with them before the cancellation goes on."""
    if not shielded:
        await records.engine.run(batch)
        return
    await _to_the_end(records.engine.run(batch))


async def _to_the_end(coro: Coroutine[Any, Any, None]) -> None:
    """Await ``coro``; a cancellation meanwhile is held until it ends, then goes on.

    Not asyncio.shield: that runs ``coro`` in a task of its own, whose extra loop passes (the
    submission one pass later, each wake-up one more) cost a third of get_many's 4 KiB rate.
    Here the caller's task drives ``coro`` itself (asyncio's await protocol: a coroutine
    suspends by yielding the future it waits for) and waits for that future through a waiter
    of its own, which a cancellation cancels instead.
    """
    loop = asyncio.get_running_loop()
    cancelled = False
    while True:
        try:
            awaited = coro.send(None)
        except StopIteration:
            break
        if awaited is None:  # a bare yield (asyncio.sleep(0)): just a pass of the loop
            awaited = loop.create_future()
            awaited.set_result(None)
        awaited._asyncio_future_blocking = False  # as a task does with what it is handed
        while not awaited.done():
            waiter = loop.create_future()
            awaited.add_done_callback(functools.partial(_wake, waiter))
            try:
                await waiter
            except asyncio.CancelledError:
                cancelled = True
    if cancelled:
        raise asyncio.CancelledError


def _wake(waiter: asyncio.Future[None], _: object) -> None:
    if not waiter.done():
        waiter.set_result(None)
