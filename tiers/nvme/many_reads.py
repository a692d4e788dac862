"""ManyReads: NvmeTier.get_many, a batch of keys in one engine submission.

The common batch -- every key found without a chunk extension, destinations given, no byte
ranges -- goes to the compiled planner (tiers.nvme.whole_reads) straight from the catalog's
``rows``; any other batch, or one that planner declines, looks its entries up and goes to the
general planner (tiers.nvme.batch_reads), which plans, moves and checks them over arrays; a
batch with a damaged entry or a record above 1 GiB takes the path of single gets instead (a
RecordRead per key, RecordIO.read_many). Absent keys read None; errors are raised for the first
key, in order, that fails, as a get of each key in turn would raise them.

Concurrency: loop thread only. Invariants: every get_many is counted in flight by the tier's
OpGuard while its reads run; ``gets``, ``hits``, ``misses`` and ``corruptions`` count each key
(each failed batch) once, whichever path served it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

from tiers.io.errors import CorruptionError, InvalidArgumentError
from tiers.nvme.batch_reads import read_batch
from tiers.nvme.catalog import Catalog, CatalogEntry
from tiers.nvme.records import RecordIO, RecordRead
from tiers.nvme.space import ExtentSpace
from tiers.nvme.whole_reads import read_whole
from tiers.storage.op_guard import OpGuard
from tiers.storage.tier import ByteRange, check_key

__all__ = ["ManyReads"]

_MAX_KEY_BYTES = 511  # check_key's limit; an ASCII key has as many bytes as characters


class ManyReads:
    """Mixed into NvmeTier (through NvmeReads); the attributes below are the tier's."""

    counters: dict[str, int]
    _space: ExtentSpace | None
    _records: RecordIO | None
    _ops: OpGuard
    _damaged: set[str]
    _bare_from: int

    # the tier's methods this part calls (declared, not defined here)
    _open_catalog: Callable[[], Catalog]
    _plan: Callable[[str, Any, ByteRange | None], RecordRead | None]
    _execute: Callable[..., Any]

    async def get_many(
        self,
        keys: Iterable[str],
        into: list[Any] | None = None,
        *,
        byte_ranges: list[ByteRange | None] | None = None,
    ) -> list[Any]:
        """The objects of ``keys``, aligned with them (None where absent), read in one engine
        submission; ``into``: one destination per key (or None), as ``get``'s;
        ``byte_ranges``: one (offset, size) per key (or None: the whole object), as ``get``'s
        ``byte_range`` (of a chunked record only the chunks that cover it are read).

        Raises: as ``get``, for the first key that fails (nothing is returned then).
        """
        keys = list(keys)
        catalog = self._open_catalog()
        n = len(keys)
        if into is not None and byte_ranges is None and n and len(into) == n and not self._damaged:
            try:
                rows = list(map(catalog.rows.get, keys))
            except TypeError:  # an unhashable key: the general path names it
                rows = [None]
            if None not in rows:  # every key found, none chunked: maybe the common batch
                got = await self._read_rows(keys, cast(list[bytes], rows), into)
                if got is not None:
                    return got
        find = catalog.entries.get
        try:
            found = list(map(find, keys))
        except TypeError:  # an unhashable key: the check below names it
            found = [None] * n
        if into is not None and len(into) != n:
            self._check_keys(keys, found)
            raise InvalidArgumentError(f"{len(into)} destinations for {n} keys")
        if byte_ranges is not None and len(byte_ranges) != n:
            self._check_keys(keys, found)
            raise InvalidArgumentError(f"{len(byte_ranges)} byte ranges for {n} keys")
        counters = self.counters
        if None not in found and n and not self._damaged:  # every key found
            counters["gets"] += n
            return await self._read_found(keys, cast(list[CatalogEntry], found), into, byte_ranges)
        slots = [i for i, entry in enumerate(found) if entry is not None]
        if len(slots) < n:
            self._check_keys(keys, found)
        counters["gets"] += n
        counters["misses"] += n - len(slots)
        results: list[Any] = [None] * n
        if not slots:
            return results
        if self._damaged and any(keys[i] in self._damaged for i in slots):
            return await self._get_many_planned(keys, into, byte_ranges)  # errors in key order
        entries = cast(list[CatalogEntry], found)
        if len(slots) < n:
            keys = [keys[i] for i in slots]
            entries = [entries[i] for i in slots]
            into = None if into is None else [into[i] for i in slots]
            byte_ranges = None if byte_ranges is None else [byte_ranges[i] for i in slots]
        got = await self._read_found(keys, entries, into, byte_ranges)
        for slot, value in zip(slots, got, strict=True):
            results[slot] = value
        return results

    async def _read_rows(self, keys: list[str], rows: list[bytes], into: list[Any]) -> Any:
        """The common batch (tiers.nvme.whole_reads) of ``rows`` (every key's, found); None
        when it is not that batch (nothing was done or counted)."""
        space, records, ops = self._space, self._records, self._ops
        assert space is not None and records is not None
        ops.enter()
        try:
            got = await read_whole(records, space, keys, rows, into, self._bare_from)
        except CorruptionError:
            self.counters["gets"] += len(keys)
            self.counters["corruptions"] += 1
            raise
        finally:
            ops.leave()
        if got is not None:
            self.counters["gets"] += len(keys)
            self.counters["hits"] += len(keys)
        return got

    @staticmethod
    def _check_keys(keys: list[Any], found: list[CatalogEntry | None]) -> None:
        """Raise for the first bad key of ``keys``. A key the catalog holds passed check_key
        when it was put: only misses are checked, in key order (none of them is ever found)."""
        for key, entry in zip(keys, found, strict=True):
            if entry is None and (
                type(key) is not str or not key.isascii() or not 0 < len(key) <= _MAX_KEY_BYTES
            ):
                check_key(key)  # the common case above needs no encode

    async def _read_found(
        self,
        keys: list[str],
        entries: list[CatalogEntry],
        into: list[Any] | None,
        byte_ranges: list[ByteRange | None] | None,
    ) -> list[Any]:
        """Read and check the records of ``entries`` (every one found, none damaged) through
        the general planner; counts the hits."""
        space, records, ops = self._space, self._records, self._ops
        assert space is not None and records is not None
        ops.enter()
        try:
            got = await read_batch(
                records, space, keys, entries, into, self._bare_from, byte_ranges
            )
        except CorruptionError:
            self.counters["corruptions"] += 1
            raise
        finally:
            ops.leave()
        if got is None:  # a record above 1 GiB: RecordIO's path (which counts the hits)
            return await self._get_many_planned(keys, into, byte_ranges)
        self.counters["hits"] += len(keys)
        return got

    async def _get_many_planned(
        self, keys: list[str], into: list[Any] | None, byte_ranges: list[ByteRange | None] | None
    ) -> list[Any]:
        """get_many through a RecordRead per key (damaged entries, records above 1 GiB)."""
        outs = into if into is not None else [None] * len(keys)
        spans = byte_ranges if byte_ranges is not None else [None] * len(keys)
        results: list[Any] = [None] * len(keys)
        reads: list[RecordRead] = []
        slots: list[int] = []
        for slot, key in enumerate(keys):
            read = self._plan(key, outs[slot], spans[slot])
            if read is not None:
                reads.append(read)
                slots.append(slot)
        if reads:
            got = await self._execute(reads, count_corruption=True)
            for slot, value in zip(slots, got, strict=True):
                results[slot] = value if outs[slot] is None else outs[slot]
        return results
