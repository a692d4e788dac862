"""ParquetSource: random rows of a Parquet file, fetched a row group at a time through the I/O core.

What is read, honestly: Parquet pages are encoded and compressed, so a row cannot be read alone.
For a batch, the source maps each row to its row group, and for every row group not already in
its decoded cache it reads the byte span of the selected columns' chunks -- all row groups of
the batch in one ``read_batch``, completing in any order. pyarrow then decodes those bytes from
memory (a file object that serves only the fetched spans: any other read is a bug, not a silent
fallback). Decoded row groups stay in an LRU cache of ``cache_bytes``, so amplification is one
row group per miss. Small row groups (the writer's ``row_group_size``) make random access cheap.
A group is kept in the form batches are gathered from -- numpy for null-free numeric columns,
offsets and value bytes for null-free strings (a batch copies its rows' bytes into a slab,
:class:`~dataload.packed_strings.PackedStrings`, and a row becomes a ``str`` where the sample
is taken: in a worker process, so the text never crosses the pipe), Python
values otherwise, converted once per group -- so a batch costs one lookup (or one numpy gather
per group) per row, not a pyarrow ``take`` and ``to_pylist`` per group it touches.
A group that concurrently prefetched batches all miss is read and decoded once: the first
registers an in-flight future, the others wait for it.

Corrupt pages (page checksums are verified when the file has them) make every sample of that
row group in the batch a CorruptSampleError.

Concurrency: ``read`` runs on the engine's loop; decoding runs in the source's
:class:`~dataload.decode_pool.DecodePool` (one thread per CPU, up to ``_DECODE_CHUNKS`` jobs per
read, single-threaded pyarrow each: the first batches of an epoch miss most groups), earliest
read first, so the batch the consumer waits for is not slowed by the decoding of those
prefetched behind it; the cache and the in-flight map are only touched from the loop thread.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dataload.decode_pool import DecodePool, cpu_threads
from dataload.errors import CorruptSampleError, SampleError, SourceFormatError
from dataload.packed_strings import pack_rows
from dataload.parquet_parts import FetchedSpans, Strings
from dataload.slabs import SlabPool
from dataload.source import FileSource, SampleBatch
from tiers.io import FileHandle, InvalidArgumentError, IOEngine, StorageError, map_os_errors

__all__ = ["ParquetSource"]


class ParquetSource(FileSource):
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
        self._cache: OrderedDict[int, _Group] = OrderedDict()
        self._inflight: dict[int, asyncio.Future] = {}
        self._cache_bytes, self._cached_bytes = cache_bytes, 0
        self._engine: IOEngine | None = None
        self._file: FileHandle | None = None
        self._decoder: DecodePool | None = None
        self._reads = 0  # reads so far: a read's decode jobs go before those of later reads

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_decoder"] = None  # threads do not pickle; a worker never decodes
        return state

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
        self._cache, self._cached_bytes = OrderedDict(), 0  # per loader: no sharing across loops
        self._inflight = {}
        self._decoder = DecodePool(cpu_threads(), name="tierkit-decode-parquet")
        await super().open(engine)

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            if self._decoder is not None:
                self._decoder.close()
            self._decoder = None

    async def read(self, indices: np.ndarray, slabs: SlabPool) -> SampleBatch:
        indices = self.check_indices(indices)
        groups = np.searchsorted(self._first_rows, indices, side="right") - 1
        decoded, failed, bytes_read = await self._groups(sorted(set(groups.tolist())), slabs)
        errors: dict[int, SampleError] = {}
        if failed:
            for position, group in enumerate(groups.tolist()):
                if group in failed:
                    error = CorruptSampleError(self.name, int(indices[position]), failed[group])
                    errors[position] = error
        columns, data = self._gather(indices, groups, decoded, slabs)
        return SampleBatch(indices, data, columns=columns, errors=errors, bytes_read=bytes_read)

    def _gather(
        self, indices: np.ndarray, groups: np.ndarray, decoded: dict[int, _Group], slabs: SlabPool
    ) -> tuple[dict[str, object], np.ndarray | None]:
        """Columns in sampler order from the decoded groups, and the batch's bytes: one numpy
        gather per group for null-free numeric columns; null-free strings copied back to back
        into one slab (the batch's ``data``) as :class:`PackedStrings`, decoded where a sample
        is taken -- in a worker process, the bytes do not cross the pipe; one list lookup per
        row for the rest (the groups' values were converted to Python once, when decoded).
        Rows of failed groups are None (0 in numeric columns)."""
        n = len(indices)
        rows = indices - self._first_rows[groups]
        out: dict[str, object] = {}
        packed: dict[str, tuple[list[memoryview], bool]] = {}
        at_rows = list(zip(groups.tolist(), rows.tolist(), strict=True))
        whole = n > 0 and len(decoded) == len({g for g, _ in at_rows})  # no failed group
        for name in self.columns:
            parts = {g: group.columns[name] for g, group in decoded.items()}
            strings = {g: p for g, p in parts.items() if isinstance(p, Strings)}
            if whole and len(strings) == len(parts):
                pieces = [strings[g].piece(r) for g, r in at_rows]
                packed[name] = (pieces, next(iter(strings.values())).text)
                continue
            arrays = [p for p in parts.values() if isinstance(p, np.ndarray)]
            if parts and len(arrays) == len(parts):
                target = np.zeros(n, arrays[0].dtype)
                for g, values in parts.items():
                    positions = np.flatnonzero(groups == g)
                    target[positions] = values[rows[positions]]
                out[name] = target
                continue
            lookup = {g: p.tolist() if isinstance(p, np.ndarray) else p for g, p in parts.items()}
            column: list[object] = [None] * n
            for position, (g, r) in enumerate(at_rows):
                found = lookup.get(g)
                if found is not None:
                    column[position] = found[r]
            out[name] = column
        if not packed:
            return out, None
        data, columns = pack_rows(packed, slabs.acquire)
        out.update(columns)
        return {name: out[name] for name in self.columns}, data  # the columns' order

    async def _groups(
        self, groups: list[int], slabs: SlabPool
    ) -> tuple[dict[int, _Group], dict[int, str], int]:
        """Decoded ``groups`` (cached, being decoded for another batch, or read now), failures by
        group, bytes read. A group is read and decoded once even when concurrently prefetched
        batches need it: the first batch to miss it registers an in-flight future, the others
        wait on that (and read it themselves only if that batch was cancelled)."""
        decoded: dict[int, _Group] = {}
        failed: dict[int, str] = {}
        waiting: dict[int, asyncio.Future] = {}
        missing: list[int] = []
        for g in groups:
            if g in self._cache:
                self._cache.move_to_end(g)
                decoded[g] = self._cache[g]
            elif g in self._inflight:
                waiting[g] = self._inflight[g]
            else:
                missing.append(g)
        bytes_read = 0
        if missing:
            bytes_read = await self._load(missing, slabs, decoded, failed)
        if waiting:
            # wait() (not await fut) so that cancelling this batch leaves the owner's futures alone
            await asyncio.wait(list(waiting.values()))
            retry = []
            for g, future in waiting.items():
                if future.cancelled():
                    retry.append(g)
                elif isinstance(future.result(), str):
                    failed[g] = future.result()
                else:
                    decoded[g] = future.result()
            if retry:
                more, more_failed, more_bytes = await self._groups(retry, slabs)
                decoded.update(more)
                failed.update(more_failed)
                bytes_read += more_bytes
        return decoded, failed, bytes_read

    async def _load(
        self, missing: list[int], slabs: SlabPool, decoded: dict[int, _Group], failed: dict
    ) -> int:
        """Read and decode ``missing`` (registered in flight meanwhile); the bytes read."""
        loop = asyncio.get_running_loop()
        futures = {g: loop.create_future() for g in missing}
        self._inflight.update(futures)
        priority, self._reads = self._reads, self._reads + 1
        try:
            spans = self._spans[missing]
            lengths = spans[:, 1] - spans[:, 0]
            data = slabs.acquire(int(lengths.sum()))
            assert self._engine is not None and self._file is not None
            try:
                await self._engine.read_batch(self._file, data, spans[:, 0], lengths)
            except StorageError as exc:
                results: dict[int, _Group | str] = {g: f"read failed: {exc}" for g in missing}
            else:
                # Groups decode in parallel chunks (pyarrow releases the GIL while decoding), and
                # each chunk's groups are published as soon as it is done.
                assert self._decoder is not None
                step = -(-len(missing) // min(_DECODE_CHUNKS, len(missing)))
                chunks = [
                    range(i, min(i + step, len(missing))) for i in range(0, len(missing), step)
                ]
                tasks = [
                    asyncio.wrap_future(
                        self._decoder.submit(
                            priority,
                            self._decode,
                            [missing[i] for i in c],
                            spans[c.start : c.stop],
                            data,
                            int(lengths[: c.start].sum()),
                        )
                    )
                    for c in chunks
                ]
                try:
                    for done in asyncio.as_completed(tasks):
                        self._publish(await done, futures, decoded, failed)
                finally:
                    for task in tasks:
                        task.cancel()
                return int(lengths.sum())
            self._publish(results, futures, decoded, failed)
            return 0
        finally:
            for g, future in futures.items():
                if not future.done():
                    future.cancel()
                if self._inflight.get(g) is future:
                    del self._inflight[g]

    def _publish(
        self, results: dict, futures: dict[int, asyncio.Future], decoded: dict, failed: dict
    ) -> None:
        for g, result in results.items():
            if isinstance(result, str):
                failed[g] = result
            else:
                decoded[g] = result
                self._remember(g, result)
            futures[g].set_result(result)

    def _decode(self, groups: list[int], spans: np.ndarray, data: np.ndarray, place: int) -> dict:
        """Decode ``groups``, whose spans lie back to back in ``data`` from ``place`` on."""
        pieces = {}
        for start, end in spans.tolist():
            pieces[start] = memoryview(data[place : place + end - start])  # type: ignore[arg-type]
            place += end - start
        fetched = FetchedSpans(pieces, self.name, self._size_bytes)
        reader = pq.ParquetFile(fetched, metadata=self._meta, page_checksum_verification=True)
        out: dict[int, _Group | str] = {}
        for g in groups:
            try:
                table = reader.read_row_group(g, columns=self.columns, use_threads=False)
            except (pa.ArrowException, OSError) as exc:
                out[g] = f"row group {g} cannot be decoded: {exc}"
            else:
                out[g] = _Group(table, self.columns)
        return out

    def _remember(self, group: int, decoded: _Group) -> None:
        self._cache[group] = decoded
        self._cached_bytes += decoded.nbytes
        while self._cached_bytes > self._cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= old.nbytes


class _Group:
    """One decoded row group, column by column in the form batches are gathered from: a numpy
    array (numeric, no nulls), the Arrow buffers of a null-free string or binary column
    (:class:`Strings`: a row becomes a Python object only when a batch takes it), or a list of
    Python values (converted once per group, in the decode thread)."""

    __slots__ = ("columns", "nbytes")

    def __init__(self, table: pa.Table, names: list[str]) -> None:
        self.columns: dict[str, np.ndarray | list | Strings] = {}
        self.nbytes = table.nbytes
        for name in names:
            column = table.column(name)
            numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
            if numeric and column.null_count == 0:
                self.columns[name] = column.to_numpy()
            elif Strings.fits(column):
                self.columns[name] = Strings(column.combine_chunks())
                self.nbytes += _PY_INT_BYTES * len(column)
            else:
                self.columns[name] = column.to_pylist()
                self.nbytes += _PY_OBJECT_BYTES * len(column)


_DECODE_CHUNKS = 4  # decode threads per read: the first batches of an epoch miss most groups
_PY_OBJECT_BYTES = 64  # rough per-value cost of a Python object and its list slot
_PY_INT_BYTES = 40  # an offset kept as a Python int and its list slot
