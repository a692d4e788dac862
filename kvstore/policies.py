"""Block eviction policies: which cached KV blocks leave first when the store is full.

A policy tracks the blocks of one store by object key. ``admit`` when a block is stored (with
its parent's key, if the parent is cached, and its depth in the chain), ``touch`` on a lookup
hit, ``forget`` when it leaves, and ``victims()`` yields keys, best to evict first, until the
caller has freed enough (the caller skips pinned blocks).

* ``lru``: least recently used first (tiers' LruPolicy). A request's lookup touches its chain
  root first, so within one chain LRU evicts the root first: a hit needs the whole prefix, and
  evicting a root makes every cached descendant unreachable.
* ``cost``: the tiered store's GreedyDual-Size-Frequency (tiers' CostAwarePolicy), with the
  refetch cost of a block the compute to recompute it: a prefill of ``block_tokens`` whose
  attention spans the whole prefix, so a deeper block costs more (``recompute_cost``).
* ``prefix``: knows the chains. Only leaves (blocks with no cached child) are victims, the
  least valuable first (LFU with dynamic aging, by log hits); a parent becomes a victim once
  its last cached child leaves. A block whose descendants are cached is worth at least as
  much as they are: every hit on them is a hit on it. When every leaf is pinned it falls
  back to the same order over the rest.
* ``prefix-admit``: ``prefix`` behind a learned admission filter (kvstore.admission): the
  blocks of a ``store`` whose class (position from the chain's end) is reused far less than
  the average are not cached at all, so one-use blocks do not push out reused ones.

Concurrency: not thread-safe; owned by one KVBlockStore (its loop thread).
"""

from __future__ import annotations

import abc
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator

from kvstore.admission import AdmissionFilter
from tiers import InvalidArgumentError
from tiers.store import CostAwarePolicy, LruPolicy

__all__ = ["BLOCK_POLICIES", "BlockPolicy", "make_block_policy", "recompute_cost"]


def recompute_cost(depth: int) -> float:
    """Relative cost of recomputing the block at ``depth`` (0: a chain's first block): its
    projections and MLP (1) plus attention over the ``depth`` blocks before it, which is
    about a tenth of a block's FLOPs per block of context for 7B-class models at 512 tokens."""
    return 1.0 + 0.1 * depth


class BlockPolicy(abc.ABC):
    name = "abstract"
    # which stored blocks to cache at all; None: every block that fits
    admission: AdmissionFilter | None = None

    def size_for(self, capacity_blocks: int) -> None:  # noqa: B027 (optional hook)
        """Told once by the store: how many blocks its last tier holds."""

    @abc.abstractmethod
    def admit(self, key: str, parent: str | None, depth: int) -> None: ...

    def admit_many(self, blocks: Iterable[tuple[str, str | None, int]]) -> None:
        """``admit`` each (key, parent, depth), parents before their children or not."""
        for key, parent, depth in blocks:
            self.admit(key, parent, depth)

    @abc.abstractmethod
    def touch(self, key: str) -> None: ...

    @abc.abstractmethod
    def forget(self, key: str) -> None: ...

    @abc.abstractmethod
    def victims(self) -> Iterator[str]:
        """Keys in eviction order; valid while the caller only ``forget``s yielded keys."""


class LruBlockPolicy(BlockPolicy):
    name = "lru"

    def __init__(self) -> None:
        self._lru = LruPolicy()

    def admit(self, key: str, parent: str | None, depth: int) -> None:
        self._lru.admit(key, 1, 0.0)

    def touch(self, key: str) -> None:
        self._lru.touch(key)

    def forget(self, key: str) -> None:
        self._lru.forget(key)

    def victims(self) -> Iterator[str]:
        return self._lru.victims()


class CostBlockPolicy(BlockPolicy):
    name = "cost"

    def __init__(self) -> None:
        self._cost = CostAwarePolicy()

    def admit(self, key: str, parent: str | None, depth: int) -> None:
        self._cost.admit(key, 1, recompute_cost(depth))

    def touch(self, key: str) -> None:
        self._cost.touch(key)

    def forget(self, key: str) -> None:
        self._cost.forget(key)

    def victims(self) -> Iterator[str]:
        return self._cost.victims()


class PrefixBlockPolicy(BlockPolicy):
    """Leaves first; among leaves, the lowest ``clock + log2(1 + hits)`` first, where the clock
    is the priority of the last victim (LFU with dynamic aging: a block reused often outlives
    a block used once, and a long-idle one still ages out). A lazy min-heap of (priority,
    tick, key) over the leaves: an entry is live while its key is a leaf and the entry is the
    key's newest. A forgotten block's children are cut loose (orphans: unreachable by a prefix
    lookup until their parent is stored again, which links only blocks stored after it).

    Why frequency: in the Mooncake conversation trace a block seen once is seen again 26% of
    the time, one seen twice 42%, three times 50%; why the logarithm: a chain's root is hit
    by every request of its conversations, and its leaves should not need as many hits to
    stay (hit rate at 5/10/25% of the trace's blocks: see benchmarks/RESULTS.md)."""

    name = "prefix"

    def __init__(self) -> None:
        self._tick = itertools.count()
        self._clock = 0.0
        self._hits: dict[str, int] = {}
        self._entry: dict[str, tuple[float, int]] = {}  # key -> its newest (priority, tick)
        self._parent: dict[str, str | None] = {}
        self._children: dict[str, set[str]] = {}
        self._leaves: list[tuple[float, int, str]] = []

    def admit(self, key: str, parent: str | None, depth: int) -> None:
        if key in self._hits:
            self.touch(key)
            return
        parent = parent if parent in self._hits else None
        self._parent[key] = parent
        self._children[key] = set()
        if parent is not None:
            self._children[parent].add(key)
        self._hits[key] = 1
        self._use(key)

    def admit_many(self, blocks: Iterable[tuple[str, str | None, int]]) -> None:
        """A reopen's bulk admit: one heapify, not a push per block."""
        fresh = [block for block in blocks if block[0] not in self._hits]
        for key, _, _ in fresh:
            self._hits[key] = 1
            self._entry[key] = (1.0, next(self._tick))
            self._children[key] = set()
        for key, parent, _ in fresh:
            parent = parent if parent in self._hits else None
            self._parent[key] = parent
            if parent is not None:
                self._children[parent].add(key)
        self._leaves.extend((*self._entry[k], k) for k, _, _ in fresh if not self._children[k])
        heapq.heapify(self._leaves)

    def touch(self, key: str) -> None:
        if key in self._hits:
            self._hits[key] += 1
            self._use(key)

    def forget(self, key: str) -> None:
        if self._hits.pop(key, None) is None:
            return
        del self._entry[key]
        for child in self._children.pop(key):
            self._parent[child] = None
        parent = self._parent.pop(key)
        if parent is not None:
            siblings = self._children[parent]
            siblings.discard(key)
            if not siblings:
                heapq.heappush(self._leaves, (*self._entry[parent], parent))
        if len(self._leaves) > 4 * len(self._hits) + 64:
            live = [(*e, k) for k, e in self._entry.items() if not self._children[k]]
            self._leaves = live
            heapq.heapify(self._leaves)

    def _use(self, key: str) -> None:
        entry = (self._clock + math.log2(1 + self._hits[key]), next(self._tick))
        self._entry[key] = entry
        if not self._children[key]:
            heapq.heappush(self._leaves, (*entry, key))

    def victims(self) -> Iterator[str]:
        offered: list[tuple[float, int, str]] = []
        try:
            while self._leaves:
                priority, tick, key = item = heapq.heappop(self._leaves)
                if self._entry.get(key) != (priority, tick) or self._children[key]:
                    continue  # stale: forgotten, used again since, or no longer a leaf
                offered.append(item)
                self._clock = max(self._clock, priority)
                yield key
        finally:  # offered but kept (pinned, or the caller had enough): still leaves
            for item in offered:
                key = item[2]
                if self._entry.get(key) == item[:2] and not self._children[key]:
                    heapq.heappush(self._leaves, item)
        # every leaf was kept (pinned): the rest, lowest priority first
        for key in sorted(self._entry, key=self._entry.__getitem__):
            if key in self._entry:
                yield key


class PrefixAdmitBlockPolicy(PrefixBlockPolicy):
    """``prefix`` eviction behind an AdmissionFilter whose learning window is half the
    store's capacity in blocks (at most ``MAX_WINDOW_BLOCKS``): a block is judged by whether
    it is reused within a time the cache would have kept it."""

    name = "prefix-admit"
    MAX_WINDOW_BLOCKS = 1 << 18  # ~40 MB of hashes at most, whatever the store's size

    def __init__(self) -> None:
        super().__init__()
        self.admission = AdmissionFilter()

    def size_for(self, capacity_blocks: int) -> None:
        window = max(1, min(capacity_blocks // 2, self.MAX_WINDOW_BLOCKS))
        self.admission = AdmissionFilter(window)


BLOCK_POLICIES: dict[str, Callable[[], BlockPolicy]] = {
    "lru": LruBlockPolicy,
    "cost": CostBlockPolicy,
    "prefix": PrefixBlockPolicy,
    "prefix-admit": PrefixAdmitBlockPolicy,
}


def make_block_policy(name: str) -> BlockPolicy:
    try:
        return BLOCK_POLICIES[name]()
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"unknown block policy {name!r}; choose from {sorted(BLOCK_POLICIES)}"
        ) from None
