"""TieredStore: one key-value store over an ordered list of tiers, fastest first.

Placement: a new object goes to the fastest tier with room, evicting from it by the tier's
policy. Every copy of an object is identical; the fastest copy serves reads. Eviction drops a
copy when another exists and otherwise demotes it one tier down ("write-back"), recursively;
when the last tier is full, ``CapacityError``. A read served below the top schedules a
background promotion, so a get never waits for migration: it costs one copy from wherever the
object is. Pinned objects never move. With ``write_through`` (the default when a persistent tier
exists) every put also lands on the persistent tier before it returns, so an acknowledged put
survives a crash; without it, ``flush()`` makes everything durable.

``get_many`` groups its keys by the tier serving each and reads each group with one
``Tier.get_many`` (one engine submission on NVMe), with the bookkeeping of single gets;
``put_many`` writes through to the persistent tier with one ``Tier.put_many`` (one shared
durability point). A store made by ``open_store`` with a private runtime closes it in ``aclose``.

Concurrency: loop thread only. Mutations (put, delete, pin, migration) hold one asyncio lock;
gets take no lock and read the copy that is fastest when they start (tiers guarantee a get sees
old or new bytes, never a mix).
Invariants: ``_entries[key].copies`` lists, ascending, exactly the tiers holding ``key``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any

import numpy as np

from tiers.io.buffers import as_buffer
from tiers.io.byte_views import is_tensor
from tiers.io.errors import CapacityError, InvalidArgumentError
from tiers.io.runtime import IORuntime
from tiers.storage.tier import ByteRange, Tier, check_key
from tiers.store.policy import make_policy
from tiers.store.stats import TierCounters

__all__ = ["TieredStore"]


@dataclass(slots=True)
class _Entry:
    size_bytes: int
    copies: list[int] = field(default_factory=list)
    pinned: bool = False


def _private_copy(data: Any, size_bytes: int) -> Any:
    """The first ``size_bytes`` of ``data`` (the caller's buffer may be larger), copied so the
    caller cannot change them under us: a uint8 numpy array, or a torch tensor on its device."""
    if is_tensor(data):
        import torch  # only reached with a torch tensor in hand

        return data.detach().reshape(-1).view(torch.uint8)[:size_bytes].clone()
    return np.frombuffer(as_buffer(data).memoryview(0, size_bytes), np.uint8).copy()


def _nbytes(data: Any) -> int:
    if is_tensor(data):
        return int(data.numel() * data.element_size())
    return as_buffer(data).size_bytes


class TieredStore:
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
        self._entries: dict[str, _Entry] = {}
        self._lock = asyncio.Lock()
        self._promoting: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.owned_runtime: IORuntime | None = None  # closed by aclose (set by open_store)
        for index, tier in enumerate(self.tiers):  # objects that survived a restart
            if tier.supports_persistence:
                for key in list(tier.keys()):
                    entry = self._entries.setdefault(key, _Entry(tier.size_of(key) or 0))
                    entry.copies.append(index)
                    self._policies[index].admit(key, entry.size_bytes, self._refetch_s(index, 0))

    # ------------------------------------------------------------------ reads
    async def get(
        self, key: str, *, into: Any = None, byte_range: ByteRange | None = None
    ) -> Any | None:
        """The object (or a byte range of it) from its fastest copy; None when absent."""
        entry = self._entries.get(key)
        if entry is None:
            self.counters[-1].misses += 1
            return None
        index = entry.copies[0]
        start = perf_counter_ns()
        result = await self.tiers[index].get(key, into=into, byte_range=byte_range)
        if result is None:  # deleted or overwritten while we looked: read the current state
            return (
                await self.get(key, into=into, byte_range=byte_range)
                if key in self._entries and self._entries[key] is not entry
                else None
            )
        self._hit(key, entry, index, result, byte_range, perf_counter_ns() - start)
        return result

    async def get_many(self, keys: Iterable[str], into: list[Any] | None = None) -> list[Any]:
        """Whole objects of ``keys``, aligned with them (None where absent), each from its
        fastest copy: the keys served by one tier are read with one ``Tier.get_many`` (one
        engine submission on NVMe), the tiers concurrently. Hits, misses, policy touches and
        promotions are counted and scheduled as ``get`` of each key would.

        ``into``: one destination per key (or None), caller-owned.
        """
        keys = list(keys)
        if into is not None and len(into) != len(keys):
            raise InvalidArgumentError(f"{len(into)} destinations for {len(keys)} keys")
        outs = into if into is not None else [None] * len(keys)
        results: list[Any] = [None] * len(keys)
        groups: dict[int, list[tuple[int, str, _Entry]]] = {}
        for slot, key in enumerate(keys):
            entry = self._entries.get(key)
            if entry is None:
                self.counters[-1].misses += 1
            else:
                groups.setdefault(entry.copies[0], []).append((slot, key, entry))

        async def serve(index: int, members: list[tuple[int, str, _Entry]]) -> None:
            start = perf_counter_ns()
            got = await self.tiers[index].get_many(
                [key for _, key, _ in members], [outs[slot] for slot, _, _ in members]
            )
            elapsed = perf_counter_ns() - start
            for (slot, key, entry), result in zip(members, got, strict=True):
                if result is None:  # deleted or overwritten meanwhile: as get would
                    current = self._entries.get(key)
                    if current is not None and current is not entry:
                        results[slot] = await self.get(key, into=outs[slot])
                    continue
                self._hit(key, entry, index, result, None, elapsed)
                results[slot] = result

        if len(groups) == 1:
            await serve(*next(iter(groups.items())))
        elif groups:
            await asyncio.gather(*(serve(index, members) for index, members in groups.items()))
        return results

    def _hit(
        self,
        key: str,
        entry: _Entry,
        index: int,
        result: Any,
        byte_range: ByteRange | None,
        elapsed_ns: int,
    ) -> None:
        """The bookkeeping of a get served by tier ``index``: counters, policy, promotion."""
        self.counters[index].record_hit(elapsed_ns)
        self._policies[index].touch(key)
        if index:
            for counters in self.counters[:index]:
                counters.misses += 1
            if self.promote_on_hit and not entry.pinned and key not in self._promoting:
                # Hand the bytes just read to the promotion (a memory copy: the caller owns
                # ``result``) so a miss costs one read of the slow tier, not two.
                staged = _private_copy(result, entry.size_bytes) if byte_range is None else None
                self._promoting.add(key)
                self._spawn(self._promote(key, entry, staged))

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
        self._entries[key] = _Entry(size, sorted(placed), pin or bool(old and old.pinned))
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

    # ------------------------------------------------------------------ migration
    async def _promote(self, key: str, seen: _Entry | None = None, staged: Any = None) -> bool:
        """Copy ``key`` up to the fastest tier with room. ``staged``: the object's bytes, read
        by a get of the entry ``seen`` (ignored if the key was overwritten since)."""
        self._promoting.add(key)
        try:
            async with self._lock:
                entry = self._entries.get(key)
                if entry is None or entry.pinned or entry.copies[0] == 0:
                    return False
                if seen is not None and entry is not seen:
                    staged = None  # overwritten since the get: those bytes are stale
                for target in range(entry.copies[0]):
                    if await self._promote_into(target, key, entry, staged):
                        self.counters[target].promotions += 1
                        return True
                return False
        finally:
            self._promoting.discard(key)

    async def _promote_into(self, target: int, key: str, entry: _Entry, staged: Any) -> bool:
        if entry.size_bytes > self.tiers[target].capacity_bytes:
            return False
        return await self._make_room(target, entry.size_bytes, exclude=(key,)) and (
            await self._copy_to(key, entry, target, staged)
        )

    async def _copy_to(self, key: str, entry: _Entry, target: int, data: Any = None) -> bool:
        if data is None:
            data = await self.tiers[entry.copies[0]].get(key)
        if data is None or not await self._try_put(target, key, data):
            return False
        entry.copies = sorted({*entry.copies, target})
        self.counters[target].bytes_in += entry.size_bytes
        self._policies[target].admit(
            key, entry.size_bytes, self._refetch_s(target, entry.size_bytes)
        )
        return True

    async def _make_room(self, index: int, size: int, exclude: Container[str]) -> bool:
        tier = self.tiers[index]
        if tier.free_bytes >= size:
            return True
        for victim in self._policies[index].victims():
            entry = self._entries.get(victim)
            if victim in exclude or entry is None or entry.pinned:
                continue
            await self._evict(victim, entry, index)
            if tier.free_bytes >= size:
                return True
        return tier.free_bytes >= size

    async def _evict(self, key: str, entry: _Entry, index: int) -> None:
        """Move ``key``'s copy out of tier ``index``: down into the next tier when that is a
        volatile tier without a copy (a victim cache: warm objects stay in memory), or when it
        is the only copy (write-back); otherwise the copy is simply dropped."""
        below = index + 1
        only_copy = entry.copies == [index]
        if (
            below < len(self.tiers)
            and below not in entry.copies
            and (only_copy or not self.tiers[below].supports_persistence)
        ):
            moved = await self._make_room(below, entry.size_bytes, exclude=(key,)) and (
                await self._copy_to(key, entry, below)
            )
            if moved:
                self.counters[index].demotions += 1
            elif only_copy:
                return  # nowhere to put the only copy: it stays
        elif only_copy:
            return  # the last tier cannot evict its only copy
        await self._drop_copy(key, index)
        entry.copies.remove(index)
        self.counters[index].evictions += 1
        self.counters[index].bytes_out += entry.size_bytes

    async def _try_put(self, index: int, key: str, data: Any) -> bool:
        try:
            await self.tiers[index].put(key, data)
        except CapacityError:  # fragmented: free bytes were enough, one hole was not
            return False
        return True

    async def _drop_copy(self, key: str, index: int) -> None:
        await self.tiers[index].delete(key)
        self._policies[index].forget(key)

    def _refetch_s(self, index: int, size: int) -> float:
        """What losing this copy costs: reading it back from the tier below."""
        below = self.tiers[min(index + 1, len(self.tiers) - 1)]
        return below.estimated_read_s(size)

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
