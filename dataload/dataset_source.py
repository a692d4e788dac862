"""DatasetSource: any map-style ``torch.utils.data.Dataset`` as a loader source.

``ShuffledLoader(dataset, ...)`` wraps a dataset (anything with ``__len__`` and
``__getitem__``) in this source. The loader's order, rank slicing and resume work on indices, so
they apply unchanged; what differs is who reads:

* a plain dataset reads in its own ``__getitem__`` (or ``__getitems__``, as DataLoader's
  fetcher prefers), called in the loader's workers -- ``read`` here only passes indices on;
* a dataset implementing :mod:`dataload.located` has its samples' byte ranges read here, on the
  I/O core, all of a batch in one submission and batches ahead, into the batch buffer (shared
  memory with process workers); the workers then only call ``decode``.

:class:`DatasetAssembler` is the per-batch work either way (``__getitem__`` or ``decode``, the
loader's ``transform``, then ``collate_fn`` or ``default_collate``). A sample whose call raises
is a TransformError naming it; ``on_error="skip"`` drops and counts it.

Concurrency: ``read`` runs on the engine's loop (the handle cache is only touched there); an
assembler is a pure function of its batch and dataset, run by any one thread or process.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from dataload.collate import Assembled, OnError, collate
from dataload.errors import SampleReadError, SourceError, TransformError
from dataload.located import is_located, locate_batch
from dataload.slabs import SlabPool
from dataload.source import SampleBatch, Source, sample_errors_from
from tiers.io import (
    FileHandle,
    InvalidArgumentError,
    IOBatch,
    IOEngine,
    Op,
    StorageError,
    as_buffer,
)

__all__ = ["DatasetAssembler", "DatasetSource", "SourceLabel"]


class SourceLabel:
    """What a worker needs to know of a source: its name (for errors)."""

    def __init__(self, name: str) -> None:
        self.name = name


class DatasetSource(Source):
    """A map-style dataset; reads located bytes on the I/O core when the dataset offers them."""

    def __init__(self, dataset: Any, *, name: str | None = None, max_open_files: int = 256):
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise InvalidArgumentError(
                f"{type(dataset).__name__} is not a map-style dataset (__len__ + __getitem__)"
            )
        self.dataset = dataset
        self.name = name or getattr(dataset, "root", None) or type(dataset).__name__
        self.name = str(self.name)
        self.located = is_located(dataset)
        if len(dataset) <= 0:
            raise SourceError(self.name, "the dataset is empty")
        self._max_open = max(1, max_open_files)
        self._handles: OrderedDict[str, FileHandle] = OrderedDict()
        self._pinned: dict[str, int] = {}
        self._engine: IOEngine | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    async def open(self, engine: IOEngine) -> None:
        self._engine = engine
        self._handles, self._pinned = OrderedDict(), {}

    async def close(self) -> None:
        handles, self._handles = list(self._handles.values()), OrderedDict()
        if self._engine is not None and not self._engine.closed:
            for handle in handles:
                await self._engine.close_file(handle)

    async def read(self, indices: np.ndarray, slabs: SlabPool) -> SampleBatch:
        indices = self.check_indices(indices)
        if not self.located:
            return SampleBatch(indices)
        paths, path_ids, offsets, sizes = locate_batch(self.dataset, indices)
        starts = np.zeros(len(sizes), np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        batch = SampleBatch(indices, slabs.acquire(int(sizes.sum())), starts, sizes)
        used, rows = np.unique(path_ids, return_inverse=True)  # rows: each sample's file
        names = [os.fspath(paths[k]) for k in used.tolist()]
        for path in names:
            self._pinned[path] = self._pinned.get(path, 0) + 1  # not evicted while in use
        try:
            handles = await self._open_all(names, rows, batch)
            await self._read_spans(batch, handles, rows.reshape(-1), offsets)
        finally:
            for path in names:
                self._pinned[path] -= 1
                if not self._pinned[path]:
                    del self._pinned[path]
        return batch

    async def _read_spans(
        self, batch: SampleBatch, handles: list[FileHandle | None], rows: np.ndarray, offsets: Any
    ) -> None:
        """Every span of the batch in one engine submission, built as arrays (a Python object
        per sample would cost more on the loop thread than the read itself)."""
        assert self._engine is not None and batch.sizes is not None and batch.starts is not None
        wanted = batch.sizes > 0
        if any(handle is None for handle in handles):
            wanted &= np.array([handle is not None for handle in handles])[rows]
        positions = np.flatnonzero(wanted)
        if not len(positions):
            return
        base = as_buffer(batch.data)
        files = [handles[k] for k in rows[positions].tolist()]
        expected = batch.sizes[positions]
        io = IOBatch(
            np.full(len(positions), Op.READ, np.uint8),
            files,
            (batch.starts[positions] + base.address).astype(np.uint64),
            expected.copy(),
            offsets[positions].copy(),
            [base.owner],
        )
        io.validate()
        failure = None
        try:
            await self._engine.run(io)
            got = io.results
        except StorageError as exc:
            failure = exc
            got = np.array([r if isinstance(r, int) else -1 for r in exc.batch_results or []])
        if failure is not None or (got < expected).any():
            fails = sample_errors_from(failure, self.name, batch.indices[positions], expected, got)
            batch.errors.update({int(positions[k]): error for k, error in fails.items()})
        batch.bytes_read = int(np.clip(got, 0, None).sum())

    async def _open_all(
        self, names: list[str], rows: np.ndarray, batch: SampleBatch
    ) -> list[FileHandle | None]:
        """A handle per file of the batch (None: it failed to open, its samples failed), the
        missing ones opened all at once (a folder of images: one file per sample, so opening
        them one after another would be a serial chain of syscalls)."""
        assert self._engine is not None
        engine = self._engine
        missing = [path for path in names if path not in self._handles]
        if missing:
            opened = await asyncio.gather(*map(engine.open, missing), return_exceptions=True)
            for path, handle in zip(missing, opened, strict=True):
                if not isinstance(handle, BaseException):
                    self._handles[path] = handle
                    continue
                if not isinstance(handle, StorageError):
                    raise handle
                for position in np.flatnonzero(rows == names.index(path)).tolist():
                    index = int(batch.indices[position])
                    error = SampleReadError(self.name, index, f"{path}: {handle}", handle.errno)
                    error.__cause__ = handle
                    batch.errors[position] = error
        handles: list[FileHandle | None] = []
        for path in names:
            known = self._handles.get(path)
            if known is not None:
                self._handles.move_to_end(path)
            handles.append(known)
        excess = len(self._handles) - self._max_open
        for old in [p for p in self._handles if p not in self._pinned][: max(excess, 0)]:
            await engine.close_file(self._handles.pop(old))
        return handles


class DatasetAssembler:
    """``__getitem__``/``decode`` + transform + collate for one batch of a DatasetSource."""

    heavy = True

    def __init__(
        self,
        dataset: Any,
        name: str,
        transform: Callable[[Any], Any] | None,
        collate_fn: Callable[[list[Any]], Any] | None,
        on_error: OnError,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise InvalidArgumentError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.dataset = dataset
        self.source = SourceLabel(name)
        self.transform, self.collate_fn, self.on_error = transform, collate_fn, on_error
        self.located = is_located(dataset)

    def __call__(self, batch: SampleBatch) -> Assembled:
        if batch.errors and self.on_error == "raise":
            raise batch.errors[min(batch.errors)]
        positions = [j for j in range(len(batch)) if j not in batch.errors]
        indices = batch.indices.tolist()
        samples = self._bulk(indices, positions, batch)
        if samples is None:
            samples = []
            for position in positions:
                sample = self._one(indices[position], position, batch)
                if sample is not _FAILED:
                    samples.append(sample)
        skipped = len(batch) - len(samples)
        return Assembled(collate(samples, self.collate_fn), len(batch), skipped, batch.bytes_read)

    def _bulk(self, indices: list[int], positions: list[int], batch: SampleBatch) -> Any:
        """``__getitems__`` for a whole plain batch, as DataLoader's fetcher does; None to go
        sample by sample (located data, no ``__getitems__``, or it raised: then each sample
        is retried alone, so the error names the one that fails)."""
        getitems = getattr(self.dataset, "__getitems__", None)
        if self.located or getitems is None or batch.errors:
            return None
        try:
            samples = list(getitems([indices[j] for j in positions]))
        except Exception:
            return None
        if self.transform is not None:
            return None if len(samples) != len(positions) else self._transform_all(samples, indices)
        return samples

    def _transform_all(self, samples: list[Any], indices: list[int]) -> Any:
        out = []
        for _index, sample in zip(indices, samples, strict=True):
            try:
                out.append(self.transform(sample))  # type: ignore[misc]
            except Exception:
                return None
        return out

    def _one(self, index: int, position: int, batch: SampleBatch) -> Any:
        step = "__getitem__"
        try:
            if self.located:
                step = "decode"
                start = int(batch.starts[position])  # type: ignore[index]
                view = batch.data[start : start + int(batch.sizes[position])]  # type: ignore[index]
                sample = self.dataset.decode(index, view)
            else:
                sample = self.dataset[index]
            if self.transform is not None:
                step = "transform"
                sample = self.transform(sample)
            return sample
        except Exception as exc:
            error = TransformError(self.source.name, index, f"{step} raised {exc!r}")
            if self.on_error == "raise":
                raise error from exc
            return _FAILED


_FAILED = object()
