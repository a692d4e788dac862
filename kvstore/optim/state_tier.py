"""StateTier: where an OffloadedOptimizer's subgroup objects and manifests live.

``tier="dram"`` is one DRAM tier sized to the state; ``tier="nvme"`` one NVMe tier in
``directory`` (created when ``create`` and absent; without ``create`` a missing directory is
refused, as tiers' own ``create = false`` does); a dict is a tiers store configuration used as
given. The store lives on the shared runtime's loop thread: every call here submits a coroutine
there (``runtime.submit``); ``read``/``write`` return futures so the pipeline overlaps them with
the CPU step, the rest wait.

Thread-safety: any thread may call; the store itself is touched only on the loop thread.
Invariants: after ``close`` every call raises OffloadError.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from kvstore.optim.layout import OffloadError
from kvstore.optim.manifest import CHECKPOINT_PREFIX, MANIFEST_KEY, Manifest
from tiers import IORuntime, TieredStore, TierkitError, open_store
from tiers.nvme import chunk_log2_for

__all__ = ["StateTier"]

_SLACK_BYTES = 16 << 20  # manifests and the objects of a step in flight
# byte-range gets per object read: the NVMe tier makes one request of each, so a read keeps
# several in flight, as fio at queue depth 4 does (the floor; one request each way was 1.04x
# fio at QD1, 1.38x at QD4)
READ_PARTS = 4
_MIN_PART_BYTES = 4 << 20


def read_spans(size_bytes: int, parts: int) -> list[tuple[int, int]]:
    """(offset, bytes) of ``parts`` byte ranges covering an object of ``size_bytes``, each at
    least ``_MIN_PART_BYTES`` and cut on the NVMe tier's chunk boundaries (a range is read and
    checked as whole chunks: cut elsewhere, two ranges would both read a shared chunk)."""
    chunk = 1 << max(chunk_log2_for(size_bytes), 12)
    parts = max(1, min(parts, size_bytes // _MIN_PART_BYTES))
    step = -(-size_bytes // parts // chunk) * chunk
    return [(a, min(step, size_bytes - a)) for a in range(0, size_bytes, step)]


def _config(
    tier: str | dict[str, Any],
    directory: str | os.PathLike[str] | None,
    create: bool,
    state_bytes: int,
    in_flight_bytes: int,
) -> dict[str, Any]:
    if isinstance(tier, dict):
        return tier
    if tier == "dram":
        capacity = state_bytes + in_flight_bytes + _SLACK_BYTES
        return {"tiers": [{"kind": "dram", "capacity": capacity}]}
    if tier == "nvme":
        if directory is None:
            raise OffloadError('tier="nvme" needs directory=: where the optimizer state lives')
        path = os.fspath(directory)
        if not create and not os.path.isdir(path):
            raise OffloadError(f"no such directory {path!r} (pass create=True to make one)")
        if create:
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as exc:
                raise OffloadError(f"cannot create {path!r}: {exc.strerror}") from exc
        stats = os.statvfs(path)
        capacity = stats.f_blocks * stats.f_frsize  # files grow as records come
        return {"tiers": [{"kind": "nvme", "capacity": capacity, "path": path, "create": create}]}
    raise OffloadError(f'tier must be "dram", "nvme" or a store configuration, got {tier!r}')


class StateTier:
    def __init__(
        self,
        tier: str | dict[str, Any],
        directory: str | os.PathLike[str] | None,
        *,
        create: bool,
        runtime: IORuntime,
        state_bytes: int = 0,
        in_flight_bytes: int = 0,
    ) -> None:
        config = _config(tier, directory, create, state_bytes, in_flight_bytes)
        self.runtime = runtime
        self.where = os.fspath(directory) if directory is not None else f"the {tier} tier"
        try:
            self._store: TieredStore | None = runtime.submit(open_store(config, runtime)).result()
        except TierkitError as exc:
            if isinstance(exc, OffloadError):
                raise
            raise OffloadError(f"cannot open the optimizer's tier: {exc}") from exc
        self.persistent = any(t.supports_persistence for t in self._store.tiers)
        self.read_parts = READ_PARTS

    @property
    def store(self) -> TieredStore:
        if self._store is None:
            raise OffloadError("this optimizer is closed")
        return self._store

    # ------------------------------------------------------------ subgroup objects
    def read(self, key: str, into: np.ndarray) -> concurrent.futures.Future[Any]:
        """Read object ``key`` into ``into`` (a page-aligned uint8 array of its size), on a
        persistent tier as ``read_parts`` byte-range gets at once (read_parts: why)."""
        store = self.store
        spans = read_spans(into.nbytes, self.read_parts) if self.persistent else []

        async def get() -> None:
            if len(spans) > 1:
                gets = [store.get(key, into=into[a : a + n], byte_range=(a, n)) for a, n in spans]
                found = all(got is not None for got in await asyncio.gather(*gets))
            else:
                found = await store.get(key, into=into) is not None
            if not found:
                raise OffloadError(f"{self.where}: optimizer object {key!r} is missing")

        return self.runtime.submit(get())

    def write_many(
        self, objects: list[tuple[str, np.ndarray, str | None]]
    ) -> concurrent.futures.Future[None]:
        """Store each ``(key, data, replaces)`` (all durable when the future is done, on
        NVMe: one ``put_many``, one submission and durability point), then delete each
        ``replaces`` given (DRAM: no crash to survive, so no second copy is kept)."""
        store = self.store

        async def put() -> None:
            if len(objects) == 1:
                await store.put(objects[0][0], objects[0][1])
            else:
                await store.put_many([(key, data) for key, data, _ in objects])
            drops = [old for key, _, old in objects if old is not None and old != key]
            if drops:
                await store.delete_many(drops)

        return self.runtime.submit(put())

    def delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if keys:
            self.runtime.submit(self.store.delete_many(keys)).result()

    def keys(self, prefix: str) -> list[str]:
        store = self.store

        async def list_keys() -> list[str]:
            return store.keys(prefix)

        return self.runtime.submit(list_keys()).result()

    # ------------------------------------------------------------ manifests
    def load_manifest(self, key: str = MANIFEST_KEY) -> Manifest | None:
        data = self.runtime.submit(self.store.get(key)).result()
        return None if data is None else Manifest.from_bytes(data, f"{self.where}: {key}")

    def save_manifest(self, manifest: Manifest, key: str = MANIFEST_KEY) -> None:
        """Durable when it returns on NVMe: this is the commit point of a step."""
        self.runtime.submit(self.store.put(key, manifest.to_bytes())).result()

    def checkpoints(self) -> dict[str, Manifest]:
        return {
            key.removeprefix(CHECKPOINT_PREFIX): manifest
            for key in self.keys(CHECKPOINT_PREFIX)
            if (manifest := self.load_manifest(key)) is not None
        }

    def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            self.runtime.submit(store.aclose()).result()
