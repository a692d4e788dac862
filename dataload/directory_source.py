"""DirectorySource: one file per sample (e.g. images), optionally labelled by parent directory.

The file list and sizes are taken once, at construction (sorted paths, so indices are stable).
A batch opens the files it needs (a bounded cache of open handles), then reads every file in
one multi-file engine submission into one slab. With ``labels=True`` the class of a file is its
parent directory's name (``root/cat/1.png`` -> class "cat", like torchvision's ImageFolder),
and each sample is ``(bytes_view, label)``.

Failures are per sample: a file deleted since the listing is a SampleReadError (ENOENT), one
that shrank is a CorruptSampleError (truncated).

Concurrency: ``read`` may run concurrently with itself on the engine's loop; the handle cache is
only touched from that loop.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

from dataload.errors import SampleError, SampleReadError, SourceError
from dataload.slabs import SlabPool
from dataload.source import SampleBatch, Source, sample_errors_from
from tiers.io import FileHandle, IOEngine, ReadRequest, StorageError

__all__ = ["DirectorySource"]


class DirectorySource(Source):
    """Every file under ``root`` matching ``pattern`` (recursive glob), or the given ``files``."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        pattern: str = "**/*",
        *,
        files: list[str | os.PathLike[str]] | None = None,
        labels: bool = False,
        max_open_files: int = 256,
    ) -> None:
        self.root = Path(root)
        self.name = os.fspath(root)
        if files is None:
            if not self.root.is_dir():
                raise SourceError(self.name, "not a directory")
            found = sorted(p for p in self.root.glob(pattern) if p.is_file())
            self.paths = [os.fspath(p) for p in found]
        else:
            self.paths = [os.fspath(p) for p in files]
        if not self.paths:
            raise SourceError(self.name, f"no files match {pattern!r}")
        self.sizes = np.array([os.stat(p).st_size for p in self.paths], np.int64)
        self.classes: list[str] = []
        self.targets: np.ndarray | None = None
        if labels:
            parents = [Path(p).parent.name for p in self.paths]
            self.classes = sorted(set(parents))
            lookup = {name: i for i, name in enumerate(self.classes)}
            self.targets = np.array([lookup[p] for p in parents], np.int64)
        self._max_open = max(1, max_open_files)
        self._handles: OrderedDict[int, FileHandle] = OrderedDict()
        self._pinned: dict[int, int] = {}  # file index -> reads in progress that use it
        self._engine: IOEngine | None = None

    def __len__(self) -> int:
        return len(self.paths)

    async def open(self, engine: IOEngine) -> None:
        self._engine = engine
        self._handles, self._pinned = OrderedDict(), {}  # a copy must not share a clone's

    async def close(self) -> None:
        handles, self._handles = list(self._handles.values()), OrderedDict()
        if self._engine is not None and not self._engine.closed:
            for handle in handles:
                await self._engine.close_file(handle)

    async def read(self, indices: np.ndarray, slabs: SlabPool) -> SampleBatch:
        indices = self.check_indices(indices)
        sizes = self.sizes[indices]
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        data = slabs.acquire(int(sizes.sum()))
        batch = SampleBatch(indices, data, starts, sizes)
        used = indices.tolist()
        for index in used:
            self._pinned[index] = self._pinned.get(index, 0) + 1  # not evicted while in use
        try:
            requests, positions = [], []
            for position, index in enumerate(used):
                handle = await self._handle(index, position, batch.errors)
                if handle is not None and sizes[position]:
                    start = int(starts[position])
                    requests.append(ReadRequest(handle, 0, data[start : start + sizes[position]]))
                    positions.append(position)
            if requests:
                await self._submit(batch, requests, np.array(positions, np.int64))
        finally:
            for index in used:
                self._pinned[index] -= 1
                if not self._pinned[index]:
                    del self._pinned[index]
        if self.targets is not None:
            batch.labels = self.targets[indices]
        return batch

    async def _submit(self, batch: SampleBatch, requests: list, positions: np.ndarray) -> None:
        """Read every file at once; short or failed reads become per-sample errors."""
        assert self._engine is not None and batch.sizes is not None
        expected = batch.sizes[positions]
        failure = None
        try:
            got = np.array(await self._engine.submit(requests), np.int64)
        except StorageError as exc:
            failure = exc
            results = exc.batch_results or []
            got = np.array([r if isinstance(r, int) else -1 for r in results], np.int64)
        if failure is not None or (got < expected).any():
            fails = sample_errors_from(failure, self.name, batch.indices[positions], expected, got)
            batch.errors.update({int(positions[k]): error for k, error in fails.items()})
        batch.bytes_read = int(np.clip(got, 0, None).sum())

    async def _handle(
        self, index: int, position: int, errors: dict[int, SampleError]
    ) -> FileHandle | None:
        """An open handle for file ``index`` (cached), or None with the error recorded."""
        handle = self._handles.get(index)
        if handle is not None:
            self._handles.move_to_end(index)
            return handle
        assert self._engine is not None
        try:
            handle = await self._engine.open(self.paths[index])
        except StorageError as exc:
            error = SampleReadError(self.name, index, f"{self.paths[index]}: {exc}", exc.errno)
            error.__cause__ = exc
            errors[position] = error
            return None
        self._handles[index] = handle
        await self._evict()
        return handle

    async def _evict(self) -> None:
        """Close the least recently used handles beyond the cap, skipping those in use."""
        assert self._engine is not None
        excess = len(self._handles) - self._max_open
        for index in [i for i in self._handles if i not in self._pinned][: max(excess, 0)]:
            await self._engine.close_file(self._handles.pop(index))
