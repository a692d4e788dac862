"""Source: a dataset addressable by sample index, read a whole batch at a time through the I/O core.

A source turns ``indices`` (int64, any order, repeats allowed) into a :class:`SampleBatch`. Byte
sources issue every read of the batch in one engine call into one buffer from the loader's
:class:`~dataload.slabs.SlabPool`; table sources (Arrow, Parquet) return decoded columns.

Lifecycle: ``await open(engine)`` once, ``await read(...)`` any number of times (concurrently),
``await close()``. All three run on the loop thread that owns ``engine``. A loader works on a
shallow copy of the source it is given, so ``open`` must (re)create all per-open state: one
source object can feed several loaders at once.
Errors: a failed sample is reported in ``SampleBatch.errors`` (position -> SampleError) and the
rest of the batch is still returned; an index out of range raises SampleIndexError at once.
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dataload.errors import (
    CorruptSampleError,
    SampleError,
    SampleIndexError,
    SampleReadError,
)
from dataload.slabs import SlabPool
from tiers.io import FileHandle, IOEngine, IORuntime, StorageError, default_runtime

__all__ = ["FileSource", "SampleBatch", "Source", "read_samples"]


@dataclass
class SampleBatch:
    """One batch as read: bytes spans in ``data`` (byte sources) or ``columns`` (table sources).

    Byte sources: sample ``j`` is ``data[starts[j] : starts[j] + sizes[j]]``.
    Table sources: ``columns`` maps a column name to a numpy array (numeric) or a list.
    """

    indices: np.ndarray
    data: np.ndarray | None = None
    starts: np.ndarray | None = None
    sizes: np.ndarray | None = None
    columns: dict[str, Any] | None = None
    errors: dict[int, SampleError] = field(default_factory=dict)
    bytes_read: int = 0
    packed: bool = False  # byte sources: sample j starts at j * sizes[0] (equal sizes, no gaps)
    labels: np.ndarray | None = None  # byte sources with a label per sample (DirectorySource)

    def __len__(self) -> int:
        return len(self.indices)

    def sample(self, position: int) -> Any:
        """Sample at ``position``: a uint8 view (byte sources; ``(view, label)`` with labels) or
        a ``{column: value}`` dict (table sources)."""
        if self.columns is not None:
            return {name: values[position] for name, values in self.columns.items()}
        start = int(self.starts[position])  # type: ignore[index]
        view = self.data[start : start + int(self.sizes[position])]  # type: ignore[index]
        return view if self.labels is None else (view, int(self.labels[position]))

    def samples(self, positions: Any = None) -> list[Any]:
        """``[self.sample(j) for j in positions]`` (default: all), without per-sample numpy
        scalar work: rows of a packed batch are split in one reshape, other spans sliced from
        Python ints."""
        if positions is None:
            positions = range(len(self))
        if self.columns is not None:
            names = list(self.columns)
            columns = [self.columns[name] for name in names]
            return [{name: c[j] for name, c in zip(names, columns, strict=True)} for j in positions]
        assert self.data is not None and self.starts is not None and self.sizes is not None
        n = len(self)
        if self.packed and n:
            size = int(self.sizes[0])
            rows = list(self.data[: n * size].reshape(n, size))
            views = rows if isinstance(positions, range) and len(positions) == n else None
            if views is None:
                views = [rows[j] for j in positions]
        else:
            starts, sizes, data = self.starts.tolist(), self.sizes.tolist(), self.data
            views = [data[starts[j] : starts[j] + sizes[j]] for j in positions]
        if self.labels is None:
            return views
        labels = self.labels.tolist()
        return [(view, labels[j]) for view, j in zip(views, positions, strict=True)]


class Source(abc.ABC):
    """Base of every source. Subclasses set ``name`` and implement ``__len__`` and ``read``.

    ``sample_size_bytes`` is the size of every sample when all are equal (enables the zero-copy
    collate and O_DIRECT), else None; ``sample_dtype``/``sample_shape`` describe such samples.
    """

    name: str = "source"
    sample_size_bytes: int | None = None
    sample_dtype: np.dtype = np.dtype(np.uint8)
    sample_shape: tuple[int, ...] | None = None

    @abc.abstractmethod
    def __len__(self) -> int: ...

    async def open(self, engine: IOEngine) -> None:  # noqa: B027  (optional hook)
        """Open files on ``engine``; called once, on the engine's loop."""

    async def close(self) -> None:  # noqa: B027  (optional hook)
        """Close what ``open`` opened."""

    @abc.abstractmethod
    async def read(self, indices: np.ndarray, slabs: SlabPool) -> SampleBatch:
        """Read the samples ``indices`` (issued together, completing in any order)."""

    def check_indices(self, indices: np.ndarray) -> np.ndarray:
        """``indices`` as int64, or SampleIndexError naming the first one out of range."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            bad = int(indices[(indices < 0) | (indices >= len(self))][0])
            raise SampleIndexError(self.name, bad, f"out of range for {len(self)} samples")
        return indices

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self)} samples)"


class FileSource(Source):
    """A source backed by one file, opened on the loader's engine (``direct``: O_DIRECT)."""

    path: str
    direct: bool = False
    _engine: IOEngine | None = None
    _file: FileHandle | None = None

    async def open(self, engine: IOEngine) -> None:
        self._engine = engine
        self._file = await engine.open(self.path, direct=self.direct)

    async def close(self) -> None:
        if self._file is not None and self._engine is not None and not self._engine.closed:
            await self._engine.close_file(self._file)
        self._file = None


def sample_errors_from(
    exc: StorageError | None, name: str, indices: np.ndarray, expected: np.ndarray, got: np.ndarray
) -> dict[int, SampleError]:
    """Per-sample errors of a failed or short batch: OS errors from ``exc.batch_results`` and
    short reads (``got < expected``) as truncation."""
    errors: dict[int, SampleError] = {}
    outcomes = exc.batch_results if exc is not None else None
    for position in np.flatnonzero(got < expected).tolist():
        index = int(indices[position])
        outcome = outcomes[position] if outcomes is not None else None
        if isinstance(outcome, BaseException):
            error: SampleError = SampleReadError(
                name, index, str(outcome), getattr(outcome, "errno", None)
            )
            error.__cause__ = outcome
        else:
            error = CorruptSampleError(
                name,
                index,
                f"truncated: {int(got[position])} of {int(expected[position])} bytes",
            )
        errors[position] = error
    return errors


def read_samples(
    source: Source, indices: Any, engine: str = "auto", runtime: IORuntime | None = None
) -> list[Any]:
    """Read ``indices`` of ``source`` synchronously (a debugging and testing helper), through
    ``runtime`` (default: the process's; ``engine`` other than "auto": a private one).

    Raises the first per-sample error instead of returning a partial list.
    """
    private = IORuntime(engine=engine) if engine != "auto" and runtime is None else None
    runtime = runtime or private or default_runtime()

    async def run() -> list[Any]:
        io = runtime.acquire_engine()
        try:
            await source.open(io)
            try:
                batch = await source.read(np.asarray(indices, np.int64), SlabPool(2))
            finally:
                await source.close()
        finally:
            await runtime.release_engine(io)
        if batch.errors:
            raise batch.errors[min(batch.errors)]
        out = [batch.sample(j) for j in range(len(batch))]
        if batch.labels is not None:
            return [(bytes(view), label) for view, label in out]
        return [bytes(s) if isinstance(s, np.ndarray) else s for s in out]

    try:
        return asyncio.run(run())
    finally:
        if private is not None:
            private.close()
