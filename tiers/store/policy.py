"""Eviction policies: which objects leave a full tier first. Pure bookkeeping, no I/O.

A policy tracks the objects of one tier. ``admit`` when an object arrives, ``touch`` on every
hit, ``forget`` when it leaves, and ``victims()`` yields candidates, best to evict first, until
the caller has freed enough (the caller skips pinned objects).

* ``lru``: least recently used first (an OrderedDict: O(1) per operation).
* ``lfu``: least frequently used first, ties by age (a lazy heap).
* ``cost``: GreedyDual-Size-Frequency. Priority = clock + hits x refetch_cost_s / size_bytes;
  evicting an object advances the clock to its priority, so long-idle objects age out. Small,
  hot objects that are slow to fetch back stay; big cold ones go first. Refetch cost is what
  the tier below would take to return the object (Tier.estimated_read_s).
* ``tinylfu``: least frequently used first, by an aged count of every get of the key (hits and
  misses alike, kept after the key leaves), and TinyLFU's admission: a promotion into a full
  tier happens only for a key asked more often than the one it would push out
  (``admission``, ``note_miss``, ``admits``), so one-off reads of cold keys neither evict warm
  ones nor pay a copy into the tier. Size-blind: a key admitted may push out several smaller
  ones, each compared with nothing.

Concurrency: not thread-safe; owned by the TieredStore (loop thread).
"""

from __future__ import annotations

import abc
import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator

from tiers.io.errors import InvalidArgumentError

__all__ = [
    "POLICIES",
    "CostAwarePolicy",
    "EvictionPolicy",
    "LfuPolicy",
    "LruPolicy",
    "TinyLfuPolicy",
    "make_policy",
]


class EvictionPolicy(abc.ABC):
    name = "abstract"
    admission = False  # True: ``admits`` may refuse a promotion (the store asks it first)

    def note_miss(self, key: str) -> None:
        """A get of ``key`` looked past this tier (served below it)."""
        return None  # only admission policies count these

    def admits(self, key: str) -> bool:
        """Whether ``key`` (not in the tier) is worth what a full tier would evict for it."""
        return True

    @abc.abstractmethod
    def admit(self, key: str, size_bytes: int, refetch_cost_s: float) -> None: ...

    @abc.abstractmethod
    def touch(self, key: str) -> None: ...

    @abc.abstractmethod
    def forget(self, key: str) -> None: ...

    @abc.abstractmethod
    def victims(self) -> Iterator[str]:
        """Keys in eviction order; valid while the caller only ``forget``s yielded keys."""


class LruPolicy(EvictionPolicy):
    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[str, None] = OrderedDict()

    def admit(self, key: str, size_bytes: int, refetch_cost_s: float) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def touch(self, key: str) -> None:
        try:  # noqa: SIM105  (suppress() costs more than the second lookup it saves)
            self._order.move_to_end(key)
        except KeyError:
            pass

    def forget(self, key: str) -> None:
        self._order.pop(key, None)

    def victims(self) -> Iterator[str]:
        # Snapshots of 64 from the cold end: O(1) per victim; a key yielded but kept (pinned)
        # stays at the front, so the next snapshot starts after the ones kept so far.
        kept = 0
        while True:
            chunk = list(itertools.islice(self._order, kept, kept + 64))
            if not chunk:
                return
            for key in chunk:
                if key in self._order:
                    yield key
                    kept += key in self._order


class _HeapPolicy(EvictionPolicy):
    """Lazy min-heap of (priority, tie, key). A hit only counts (O(1), no heap work); a key
    whose count moved since it was pushed is re-pushed with its new priority when it surfaces
    as a victim, which gives the same order as eager updates at a fraction of the cost."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._current: dict[str, tuple[float, int, int]] = {}  # key -> (priority, tie, hits)
        self._meta: dict[str, tuple[int, float]] = {}  # key -> (size, refetch cost)
        self._hits: dict[str, int] = {}
        self._tick = itertools.count()

    @abc.abstractmethod
    def _priority(self, size_bytes: int, cost_s: float, hits: int) -> float:
        """Eviction priority: the lowest goes first."""

    def _push(self, key: str) -> None:
        size, cost = self._meta[key]
        hits = self._hits[key]
        priority, tie = self._priority(size, cost, hits), next(self._tick)
        self._current[key] = (priority, tie, hits)
        heapq.heappush(self._heap, (priority, tie, key))
        if len(self._heap) > 4 * len(self._current) + 64:  # compact away stale entries
            self._heap = [(p, t, k) for k, (p, t, _) in self._current.items()]
            heapq.heapify(self._heap)

    def admit(self, key: str, size_bytes: int, refetch_cost_s: float) -> None:
        self._meta[key] = (max(size_bytes, 1), refetch_cost_s)
        self._hits[key] = self._hits.get(key, 0) + 1
        self._push(key)

    def touch(self, key: str) -> None:
        hits = self._hits.get(key)
        if hits is not None:
            self._hits[key] = hits + 1

    def forget(self, key: str) -> None:
        self._meta.pop(key, None)
        self._current.pop(key, None)
        self._hits.pop(key, None)

    def victims(self) -> Iterator[str]:
        popped: list[tuple[float, int, str]] = []
        try:
            while self._heap:
                entry = heapq.heappop(self._heap)
                priority, tie, key = entry
                current = self._current.get(key)
                if current is None or current[:2] != (priority, tie):
                    continue  # stale: forgotten, or re-pushed since
                if current[2] != self._hits[key]:
                    self._push(key)  # hit since it was pushed: its priority went up
                    continue
                popped.append(entry)
                self._evicted(priority)
                yield key
        finally:  # offered but not evicted (pinned, or the caller had enough): put back
            for entry in popped:
                current = self._current.get(entry[2])
                if current is not None and current[:2] == entry[:2]:
                    heapq.heappush(self._heap, entry)

    def _evicted(self, priority: float) -> None:
        """Called as a victim is offered."""


class LfuPolicy(_HeapPolicy):
    name = "lfu"

    def _priority(self, size_bytes: int, cost_s: float, hits: int) -> float:
        return float(hits)


class CostAwarePolicy(_HeapPolicy):
    name = "cost"

    def __init__(self) -> None:
        super().__init__()
        self._clock = 0.0

    def _priority(self, size_bytes: int, cost_s: float, hits: int) -> float:
        return self._clock + hits * cost_s / size_bytes

    def _evicted(self, priority: float) -> None:
        self._clock = max(self._clock, priority)


class TinyLfuPolicy(EvictionPolicy):
    """LFU over an aged count of gets, with TinyLFU admission (Einziger et al., 2017).

    ``_freq`` counts every get of a key, in the tier or not, and outlives its stay; once the
    counts added up to ``SAMPLE_PER_OBJECT`` times the keys held (at least ``MIN_SAMPLE``),
    every count is halved, so the table stays small and old popularity fades. Residents sit in
    a lazy min-heap of (count when pushed, tie, key): a count that grew since is re-pushed when
    it surfaces; aging rebuilds the heap, so it never holds counts above the current ones.
    """

    name = "tinylfu"
    admission = True
    SAMPLE_PER_OBJECT = 10
    MIN_SAMPLE = 1024

    def __init__(self) -> None:
        self._freq: dict[str, int] = {}
        self._heap: list[tuple[int, int, str]] = []
        self._current: dict[str, tuple[int, int]] = {}  # resident key -> (count pushed, tie)
        self._tick = itertools.count()
        self._events = 0
        self.rejected = 0  # promotions ``admits`` refused

    def _count(self, key: str) -> None:
        freq = self._freq
        freq[key] = freq.get(key, 0) + 1
        self._events += 1
        if self._events >= self.SAMPLE_PER_OBJECT * len(self._current) + self.MIN_SAMPLE:
            self._age()

    def _age(self) -> None:
        self._events = 0
        self._freq = {k: v >> 1 for k, v in self._freq.items() if v > 1}
        freq, tick = self._freq, self._tick
        self._current = {k: (freq.get(k, 0), next(tick)) for k in self._current}
        self._heap = [(f, t, k) for k, (f, t) in self._current.items()]
        heapq.heapify(self._heap)

    def _push(self, key: str) -> None:
        entry = (self._freq.get(key, 0), next(self._tick))
        self._current[key] = entry
        heapq.heappush(self._heap, (*entry, key))

    def admit(self, key: str, size_bytes: int, refetch_cost_s: float) -> None:
        if key not in self._freq:  # a put: one use; a promotion was counted by note_miss
            self._count(key)
        self._push(key)
        # compact away stale entries here, never inside ``victims`` (whose popped entries
        # would then come back twice)
        if len(self._heap) > 4 * len(self._current) + 64:
            self._heap = [(f, t, k) for k, (f, t) in self._current.items()]
            heapq.heapify(self._heap)

    def touch(self, key: str) -> None:
        self._count(key)

    def note_miss(self, key: str) -> None:
        self._count(key)

    def forget(self, key: str) -> None:
        self._current.pop(key, None)  # the count stays: it is the key's history

    def _coldest(self) -> tuple[int, int, str] | None:
        """The heap's first live entry with its current count (re-pushing grown ones)."""
        heap, current, freq = self._heap, self._current, self._freq
        while heap:
            entry = heap[0]
            count, tie, key = entry
            if current.get(key) != (count, tie):
                heapq.heappop(heap)  # stale: forgotten, or re-pushed since
            elif freq.get(key, 0) != count:
                heapq.heappop(heap)
                self._push(key)  # used since it was pushed: its count went up
            else:
                return entry
        return None

    def admits(self, key: str) -> bool:
        coldest = self._coldest()
        if coldest is None or self._freq.get(key, 0) > coldest[0]:
            return True
        self.rejected += 1
        return False

    def victims(self) -> Iterator[str]:
        popped: list[tuple[int, int, str]] = []
        try:
            while (entry := self._coldest()) is not None:
                popped.append(heapq.heappop(self._heap))
                yield entry[2]
        finally:  # offered but not evicted (pinned, or the caller had enough): put back
            for entry in popped:
                if self._current.get(entry[2]) == entry[:2]:
                    heapq.heappush(self._heap, entry)


POLICIES: dict[str, Callable[[], EvictionPolicy]] = {
    "lru": LruPolicy,
    "lfu": LfuPolicy,
    "cost": CostAwarePolicy,
    "tinylfu": TinyLfuPolicy,
}


def make_policy(name: str) -> EvictionPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise InvalidArgumentError(
            f"unknown eviction policy {name!r}; choose from {sorted(POLICIES)}"
        ) from None
