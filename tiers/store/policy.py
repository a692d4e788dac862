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

Concurrency: not thread-safe; owned by the TieredStore (loop thread).
"""

from __future__ import annotations

import abc
import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator

from tiers.io.errors import InvalidArgumentError

__all__ = ["POLICIES", "CostAwarePolicy", "EvictionPolicy", "LfuPolicy", "LruPolicy", "make_policy"]


class EvictionPolicy(abc.ABC):
    name = "abstract"

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


POLICIES: dict[str, Callable[[], EvictionPolicy]] = {
    "lru": LruPolicy,
    "lfu": LfuPolicy,
    "cost": CostAwarePolicy,
}


def make_policy(name: str) -> EvictionPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise InvalidArgumentError(
            f"unknown eviction policy {name!r}; choose from {sorted(POLICIES)}"
        ) from None
