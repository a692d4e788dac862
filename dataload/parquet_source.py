"""ParquetSource: random rows of a Parquet file, fetched a row group at a time through the I/O core.

What is read, honestly: Parquet pages are encoded and compressed, so a row cannot be read alone.
For a batch, the source maps each row to its row group, and for every row group not already in
its decoded cache it reads the byte span of the selected columns' chunks -- all row groups of
the batch in one ``read_batch``, completing in any order. pyarrow then decodes those bytes from
memory (a file object that serves only the fetched spans: any other read is a bug, not a silent
fallback). Decoded row groups stay in an LRU cache of ``cache_bytes``, so amplification is one
row group per miss. Small row groups (the writer's ``row_group_size``) make random access cheap.

Corrupt pages (page checksums are verified when the file has them) make every sample of that
row group in the batch a CorruptSampleError.

Concurrency: ``read`` runs on the engine's loop; decoding runs in a worker thread
(``asyncio.to_thread``); the cache is only touched from the loop thread.
"""

from __future__ import annotations

import asyncio
import io
import os
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dataload.errors import CorruptSampleError, SampleError, SourceFormatError
from dataload.slabs import SlabPool
from dataload.source import SampleBatch, Source
from tiers.engine import FileHandle, IOEngine
from tiers.errors import InvalidArgumentError, StorageError, map_os_errors

__all__ = ["ParquetSource"]


class ParquetSource(Source):
    """Rows of ``path`` (the ``columns`` given, default all) as ``{column: value}`` samples."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        columns: list[str] | None = None,
        *,
        cache_bytes: int = 256 << 20,
    ) -> None:
        self.path = self.name = os.fspath(path)
        with map_os_errors(self.path):
            self._size_bytes = os.stat(self.path).st_size
        try:
            self._meta = pq.ParquetFile(self.path).metadata
        except (pa.ArrowException, OSError) as exc:
            raise SourceFormatError(self.name, f"not a readable Parquet file: {exc}") from exc
        names = self._meta.schema.to_arrow_schema().names
        self.columns = list(columns) if columns is not None else names
        missing = sorted(set(self.columns) - set(names))
        if missing:
            raise InvalidArgumentError(f"{self.name}: no columns {missing}; it has {names}")
        self._first_rows, self._spans = self._layout()
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()
        self._cache_bytes, self._cached_bytes = cache_bytes, 0
        self._engine: IOEngine | None = None
        self._file: FileHandle | None = None

    def _layout(self) -> tuple[np.ndarray, np.ndarray]:
        """First row of each row group, and each group's [start, end) over the chosen columns."""
        meta, wanted = self._meta, set(self.columns)
        rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        spans = np.zeros((meta.num_row_groups, 2), np.int64)
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            chunks = [group.column(c) for c in range(group.num_columns)]
            chunks = [c for c in chunks if c.path_in_schema.split(".")[0] in wanted]
            starts = [
                c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
                for c in chunks
            ]
            ends = [s + c.total_compressed_size for s, c in zip(starts, chunks, strict=True)]
            spans[g] = min(starts), max(ends)
        return np.concatenate(([0], np.cumsum(rows))).astype(np.int64), spans

    def __len__(self) -> int:
        return int(self._first_rows[-1])

    async def open(self, engine: IOEngine) -> None:
        self._engine = engine
        self._cache, self._cached_bytes = OrderedDict(), 0  # per loader: no sharing across loops
        self._file = await engine.open(self.path)

    async def close(self) -> None:
        if self._file is not None and self._engine is not None and not self._engine.closed:
            await self._engine.close_file(self._file)
        self._file = None

    async def read(self, indices: np.ndarray, slabs: SlabPool) -> SampleBatch:
        indices = self.check_indices(indices)
        groups = np.searchsorted(self._first_rows, indices, side="right") - 1
        tables, failed, bytes_read = await self._groups(sorted(set(groups.tolist())), slabs)
        errors: dict[int, SampleError] = {}
        for position, group in enumerate(groups.tolist()):
            if group in failed:
                error = CorruptSampleError(self.name, int(indices[position]), failed[group])
                errors[position] = error
        ok = [g for g in dict.fromkeys(groups.tolist()) if g not in failed]
        columns = self._gather(indices, groups, ok, tables)
        return SampleBatch(indices, columns=columns, errors=errors, bytes_read=bytes_read)

    def _gather(
        self, indices: np.ndarray, groups: np.ndarray, ok: list[int], tables: dict[int, pa.Table]
    ) -> dict[str, object]:
        """Columns in sampler order, taken group by group (a take over many chunks would
        concatenate them); rows of failed groups are None (or 0 in numeric columns)."""
        n = len(indices)
        out: dict[str, object] = {name: [None] * n for name in self.columns}
        for g in ok:
            positions = np.flatnonzero(groups == g)
            picked = tables[g].take(pa.array(indices[positions] - self._first_rows[g]))
            for name in self.columns:
                column = picked.column(name)
                numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
                if numeric and column.null_count == 0:
                    target = out[name]
                    if isinstance(target, list):
                        target = out[name] = np.zeros(n, column.type.to_pandas_dtype())
                    target[positions] = column.to_numpy()
                else:
                    target = out[name]
                    if isinstance(target, np.ndarray):
                        target = out[name] = target.tolist()
                    for position, value in zip(positions.tolist(), column.to_pylist(), strict=True):
                        target[position] = value
        return out

    async def _groups(
        self, groups: list[int], slabs: SlabPool
    ) -> tuple[dict[int, pa.Table], dict[int, str], int]:
        """Decoded tables of ``groups`` (cached or read now), failures by group, bytes read."""
        tables = {g: self._cache[g] for g in groups if g in self._cache}
        for g in tables:
            self._cache.move_to_end(g)
        missing = [g for g in groups if g not in tables]
        failed: dict[int, str] = {}
        if not missing:
            return tables, failed, 0
        spans = self._spans[missing]
        lengths = spans[:, 1] - spans[:, 0]
        data = slabs.acquire(int(lengths.sum()))
        assert self._engine is not None and self._file is not None
        try:
            await self._engine.read_batch(self._file, data, spans[:, 0], lengths)
        except StorageError as exc:
            return tables, {g: f"read failed: {exc}" for g in missing}, 0
        decoded = await asyncio.to_thread(self._decode, missing, spans, data)
        for g, table in decoded.items():
            if isinstance(table, str):
                failed[g] = table
            else:
                tables[g] = table
                self._remember(g, table)
        return tables, failed, int(lengths.sum())

    def _decode(self, groups: list[int], spans: np.ndarray, data: np.ndarray) -> dict:
        pieces, place = {}, 0
        for start, end in spans.tolist():
            pieces[start] = memoryview(data[place : place + end - start])
            place += end - start
        fetched = _FetchedSpans(pieces, self.name, self._size_bytes)
        reader = pq.ParquetFile(fetched, metadata=self._meta, page_checksum_verification=True)
        out: dict[int, pa.Table | str] = {}
        for g in groups:
            try:
                out[g] = reader.read_row_group(g, columns=self.columns)
            except (pa.ArrowException, OSError) as exc:
                out[g] = f"row group {g} cannot be decoded: {exc}"
        return out

    def _remember(self, group: int, table: pa.Table) -> None:
        self._cache[group] = table
        self._cached_bytes += table.nbytes
        while self._cached_bytes > self._cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= old.nbytes


class _FetchedSpans(io.RawIOBase):
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

    def readinto(self, buffer: memoryview) -> int:
        want = len(buffer)
        for start, piece in self._pieces:
            if start <= self._position and self._position + want <= start + len(piece):
                at = self._position - start
                buffer[:want] = piece[at : at + want]
                self._position += want
                return want
        raise OSError(f"{self._name}: read of {want} bytes at {self._position} was not prefetched")
