"""ArrowSource: random rows of an Arrow IPC *file*, each row read on its own through the I/O core.

An uncompressed Arrow IPC file stores every column of every record batch as plain buffers at
fixed file offsets. At construction the file is memory-mapped once and every record batch's
buffers are located (pyarrow's zero-copy reads point into the map; their addresses minus the
map's base are file offsets -- only the small metadata pages are touched). After that, a row is
pure arithmetic:

* fixed-width columns (integers, floats): ``width`` bytes at ``values + row * width``;
* strings / binary: the two offsets at ``offsets + row * 4`` (8 for large types), then the bytes.

A batch therefore costs two ``read_batch`` rounds (offsets and fixed values, then string bytes),
each issued together, and reads only the bytes of the rows asked for. Nulls are honoured (one
validity byte per row and column that has any). Compressed IPC files, dictionary-encoded and
nested columns are refused at construction with a SourceFormatError saying so.

Concurrency: ``read`` may run concurrently with itself on the engine's loop.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from dataload.errors import SampleError, SampleReadError, SourceFormatError
from dataload.slabs import SlabPool
from dataload.source import FileSource, SampleBatch
from tiers.io import FileHandle, InvalidArgumentError, IOEngine, StorageError, map_os_errors

__all__ = ["ArrowSource"]


def _kind(arrow_type: pa.DataType) -> tuple[str, int]:
    """("fixed", width) | ("var", offset width) | ("", 0) for unsupported types."""
    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type):
        return "fixed", arrow_type.bit_width // 8
    if pa.types.is_string(arrow_type) or pa.types.is_binary(arrow_type):
        return "var", 4
    if pa.types.is_large_string(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "var", 8
    return "", 0


class ArrowSource(FileSource):
    """Rows of the Arrow IPC file ``path`` (``columns``, default all) as ``{column: value}``."""

    def __init__(self, path: str | os.PathLike[str], columns: list[str] | None = None) -> None:
        self.path = self.name = os.fspath(path)
        with map_os_errors(self.path):
            self._size_bytes = os.stat(self.path).st_size
        try:
            with pa.memory_map(self.path) as mapped:
                reader = pa.ipc.open_file(mapped)
                self.schema = reader.schema
                base = mapped.read_buffer(1).address if self._size_bytes else 0
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
                self.columns = list(columns) if columns is not None else self.schema.names
                self._check_columns()
                self._locate(batches, base)
        except pa.ArrowException as exc:
            raise SourceFormatError(self.name, f"not an Arrow IPC file: {exc}") from exc
        self._engine: IOEngine | None = None
        self._file: FileHandle | None = None

    def _check_columns(self) -> None:
        names = self.schema.names
        missing = sorted(set(self.columns) - set(names))
        if missing:
            raise InvalidArgumentError(f"{self.name}: no columns {missing}; it has {names}")
        for name in self.columns:
            if not _kind(self.schema.field(name).type)[0]:
                raise SourceFormatError(
                    self.name,
                    f"column {name!r} of type {self.schema.field(name).type} is not "
                    "supported (numbers, strings and binary only)",
                )

    def _locate(self, batches: list[pa.RecordBatch], base: int) -> None:
        """File offsets of each column's buffers per record batch (-1: no validity buffer)."""
        rows = [b.num_rows for b in batches]
        self._first_rows = np.concatenate(([0], np.cumsum(rows))).astype(np.int64)
        self._buffers: dict[str, np.ndarray] = {}
        for name in self.columns:
            table = np.full((len(batches), 3), -1, np.int64)  # validity, values/offsets, data
            for b, batch in enumerate(batches):
                array = batch.column(name)
                for slot, buffer in enumerate(array.buffers()[:3]):
                    if buffer is None or (slot == 0 and array.null_count == 0):
                        continue
                    offset = buffer.address - base
                    if not 0 <= offset <= self._size_bytes - buffer.size:
                        raise SourceFormatError(
                            self.name,
                            "compressed Arrow IPC is not supported (write it with "
                            "compression=None)",
                        )
                    table[b, slot] = offset
                if array.offset:
                    raise SourceFormatError(self.name, "sliced arrays in IPC are not supported")
            self._buffers[name] = table

    def __len__(self) -> int:
        return int(self._first_rows[-1])

    async def read(self, indices: np.ndarray, slabs: SlabPool) -> SampleBatch:
        indices = self.check_indices(indices)
        self_bytes: list[int] = []
        try:
            columns = await self._read_rows(indices, slabs, self_bytes)
        except StorageError as exc:  # the reads of a batch fail together: report every sample
            errors: dict[int, SampleError] = {}
            for position, index in enumerate(indices.tolist()):
                errors[position] = SampleReadError(self.name, index, str(exc), exc.errno)
                errors[position].__cause__ = exc
            columns = {name: [None] * len(indices) for name in self.columns}
            return SampleBatch(indices, columns=columns, errors=errors)
        return SampleBatch(indices, columns=columns, bytes_read=sum(self_bytes))

    async def _read_rows(self, indices: np.ndarray, slabs: SlabPool, nbytes: list[int]) -> dict:
        batch_of = np.searchsorted(self._first_rows, indices, side="right") - 1
        rows = indices - self._first_rows[batch_of]
        # round 1: fixed values, string offset pairs, validity bytes -- one submission
        plan: list[tuple[str, str, int, int]] = []
        offsets: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        for name in self.columns:
            kind, width = _kind(self.schema.field(name).type)
            table = self._buffers[name][batch_of]
            size = 2 * width if kind == "var" else width
            plan.append((name, kind, width, len(offsets)))
            offsets.append(table[:, 1] + rows * width)
            lengths.append(np.full(len(rows), size, np.int64))
            valid_at = np.where(table[:, 0] >= 0, table[:, 0] + rows // 8, -1)
            offsets.append(np.maximum(valid_at, 0))
            lengths.append(np.where(valid_at >= 0, 1, 0).astype(np.int64))
        first = await self._read(slabs, offsets, lengths, nbytes)
        columns, strings = {}, []
        for name, kind, width, k in plan:
            raw, valid = first[k], first[k + 1]
            has_bit = np.array([len(v) for v in valid]) > 0
            bits = np.array([v[0] if len(v) else 0 for v in valid], np.uint8)
            nulls = has_bit & (((bits >> (rows % 8).astype(np.uint8)) & 1) == 0)
            if kind == "fixed":
                dtype = self.schema.field(name).type.to_pandas_dtype()
                values = np.concatenate(raw).view(dtype) if raw else np.empty(0, dtype)
                columns[name] = values if not nulls.any() else _with_nulls(values, nulls)
            else:
                pairs = np.concatenate(raw).view(np.int32 if width == 4 else np.int64)
                strings.append((name, pairs.reshape(-1, 2), nulls))
        if strings:
            await self._read_strings(slabs, strings, batch_of, columns, nbytes)
        return columns

    async def _read_strings(
        self, slabs: SlabPool, strings: list, batch_of: np.ndarray, columns: dict, nbytes: list
    ) -> None:
        """Round 2: the bytes of every string/binary value, one submission for all columns."""
        offsets, lengths = [], []
        for name, pairs, _ in strings:
            offsets.append(self._buffers[name][batch_of][:, 2] + pairs[:, 0])
            lengths.append((pairs[:, 1] - pairs[:, 0]).astype(np.int64))
        values = await self._read(slabs, offsets, lengths, nbytes)
        for (name, _, nulls), raw in zip(strings, values, strict=True):
            is_text = pa.types.is_string(self.schema.field(name).type) or pa.types.is_large_string(
                self.schema.field(name).type
            )
            items = [bytes(v).decode() if is_text else bytes(v) for v in raw]
            columns[name] = [None if n else v for v, n in zip(items, nulls.tolist(), strict=True)]

    async def _read(
        self,
        slabs: SlabPool,
        offsets: list[np.ndarray],
        lengths: list[np.ndarray],
        nbytes: list[int],
    ) -> list[list[np.ndarray]]:
        """Read every (offset, length) group in one read_batch; per group, a list of views."""
        assert self._engine is not None and self._file is not None
        all_offsets, all_lengths = np.concatenate(offsets), np.concatenate(lengths)
        places = np.concatenate(([0], np.cumsum(all_lengths)[:-1])).astype(np.int64)
        data = slabs.acquire(max(int(all_lengths.sum()), 1))
        nbytes.append(int(all_lengths.sum()))
        nonempty = all_lengths > 0
        if nonempty.any():
            await self._engine.read_batch(
                self._file, data, all_offsets[nonempty], all_lengths[nonempty], places[nonempty]
            )
        spans = zip(places.tolist(), all_lengths.tolist(), strict=True)
        views = [data[p : p + n] for p, n in spans]
        out, at = [], 0
        for group in lengths:
            out.append(views[at : at + len(group)])
            at += len(group)
        return out


def _with_nulls(values: np.ndarray, nulls: np.ndarray) -> list:
    return [None if n else v for v, n in zip(values.tolist(), nulls.tolist(), strict=True)]
