"""check_batch: the checks of a batch read (tiers.nvme.batch_reads), after its I/O.

Every record is checked against its catalog entry before any of its bytes are returned: a bare
record by the CRC-32 of its payload, a header record by ``format.check_payload`` (magic, header
CRC, key hash, size, version, payload CRC), a chunked record by the CRC-32 of each chunk of the
window read (tiers.nvme.chunks). The common batch, bare and chunked records only, is checked at
once: one compiled call sums every record and every chunk at the address the engine filled (no
view, no buffer protocol), compared with the entries' in one numpy step; the staged ones are
then copied out (the asked range of each). Any other
batch, and one where anything fails, is checked a record at a time, in key order, so the error
raised is the first key's, as a get of each key in turn would raise it.

Concurrency: pure work over buffers the caller owns until it returns; runs on the loop thread or
on the runtime's CPU executor (large batches). Invariants: returns only when every record of the
batch passed its check; a staged record is copied to its destination only once it passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tiers.io.engine import FileHandle
from tiers.io.errors import CorruptionError
from tiers.nvme.checksums import crc32_at, crc32_many
from tiers.nvme.chunks import check_window, chunk_rows
from tiers.nvme.format import check_payload, key_hash
from tiers.nvme.records import writable_view

__all__ = ["LandedBatch", "check_batch"]


@dataclass(frozen=True)
class LandedBatch:
    """A batch whose reads have landed. One row per key: ``table`` (file, offset, size, crc32,
    version of its entry), ``bare``, ``totals`` (record bytes), ``starts`` (its place in
    ``stage`` unless ``direct``: read in place), ``addresses`` (where the engine put it),
    ``moved`` (bytes read), ``files``; ``outs``: the caller's destinations, or None;
    ``chunked`` and its ``extensions`` (empty bytes where not chunked), the ``first_chunks``
    and ``window_starts`` (in the record) of chunked rows' windows; the asked range of each
    row (``range_offsets`` in the payload, ``range_bytes``)."""

    keys: list[str]
    table: np.ndarray
    bare: np.ndarray
    totals: np.ndarray
    starts: np.ndarray
    addresses: np.ndarray
    direct: np.ndarray
    moved: np.ndarray
    files: list[FileHandle]
    stage: np.ndarray
    outs: list[Any] | None
    chunked: np.ndarray
    extensions: list[bytes]
    first_chunks: np.ndarray
    window_starts: np.ndarray
    range_offsets: np.ndarray
    range_bytes: np.ndarray


def check_batch(batch: LandedBatch) -> list[Any]:
    """The objects (or asked ranges) of a landed batch: ``outs[i]``, filled, or where that is
    None a view of ``stage``. Raises CorruptionError for the first record, in key order, that
    fails its check.
    """
    totals, starts, stage = batch.totals, batch.starts, batch.stage
    if (batch.bare | batch.chunked).all() and (batch.moved >= totals).all():
        sums = _sum_rows(batch)
        crcs = crc32_many(sums[0], sums[1])
        if crcs is not None and bool((crcs == sums[2]).all()):
            results: list[Any] = (
                [None] * len(batch.keys) if batch.outs is None else list(batch.outs)
            )
            at = batch.range_offsets - batch.window_starts  # the range's place in the window
            for i in np.flatnonzero(~batch.direct).tolist():
                start, size = int(starts[i] + at[i]), int(batch.range_bytes[i])
                payload = stage[start : start + size]
                if results[i] is None:
                    results[i] = payload  # a view of the fresh buffer: no copy
                else:
                    writable_view(results[i], size)[:] = payload
            return results
    return _check_each(batch)


def _sum_rows(batch: LandedBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(addresses, sizes, expected CRC-32s) of every bare record and every chunk read."""
    table = batch.table
    if not batch.chunked.any():
        return batch.addresses, table[:, 2], table[:, 3]
    parts = []
    for i in range(len(batch.keys)):
        if batch.chunked[i]:
            offsets, sizes, expected = chunk_rows(
                int(table[i, 2]), batch.extensions[i], int(batch.first_chunks[i]),
                int(batch.totals[i]),
            )  # fmt: skip
            parts.append((offsets + batch.addresses[i], sizes, expected))
        else:
            parts.append((batch.addresses[i : i + 1], table[i : i + 1, 2], table[i : i + 1, 3]))
    addresses, sizes, expected = (np.concatenate(column) for column in zip(*parts, strict=True))
    return addresses, sizes, expected


def _check_each(batch: LandedBatch) -> list[Any]:
    """The checks one record at a time: header records, and finding the first failure."""
    keys, files, stage, outs = batch.keys, batch.files, batch.stage, batch.outs
    results: list[Any] = []
    rows = zip(
        batch.table.tolist(), batch.bare.tolist(), batch.totals.tolist(), batch.starts.tolist(),
        batch.addresses.tolist(), batch.direct.tolist(), batch.moved.tolist(),
        batch.range_offsets.tolist(), batch.range_bytes.tolist(), strict=True,
    )  # fmt: skip
    for i, (entry, is_bare, total, start, address, is_direct, got, at, length) in enumerate(rows):
        _, offset, size, crc, version = entry
        if got < total:
            raise CorruptionError(
                f"record truncated: {got} of {total} bytes before end of file",
                files[i].path,
                offset,
            )
        out = None if outs is None else outs[i]
        view = None if out is None else writable_view(out, length)
        if batch.chunked[i]:
            payload = view if is_direct else stage[start : start + total]  # the window
            assert payload is not None
            first = int(batch.first_chunks[i])
            check_window(payload, size, batch.extensions[i], first, files[i].path, offset)
            at -= int(batch.window_starts[i])
        elif is_bare:
            payload = view if is_direct else stage[start : start + size]
            assert payload is not None
            if crc32_at(payload, address) != crc:
                raise CorruptionError(
                    "payload checksum mismatch (bare record)", files[i].path, offset
                )
        else:
            payload = check_payload(
                stage[start : start + total],
                files[i].path,
                offset,
                expect_key_hash=key_hash(keys[i]),
                expect_size_bytes=size,
                expect_version=version,
                expect_crc32=crc,
            )
        part = payload[at : at + length]
        if view is None:
            results.append(part)
            continue
        if not is_direct:
            view[:length] = part
        results.append(out)
    return results
