"""check_batch: the checks of a batch read (tiers.nvme.batch_reads), after its I/O.

Every record is checked against its catalog entry before any of its bytes are returned: a bare
record by the CRC-32 of its payload, a header record by ``format.check_payload`` (magic, header
CRC, key hash, size, version, payload CRC). The common batch, whole pages only, is checked at
once: one CRC-32 call per record at the address the engine filled (no view, no buffer protocol),
compared with the entries' in one numpy step; the staged ones are then copied out. Any other
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
from tiers.nvme.format import check_payload, key_hash
from tiers.nvme.records import writable_view

__all__ = ["LandedBatch", "check_batch"]


@dataclass(frozen=True)
class LandedBatch:
    """A batch whose reads have landed. One row per key: ``table`` (file, offset, size, crc32,
    version of its entry), ``bare``, ``totals`` (record bytes), ``starts`` (its place in
    ``stage`` unless ``direct``: read in place), ``addresses`` (where the engine put it),
    ``moved`` (bytes read), ``files``; ``outs``: the caller's destinations, or None."""

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


def check_batch(batch: LandedBatch) -> list[Any]:
    """The objects of a landed batch: ``outs[i]``, filled, or where that is None a view of
    ``stage``. Raises CorruptionError for the first record, in key order, that fails its check.
    """
    table, totals, starts, stage = batch.table, batch.totals, batch.starts, batch.stage
    if batch.bare.all() and (batch.moved >= totals).all():
        crcs = crc32_many(batch.addresses, table[:, 2])
        if crcs is not None and bool((crcs == table[:, 3]).all()):
            results: list[Any] = (
                [None] * len(batch.keys) if batch.outs is None else list(batch.outs)
            )
            for i in np.flatnonzero(~batch.direct).tolist():
                start, size = int(starts[i]), int(totals[i])
                payload = stage[start : start + size]
                if results[i] is None:
                    results[i] = payload  # a view of the fresh buffer: no copy
                else:
                    writable_view(results[i], size)[:] = payload
            return results
    return _check_each(batch)


def _check_each(batch: LandedBatch) -> list[Any]:
    """The checks one record at a time: header records, and finding the first failure."""
    keys, files, stage, outs = batch.keys, batch.files, batch.stage, batch.outs
    results: list[Any] = []
    rows = zip(
        batch.table.tolist(), batch.bare.tolist(), batch.totals.tolist(), batch.starts.tolist(),
        batch.addresses.tolist(), batch.direct.tolist(), batch.moved.tolist(), strict=True,
    )  # fmt: skip
    for i, (entry, is_bare, total, start, address, is_direct, got) in enumerate(rows):
        _, offset, size, crc, version = entry
        if got < total:
            raise CorruptionError(
                f"record truncated: {got} of {total} bytes before end of file",
                files[i].path,
                offset,
            )
        out = None if outs is None else outs[i]
        view = None if out is None else writable_view(out, size)
        if is_bare:
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
        if view is None:
            results.append(payload)
            continue
        if not is_direct:
            view[:size] = payload
        results.append(out)
    return results
