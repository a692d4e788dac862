"""LmdbSource: an LMDB environment holding one value per sample, keyed by the sample index.

Honest about the I/O path: LMDB serves reads from its own memory map, so these reads do *not*
go through the tierkit I/O core -- a batch is one read transaction with one ``getmulti`` call,
run in a worker thread so that page faults on a cold map never block the loader's event loop.
The values are copied into one slab, so collate and transforms see the same layout as for
record files.

Keys: ``index_key(i)`` (8-byte big-endian, so key order is index order) unless ``key_fn`` says
otherwise. ``write_lmdb`` builds such an environment.

Environments are opened with tiers.storage's ``open_lmdb``, without its structural check (it
would read the whole data set; a source is read-only, not a store of its own).

Concurrency: ``read`` may run concurrently (LMDB allows many readers). LMDB allows one open
environment per path and process, so every LmdbSource (and every loader's copy) of one path
shares a single read-only, lock-free environment, counted and closed with its last user.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from dataload.errors import CorruptSampleError, SampleError, SourceError
from dataload.slabs import SlabPool
from dataload.source import SampleBatch, Source
from tiers.io import InvalidArgumentError, IOEngine, StorageError
from tiers.storage import open_lmdb

__all__ = ["LmdbSource", "index_key", "write_lmdb"]


def index_key(index: int) -> bytes:
    """The default key of sample ``index``."""
    return int(index).to_bytes(8, "big")


class LmdbSource(Source):
    """Samples ``0 .. count-1`` of an LMDB environment (``count``: the number of entries)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        key_fn: Callable[[int], bytes] = index_key,
        count: int | None = None,
    ) -> None:
        self.path = self.name = os.fspath(path)
        if not os.path.exists(self.path):
            raise SourceError(self.name, "no such LMDB environment")
        env = _acquire_env(self.path)
        try:
            self._count = env.stat()["entries"] if count is None else count
        finally:
            _release_env(self.path)
        self._env: Any = None
        self._key_fn = key_fn

    def __len__(self) -> int:
        return self._count

    async def open(self, engine: IOEngine) -> None:
        del engine  # LMDB reads through its own memory map
        self._env = _acquire_env(self.path)

    async def close(self) -> None:
        if self._env is not None:
            self._env = None
            _release_env(self.path)

    async def read(self, indices: np.ndarray, slabs: SlabPool) -> SampleBatch:
        indices = self.check_indices(indices)
        values = await asyncio.to_thread(self._get_all, indices)
        sizes = np.array([0 if v is None else len(v) for v in values], np.int64)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        data = slabs.acquire(int(sizes.sum()))
        errors: dict[int, SampleError] = {}
        for position, value in enumerate(values):
            if value is None:
                index = int(indices[position])
                errors[position] = CorruptSampleError(self.name, index, "key missing")
            else:
                data[starts[position] : starts[position] + sizes[position]] = np.frombuffer(
                    value, np.uint8
                )
        batch = SampleBatch(indices, data, starts, sizes, errors=errors)
        batch.bytes_read = int(sizes.sum())
        return batch

    def _get_all(self, indices: np.ndarray) -> list[bytes | None]:
        keys = [self._key_fn(i) for i in indices.tolist()]
        with self._env.begin(buffers=False) as txn:
            return [txn.get(key) for key in keys]


_ENVS: dict[str, list[Any]] = {}  # path -> [environment, users]
_ENVS_LOCK = threading.Lock()


def _acquire_env(path: str) -> Any:
    with _ENVS_LOCK:
        entry = _ENVS.get(path)
        if entry is None:
            try:
                env = open_lmdb(path, check=False, readonly=True, lock=False, readahead=False)
            except StorageError as exc:  # LMDB's own words, as before the translation
                why = exc.__cause__ or exc
                raise SourceError(path, f"cannot open LMDB environment: {why}") from exc
            entry = _ENVS[path] = [env, 0]
        entry[1] += 1
        return entry[0]


def _release_env(path: str) -> None:
    with _ENVS_LOCK:
        entry = _ENVS[path]
        entry[1] -= 1
        if not entry[1]:
            entry[0].close()
            del _ENVS[path]


def write_lmdb(
    path: str | os.PathLike[str],
    samples: Iterable[Any],
    *,
    map_size_bytes: int = 1 << 30,
    key_fn: Callable[[int], bytes] = index_key,
) -> int:
    """Store each sample (bytes-like) under ``key_fn(i)``; returns how many were written."""
    if map_size_bytes <= 0:
        raise InvalidArgumentError("map_size_bytes must be positive")
    env = open_lmdb(os.fspath(path), map_bytes=map_size_bytes, check=False, subdir=True)
    count = 0
    try:
        with env.begin(write=True) as txn:
            for count, sample in enumerate(samples, 1):
                txn.put(key_fn(count - 1), bytes(sample))
        env.sync(True)
    finally:
        env.close()
    return count
