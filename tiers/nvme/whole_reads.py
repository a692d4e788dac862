"""read_whole: get_many's common batch (whole bare records into page-aligned numpy arrays).

Why: a 4 KiB get_many of 32 keys spent ~10 us of CPU per object planning, validating and
checking over small numpy calls, more than the device takes for the read. The common batch --
every key found, no byte ranges, every record bare (a whole number of pages, no header, no
chunks) in one extent file, every destination a writable C-contiguous page-aligned numpy array
with room for its record and sharing no byte with another -- needs none of the general
planner's work (tiers.nvme.batch_reads): no staging, no copies, no per-row kinds, no alignment
check by the engine. Two compiled calls serve it: ``plan_loop.plan_whole`` writes the engine
rows (and rejects any other batch), ``crc_loop.check_rows`` checks every record where it landed.

Anything else returns None before any side effect, and the caller plans the batch the general
way, which serves it or raises the same typed error as before (a bad destination: before any
I/O). A record that fails its check (or came short) is checked again by ``check_batch`` so the
CorruptionError raised is the first key's, exactly as the general path raises it; the
destinations then hold unchecked bytes (a failed get leaves them unspecified, as before).

Cancellation and pins: as in batch_reads (the read is shielded while it writes the callers'
arrays; the extents are pinned from planning until the I/O ends).

Concurrency: loop thread only. Invariants: a returned list holds only destinations whose record
passed its CRC-32 check against the catalog entry.
"""

from __future__ import annotations

import ctypes
import logging
import operator
import os
from typing import Any

import numpy as np

from tiers.io.batch import READ, IOBatch
from tiers.nvme.batch_checks import LandedBatch, check_batch
from tiers.nvme.batch_reads import _to_the_end
from tiers.nvme.checksums import row_checker
from tiers.nvme.format import RECORD_ALIGNMENT_BYTES
from tiers.nvme.records import RecordIO
from tiers.nvme.space import FILE_STRIDE_BYTES, ExtentSpace

__all__ = ["read_whole"]

log = logging.getLogger("tierkit.tiers")
_MAX_RECORD_BYTES = 1 << 30  # as batch_reads: larger records take RecordIO's path
_NBYTES = operator.attrgetter("nbytes")
_address_of = ctypes.addressof
_char_over: Any = ctypes.c_char.from_buffer  # raises unless writable and C-contiguous
_NO_STAGE = np.empty(0, np.uint8)
_ARRAYS = {np.ndarray}
_loops: list[Any] = []  # [(plan_whole, check_rows)] or [None], once per process
# "0": every batch takes the general planner (read per call: an in-process A/B flips it)
DISABLE_ENV = "TIERKIT_GET_MANY_COMPILED"
_environ = os.environ


def _compiled() -> Any:
    if not _loops:
        try:
            check = row_checker()
            if check is None:
                raise RuntimeError("no compiled CRC-32 loop (libdeflate or numba missing)")
            from tiers.nvme.plan_loop import plan_whole

            _loops.append((plan_whole, check))
        except Exception as exc:  # the general planner does the same work, slower
            log.info("get_many's compiled planner unavailable: %r", exc)
            _loops.append(None)
    return _loops[0]


async def read_whole(
    records: RecordIO,
    space: ExtentSpace,
    keys: list[str],
    rows: list[bytes],
    outs: list[Any],
    bare_from: int,
) -> list[Any] | None:
    """``outs``, each filled with its key's object and checked, or None when the batch is not
    the common one (nothing was done: plan it the general way). ``rows``: each key's
    ``Catalog.rows`` entry (so none has a chunk extension).

    Raises: CorruptionError (the first key, in order, whose record fails its check),
    StorageError, EngineClosedError.
    """
    loops = _loops[0] if _loops else _compiled()
    m = len(rows)
    if loops is None or not set(map(type, outs)) <= _ARRAYS or _environ.get(DISABLE_ENV) == "0":
        return None  # other buffers (a bytearray, a tensor): the general planner's checks
    try:  # the addresses, and with them that each is a writable C-contiguous buffer
        dest_addresses = np.fromiter(map(_address_of, map(_char_over, outs)), np.int64, m)
        dest_bytes = np.fromiter(map(_NBYTES, outs), np.int64, m)
    except (TypeError, ValueError):  # read-only, not C-contiguous, empty
        return None
    plan_whole, check_rows = loops
    flat = np.frombuffer(b"".join(rows), np.int64)
    offsets, lengths, crcs, pins = np.empty((4, m), np.int64)
    file_index = plan_whole(
        flat, dest_addresses, dest_bytes, bare_from, RECORD_ALIGNMENT_BYTES, _MAX_RECORD_BYTES,
        FILE_STRIDE_BYTES, offsets, lengths, crcs, pins,
    )  # fmt: skip
    if file_index < 0:
        return None
    file = space.files.get(file_index)
    if file is None or file.closed or RECORD_ALIGNMENT_BYTES % file.alignment_bytes:
        return None  # the general path raises (closed) or checks (an odd alignment)
    batch = IOBatch(
        np.full(m, READ, np.uint8),
        [file] * m,
        dest_addresses.view(np.uint64),
        lengths,
        offsets,
        [outs],
        READ,
        file,
    )  # rows proven page-aligned, in bounds and positive above: validate() would pass them
    token = space.pin_batch(pins)
    try:
        await _to_the_end(records.engine.run(batch))
    finally:
        space.unpin_batch(token)
    moved = batch.results
    records.bytes_read += int(moved.sum())
    if check_rows(dest_addresses, lengths, crcs, moved) < 0:
        return list(outs)
    return _first_failure(keys, flat.reshape(m, 5), dest_addresses, moved, batch, outs)


def _first_failure(
    keys: list[str],
    table: np.ndarray,
    addresses: np.ndarray,
    moved: np.ndarray,
    batch: IOBatch,
    outs: list[Any],
) -> list[Any]:
    """Check the batch the general way, which raises the first key's CorruptionError."""
    m = len(keys)
    zeros, every = np.zeros(m, np.int64), np.ones(m, bool)
    sizes = table[:, 2].copy()
    landed = LandedBatch(
        keys, table, every, sizes, zeros, addresses, every, moved, batch.files, _NO_STAGE, outs,
        ~every, [b""] * m, zeros, zeros, zeros, sizes,
    )  # fmt: skip
    return check_batch(landed)  # raises: some row failed above
