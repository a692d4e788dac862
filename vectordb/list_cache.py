"""ListCache: hot posting lists kept in DRAM, within what the index's memory budget leaves.

A disk index exists for data larger than memory, but most of its reads go to a few lists (the
heads near where queries fall). What the budget leaves after the heads and the read buffers
holds copies of lists in a ``DramTier`` (tiers.memory: one arena, no allocation per list); a
search copies a cached list into its read buffer instead of reading it (posting_reads), and
the copy is checked there like a read one (every record's check word), so a cached list is
verified on every use.

Which lists stay is the tiered store's eviction policy (``lfu`` by default: queries fall on
the same heads over and over). Admission is gated by frequency: once the cache is full, a list
comes in only when it has been needed more often than the policy's first victim, so one batch
sweeping cold lists does not flush the hot ones (a scan-resistant cache; the counts are halved
every ``10 x`` lists, so popularity can move).

Validity: an entry is the copy of a list as it was at (start page, record count). A list that
changes gets a new start (rewritten) or a new count (appended in place), so a stale entry never
matches; the store drops the entries of lists it writes (``note_changed``): a list
rewritten twice could come back to its old start with as many records.
Thread-safety: the index's loop thread only (DramTier's rule).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tiers import DramTier
from tiers.store import POLICIES

__all__ = ["ListCache"]


class ListCache:
    def __init__(self, capacity_bytes: int, policy: str = "lfu") -> None:
        """``capacity_bytes`` 0 caches nothing (every call is then a cheap no-op)."""
        self.capacity_bytes = max(0, int(capacity_bytes))
        self._tier = (
            DramTier("vectordb-lists", self.capacity_bytes, pinned=False)
            if self.capacity_bytes
            else None
        )
        self._policy = POLICIES[policy]()
        # pid -> (start page, records) of its copy; start -1: none (arrays: one lookup per read)
        self._tag_start = np.full(0, -1, np.int64)
        self._tag_count = np.zeros(0, np.int64)
        self._lists = 0
        self._stale: list[str] = []  # keys whose lists changed, still in the tier
        self._wanted = np.zeros(0, np.uint16)  # pid -> how often a search needed it (decaying)
        self._wanted_events = 0
        self.hits = self.misses = self.admitted = self.refused = 0

    @property
    def used_bytes(self) -> int:
        return self._tier.used_bytes if self._tier is not None else 0

    def lookup(self, pids: np.ndarray, start: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Which of ``pids`` (unique; their current ``start`` and ``count``) have a valid
        copy. Counts the need of every list for admission."""
        self._note_wanted(pids)
        hit = np.zeros(len(pids), bool)
        if self._tier is None or not self._lists:
            self.misses += len(pids)
            return hit
        inside = pids < len(self._tag_start)
        at = np.where(inside, pids, 0)
        hit = inside & (self._tag_start[at] == start) & (self._tag_count[at] == count)
        n_hit = int(hit.sum())
        self.hits += n_hit
        self.misses += len(pids) - n_hit
        return hit

    async def copy_into(self, pids: np.ndarray, views: list[np.ndarray]) -> np.ndarray:
        """Copy each list into its view; returns which were copied (a list evicted since its
        lookup is not, and must be read)."""
        if self._tier is None:
            return np.zeros(len(pids), bool)
        keys = [str(pid) for pid in pids.tolist()]
        done = await self._tier.get_many(keys, into=views)
        for key, out in zip(keys, done, strict=True):
            if out is not None:
                self._policy.touch(key)
        return np.array([out is not None for out in done], bool)

    async def admit(
        self, pids: np.ndarray, start: np.ndarray, count: np.ndarray, views: list[Any]
    ) -> None:
        """Offer lists just read and verified (their bytes in ``views``, whole pages)."""
        tier = self._tier
        if tier is None:
            return
        if self._stale:
            await self._purge()
        for pid, first, n, view in zip(
            pids.tolist(), start.tolist(), count.tolist(), views, strict=True
        ):
            size = len(view)
            if size == 0 or size > self.capacity_bytes or self._has(pid):
                continue
            if size > tier.free_bytes and not await self._make_room(size, int(self._wanted[pid])):
                self.refused += 1
                continue
            key = str(pid)
            await tier.put(key, view)
            self._policy.admit(key, size, 0.0)
            self._set_tag(pid, first, n)
            self.admitted += 1

    def note_changed(self, pids: Any) -> None:
        """Lists rewritten, appended to or removed: their copies are no longer used (their
        memory is freed by the next admission)."""
        for pid in np.atleast_1d(np.asarray(pids, np.int64)).tolist():
            if self._pop_tag(pid):
                self._stale.append(str(pid))

    async def _purge(self) -> None:
        assert self._tier is not None
        stale, self._stale = self._stale, []
        for key in stale:
            if not self._has(int(key)):  # not admitted again meanwhile
                self._policy.forget(key)
                await self._tier.delete(key)

    async def _make_room(self, size_bytes: int, wanted: int) -> bool:
        """Evict colder lists until ``size_bytes`` fit; False (nothing evicted) when the first
        victims are needed at least as often as the newcomer."""
        tier = self._tier
        assert tier is not None
        chosen: list[str] = []
        freed = tier.free_bytes
        for key in self._policy.victims():
            if int(self._wanted[int(key)]) >= wanted:
                break
            chosen.append(key)
            freed += tier.size_of(key) or 0
            if freed >= size_bytes:
                break
        if freed < size_bytes:
            return False
        for key in chosen:
            self._policy.forget(key)
            self._pop_tag(int(key))
            await tier.delete(key)
        return tier.free_bytes >= size_bytes

    def _has(self, pid: int) -> bool:
        return pid < len(self._tag_start) and self._tag_start[pid] >= 0

    def _set_tag(self, pid: int, start: int, count: int) -> None:
        self._tag_start = _grown(self._tag_start, pid + 1, -1)
        self._tag_count = _grown(self._tag_count, pid + 1, 0)
        self._lists += not self._has(pid)
        self._tag_start[pid], self._tag_count[pid] = start, count

    def _pop_tag(self, pid: int) -> bool:
        if not self._has(pid):
            return False
        self._tag_start[pid] = -1
        self._lists -= 1
        return True

    def _note_wanted(self, pids: np.ndarray) -> None:
        if len(pids) == 0:
            return
        self._wanted = _grown(self._wanted, int(pids.max()) + 1, 0)
        self._wanted[pids] += 1  # a read names a list once; halved below long before 65,535
        self._wanted_events += len(pids)
        if self._wanted_events > 10 * len(self._wanted) or self._wanted[pids].max() > 60_000:
            self._wanted >>= 1
            self._wanted_events = 0

    def stats(self) -> dict[str, Any]:
        looked = self.hits + self.misses
        return {
            "list_cache_capacity_bytes": self.capacity_bytes,
            "list_cache_bytes": self.used_bytes,
            "list_cache_lists": self._lists,
            "list_cache_hits": self.hits,
            "list_cache_misses": self.misses,
            "list_cache_hit_rate": self.hits / looked if looked else 0.0,
            "list_cache_admitted": self.admitted,
            "list_cache_refused": self.refused,
        }

    async def aclose(self) -> None:
        if self._tier is not None:
            await self._tier.aclose()
        self._tag_start[:] = -1
        self._lists = 0


def _grown(array: np.ndarray, length: int, fill: int) -> np.ndarray:
    """``array`` itself if it holds ``length`` entries, else a copy at least twice as long,
    the new entries ``fill`` (pids grow as heads split)."""
    if length <= len(array):
        return array
    grown = np.full(max(length, 2 * len(array), 64), fill, array.dtype)
    grown[: len(array)] = array
    return grown
