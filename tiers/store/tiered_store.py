"""TieredStore: one key-value store over an ordered list of tiers, fastest first.

Placement: a new object goes to the fastest tier with room, evicting from it by the tier's
policy. Every copy of an object is identical; the fastest copy serves reads. Eviction drops a
copy when another exists and otherwise demotes it one tier down ("write-back"), recursively;
when the last tier is full, ``CapacityError``. A read served below the top promotes the object:
in the get when that is only memory copies and drops, else in the background, so a get never
waits for the I/O of a migration (tiers.store.migration). Pinned objects never move. With
``write_through`` (the default when a persistent tier exists) every put also lands on the
persistent tier before it returns, so an acknowledged put survives a crash; without it,
``flush()`` makes everything durable.

Reads (get, get_many: tiers.store.reads) take no lock. ``put_many`` writes through to the
persistent tier with one ``Tier.put_many`` (one shared durability point). A store made by
``open_store`` with a private runtime closes it in ``aclose``.

Concurrency: loop thread only. Mutations (put, delete, pin, migration) hold one asyncio lock;
gets take no lock and read the copy that is fastest when they start (tiers guarantee a get sees
old or new bytes, never a mix).
Invariants: ``_entries[key].copies`` lists, ascending, exactly the tiers holding ``key``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tiers.io.buffers import as_buffer
from tiers.io.byte_views import is_tensor
from tiers.io.errors import CapacityError, InvalidArgumentError
from tiers.io.runtime import IORuntime
from tiers.memory.arena import ArenaTier
from tiers.storage.tier import Tier, check_key
from tiers.store.migration import Entry
from tiers.store.policy import make_policy
from tiers.store.reads import StoreReads
from tiers.store.stats import TierCounters

__all__ = ["TieredStore"]


def _nbytes(data: Any) -> int:
    if is_tensor(data):
        return int(data.numel() * data.element_size())
    return as_buffer(data).size_bytes


class TieredStore(StoreReads):
    """``tiers`` ordered fastest first; ``policy`` is "lru", "lfu" or "cost"."""

    def __init__(
        self,
        tiers: Sequence[Tier],
        policy: str = "lru",
        *,
        promote_on_hit: bool = True,
        write_through: bool | None = None,
    ) -> None:
        if not tiers:
            raise InvalidArgumentError("a store needs at least one tier")
        self.tiers = list(tiers)
        self.policy_name = policy
        self._policies = [make_policy(policy) for _ in self.tiers]
        self.counters = [TierCounters() for _ in self.tiers]
        persistent = [i for i, t in enumerate(self.tiers) if t.supports_persistence]
        self._durable_tier = persistent[-1] if persistent else None
        self.write_through = bool(persistent) if write_through is None else write_through
        if self.write_through and self._durable_tier is None:
            raise InvalidArgumentError("write_through needs a persistent tier (NVMe)")
        self.promote_on_hit = promote_on_hit
        self._entries: dict[str, Entry] = {}
        self._lock = asyncio.Lock()
        self._promoting: set[str] = set()
        self._tasks: set[asyncio.Future[None]] = set()
        self._memory = [t if isinstance(t, ArenaTier) else None for t in self.tiers]
        self.owned_runtime: IORuntime | None = None  # closed by aclose (set by open_store)
        for index, tier in enumerate(self.tiers):  # objects that survived a restart
            if tier.supports_persistence:
                self._adopt(index, tier)

    def _adopt(self, index: int, tier: Tier) -> None:
        """Index the objects a persistent tier holds (a reopen: per key only dict work, since
        a million keys is a million passes through this loop)."""
        entries, size_of = self._entries, tier.size_of
        admit, refetch_s = self._policies[index].admit, self._refetch_s(index, 0)
        for key in list(tier.keys()):
            entry = entries.get(key)
            if entry is None:
                entry = entries[key] = Entry(size_of(key) or 0)
            entry.copies.append(index)
            admit(key, entry.size_bytes, refetch_s)

    def size_of(self, key: str) -> int | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.size_bytes

    def tier_of(self, key: str) -> str | None:
        """Name of the tier serving ``key`` now (its fastest copy)."""
        entry = self._entries.get(key)
        return None if entry is None else self.tiers[entry.copies[0]].name

    def keys(self, prefix: str = "") -> list[str]:
        return [k for k in self._entries if k.startswith(prefix)]

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    # ------------------------------------------------------------------ writes
    async def put(self, key: str, data: Any, *, pin: bool = False) -> None:
        """Store ``data`` under ``key`` in the fastest tier with room (and, with write-through,
        on the persistent tier too) before returning. Raises CapacityError when no tier can
        make room; the previous object, if any, is then unchanged."""
        check_key(key)
        size = _nbytes(data)
        async with self._lock:
            await self._put_locked(key, data, size, pin, durable_done=False)

    async def put_many(
        self, items: Mapping[str, Any] | Iterable[tuple[str, Any]], *, pin: bool = False
    ) -> None:
        """``put`` every (key, data) pair (a later pair of the same key wins). With
        write-through, all go to the persistent tier in one ``Tier.put_many`` (one write
        submission, one fdatasync per file, one catalog commit) before the fast tiers take
        their copies; returns once all are stored. Raises CapacityError at the first pair
        that cannot be placed (the pairs before it stay stored)."""
        pairs = dict(items.items() if isinstance(items, Mapping) else items)
        for key in pairs:
            check_key(key)
        sizes = {key: _nbytes(data) for key, data in pairs.items()}
        async with self._lock:
            durable = self._durable_tier if self.write_through else None
            batched = False
            if durable is not None and len(pairs) > 1:
                batched = await self._place_many(durable, pairs, sizes)
            for key, data in pairs.items():
                await self._put_locked(key, data, sizes[key], pin, durable_done=batched)

    async def _place_many(self, index: int, pairs: dict[str, Any], sizes: dict[str, int]) -> bool:
        """Put every pair on tier ``index`` with one ``put_many``; False (nothing done) when
        they do not fit together, and the caller places them one by one."""
        total = sum(sizes.values())
        if total > self.tiers[index].capacity_bytes:
            return False
        if not await self._make_room(index, total, exclude=pairs):
            return False
        try:
            await self.tiers[index].put_many(pairs)
        except CapacityError:
            return False
        return True

    async def _put_locked(
        self, key: str, data: Any, size: int, pin: bool, *, durable_done: bool
    ) -> None:
        old = self._entries.get(key)
        placed: list[int] = []
        durable = self._durable_tier if self.write_through else None
        if durable is not None:  # durable first: a failure here changes nothing
            if not durable_done and not await self._place(durable, key, data, size):
                raise CapacityError(f"no room for {size} bytes on the persistent tier")
            placed.append(durable)
        for index in range(len(self.tiers)):
            if index != durable and await self._place(index, key, data, size):
                placed.append(index)
                break
        if not placed:
            raise CapacityError(f"no tier can make room for {size} bytes under {key!r}")
        for index in old.copies if old else []:
            if index not in placed:  # a stale copy of the previous object
                await self._drop_copy(key, index)
        self._entries[key] = Entry(size, sorted(placed), pin or bool(old and old.pinned))
        for index in placed:
            self._policies[index].admit(key, size, self._refetch_s(index, size))

    async def _place(self, index: int, key: str, data: Any, size: int) -> bool:
        if size > self.tiers[index].capacity_bytes:
            return False
        return await self._make_room(index, size, exclude=(key,)) and await self._try_put(
            index, key, data
        )

    async def delete(self, key: str) -> bool:
        async with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return False
            for index in entry.copies:
                await self._drop_copy(key, index)
            return True

    async def delete_many(self, keys: Iterable[str]) -> int:
        """Delete every key of ``keys``, each tier's copies with one ``Tier.delete_many`` (one
        catalog commit on NVMe); how many were present."""
        async with self._lock:
            by_tier: dict[int, list[str]] = {}
            present = 0
            for key in dict.fromkeys(keys):
                entry = self._entries.pop(key, None)
                if entry is None:
                    continue
                present += 1
                for index in entry.copies:
                    by_tier.setdefault(index, []).append(key)
            for index, members in by_tier.items():
                await self.tiers[index].delete_many(members)
                for key in members:
                    self._policies[index].forget(key)
            return present

    async def pin(self, key: str) -> bool:
        """Keep ``key`` where it is: never evicted, promoted or demoted. False if absent."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.pinned = True
        return entry is not None

    async def unpin(self, key: str) -> bool:
        entry = self._entries.get(key)
        if entry is not None:
            entry.pinned = False
        return entry is not None

    async def prefetch(self, keys: Iterable[str]) -> int:
        """Promote ``keys`` to the fastest tier with room; returns how many moved."""
        moved = 0
        for key in keys:
            moved += await self._promote(key)
        return moved

    async def flush(self) -> int:
        """Write every object with no copy on the persistent tier down to it; returns count."""
        if self._durable_tier is None:
            return 0
        written = 0
        async with self._lock:
            for key, entry in list(self._entries.items()):
                if self._durable_tier not in entry.copies and self._entries.get(key) is entry:
                    written += await self._copy_to(key, entry, self._durable_tier)
        return written

    # ------------------------------------------------------------------ lifecycle
    async def drain(self) -> None:
        """Wait for background migrations to finish."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def stats(self) -> dict[str, Any]:
        return {
            "policy": self.policy_name,
            "objects": len(self._entries),
            "write_through": self.write_through,
            "tiers": [
                {**tier.stats(), **counters.as_dict()}
                for tier, counters in zip(self.tiers, self.counters, strict=True)
            ],
        }

    async def aclose(self) -> None:
        await self.drain()
        for tier in self.tiers:
            await tier.aclose()
        if self.owned_runtime is not None:
            self.owned_runtime.close()  # open_store made it for this store alone
