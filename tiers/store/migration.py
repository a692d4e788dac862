"""StoreMigration: how a TieredStore moves copies between tiers: promotion, eviction, demotion.

A read served below the top promotes the object (unless the top tier is full and its policy
refuses the key: ``EvictionPolicy.admission``, TinyLFU's): at once, in the get, when that takes
only memory copies and drops (``_promote_now``: the store's lock is free, the target is a memory
tier and every victim it evicts has a copy elsewhere, so the get does one copy into the arena
instead of a private copy and a background task, ~15 us less per 64 KiB miss); otherwise as a
background task (``_promote``) that takes the lock and may write a victim down (write-back, maybe
I/O), so a get never waits for I/O of a migration. Eviction drops a copy when another exists and
otherwise demotes it one tier down, recursively.

Concurrency: loop thread only. Migrations hold the store's asyncio lock across their awaits;
``_promote_now`` never awaits and runs only while that lock is free, so it cannot interleave
with a put or a background migration half-way.
Invariants: ``_entries[key].copies`` lists, ascending, exactly the tiers holding ``key``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tiers.io.buffers import as_buffer
from tiers.io.byte_views import host_bytes, is_tensor
from tiers.io.errors import CapacityError, InvalidArgumentError
from tiers.memory.arena import ArenaTier
from tiers.storage.tier import Tier
from tiers.store.policy import EvictionPolicy
from tiers.store.stats import TierCounters

__all__ = ["Entry", "StoreMigration", "private_copy"]


@dataclass(slots=True)
class Entry:
    size_bytes: int
    copies: list[int] = field(default_factory=list)
    pinned: bool = False


def private_copy(data: Any, size_bytes: int) -> Any:
    """The first ``size_bytes`` of ``data`` (the caller's buffer may be larger), copied so the
    caller cannot change them under us: a uint8 numpy array, or a torch tensor on its device."""
    if is_tensor(data):
        import torch  # only reached with a torch tensor in hand

        return data.detach().reshape(-1).view(torch.uint8)[:size_bytes].clone()
    return np.frombuffer(as_buffer(data).memoryview(0, size_bytes), np.uint8).copy()


class StoreMigration:
    """Mixed into TieredStore; the attributes below are the store's."""

    tiers: list[Tier]
    counters: list[TierCounters]
    promote_on_hit: bool
    _policies: list[EvictionPolicy]
    _entries: dict[str, Entry]
    _lock: asyncio.Lock
    _promoting: set[str]
    _tasks: set[asyncio.Future[None]]
    _memory: list[ArenaTier | None]  # per tier: itself where it is a memory (arena) tier

    def _promote_after_hit(self, key: str, entry: Entry, result: Any, whole: bool) -> None:
        """A get of ``key`` served below the top returned ``result`` (the whole object when
        ``whole``): promote it now if that is only memory work, else in the background."""
        if not self.promote_on_hit or entry.pinned or key in self._promoting:
            return
        top = self._policies[0]
        if top.admission and self.tiers[0].free_bytes < entry.size_bytes and not top.admits(key):
            return  # the top tier's policy keeps what it holds: no copy, no eviction
        if whole and self._promote_now(key, entry, result):
            return
        # Hand the bytes just read to the promotion (a memory copy: the caller owns ``result``)
        # so a miss costs one read of the slow tier, not two.
        staged = private_copy(result, entry.size_bytes) if whole else None
        self._promoting.add(key)
        self._spawn(self._promote(key, entry, staged))

    def _promote_now(self, key: str, entry: Entry, result: Any) -> bool:
        """``_promote`` without an await, from the bytes a get returned; False (maybe having
        evicted some victims, as ``_promote`` would) when it needs the background path."""
        if self._lock.locked() or self._entries.get(key) is not entry or not entry.copies[0]:
            return False
        size = entry.size_bytes
        for target in range(entry.copies[0]):
            tier = self._memory[target]
            if tier is None:
                return False
            if size > tier.capacity_bytes:
                continue
            source = _host_view(result, size)
            if source is None or not self._room_now(target, size, key):
                return False
            try:
                tier.put_now(key, source)
            except CapacityError:  # fragmented: the background path tries the next tier
                return False
            self._admitted(key, entry, target)
            self.counters[target].promotions += 1
            return True
        return False

    def _room_now(self, index: int, size: int, key: str) -> bool:
        """``_make_room`` for a memory tier, by drops only: False at the first victim that
        would need a demotion (a copy down, maybe I/O)."""
        tier = self._memory[index]
        assert tier is not None
        if tier.free_bytes >= size:
            return True
        below = index + 1
        for victim in self._policies[index].victims():
            entry = self._entries.get(victim)
            if victim == key or entry is None or entry.pinned:
                continue
            only_copy = entry.copies == [index]
            if (
                below < len(self.tiers)
                and below not in entry.copies
                and (only_copy or not self.tiers[below].supports_persistence)
            ):
                return False
            if only_copy:
                continue  # the last tier cannot evict its only copy
            tier.delete_now(victim)
            self._policies[index].forget(victim)
            entry.copies.remove(index)
            self.counters[index].evictions += 1
            self.counters[index].bytes_out += entry.size_bytes
            if tier.free_bytes >= size:
                return True
        return tier.free_bytes >= size

    def _admitted(self, key: str, entry: Entry, target: int) -> None:
        entry.copies = sorted({*entry.copies, target})
        self.counters[target].bytes_in += entry.size_bytes
        self._policies[target].admit(
            key, entry.size_bytes, self._refetch_s(target, entry.size_bytes)
        )

    async def _promote(self, key: str, seen: Entry | None = None, staged: Any = None) -> bool:
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

    async def _promote_into(self, target: int, key: str, entry: Entry, staged: Any) -> bool:
        if entry.size_bytes > self.tiers[target].capacity_bytes:
            return False
        return await self._make_room(target, entry.size_bytes, exclude=(key,)) and (
            await self._copy_to(key, entry, target, staged)
        )

    async def _copy_to(self, key: str, entry: Entry, target: int, data: Any = None) -> bool:
        if data is None:
            data = await self.tiers[entry.copies[0]].get(key)
        if data is None or not await self._try_put(target, key, data):
            return False
        self._admitted(key, entry, target)
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

    async def _evict(self, key: str, entry: Entry, index: int) -> None:
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


def _host_view(result: Any, size_bytes: int) -> np.ndarray | None:
    """The first ``size_bytes`` of a get's result as host bytes; None for device tensors."""
    try:
        view = host_bytes(result)
    except InvalidArgumentError:
        return None
    return view[:size_bytes] if view.size >= size_bytes else None
