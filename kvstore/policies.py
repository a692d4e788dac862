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
* ``prefix``: knows the chains. Only leaves (blocks with no cached child) are victims, least
  recently used first; a parent becomes a victim once its last cached child leaves. A block
  whose descendants are cached is worth at least as much as they are: every hit on them is a
  hit on it. When every leaf is pinned it falls back to LRU over the rest.

Concurrency: not thread-safe; owned by one KVBlockStore (its loop thread).
"""

from __future__ import annotations

import abc
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator

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
    """Leaves first, least recently used first. A lazy min-heap of (last use, key) over the
    leaves: an entry is live while its key is a leaf and its tick is the key's last use. A
    forgotten block's children are cut loose (orphans: unreachable by a prefix lookup until
    their parent is stored again, which links only blocks stored after it)."""

    name = "prefix"

    def __init__(self) -> None:
        self._tick = itertools.count()
        self._last: dict[str, int] = {}
        self._parent: dict[str, str | None] = {}
        self._children: dict[str, set[str]] = {}
        self._leaves: list[tuple[int, str]] = []

    def admit(self, key: str, parent: str | None, depth: int) -> None:
        if key in self._last:
            self.touch(key)
            return
        parent = parent if parent in self._last else None
        self._parent[key] = parent
        self._children[key] = set()
        if parent is not None:
            self._children[parent].add(key)
        self._use(key)

    def admit_many(self, blocks: Iterable[tuple[str, str | None, int]]) -> None:
        """A reopen's bulk admit: one heapify, not a push per block."""
        fresh = [block for block in blocks if block[0] not in self._last]
        for key, _, _ in fresh:
            self._last[key] = next(self._tick)
            self._children[key] = set()
        for key, parent, _ in fresh:
            parent = parent if parent in self._last else None
            self._parent[key] = parent
            if parent is not None:
                self._children[parent].add(key)
        self._leaves.extend((self._last[k], k) for k, _, _ in fresh if not self._children[k])
        heapq.heapify(self._leaves)

    def touch(self, key: str) -> None:
        if key in self._last:
            self._use(key)

    def forget(self, key: str) -> None:
        if self._last.pop(key, None) is None:
            return
        for child in self._children.pop(key):
            self._parent[child] = None
        parent = self._parent.pop(key)
        if parent is not None:
            siblings = self._children[parent]
            siblings.discard(key)
            if not siblings:
                heapq.heappush(self._leaves, (self._last[parent], parent))
        if len(self._leaves) > 4 * len(self._last) + 64:
            self._leaves = [(t, k) for k, t in self._last.items() if not self._children[k]]
            heapq.heapify(self._leaves)

    def _use(self, key: str) -> None:
        tick = next(self._tick)
        self._last[key] = tick
        if not self._children[key]:
            heapq.heappush(self._leaves, (tick, key))

    def victims(self) -> Iterator[str]:
        offered: list[tuple[int, str]] = []
        try:
            while self._leaves:
                tick, key = heapq.heappop(self._leaves)
                if self._last.get(key) != tick or self._children[key]:
                    continue  # stale: forgotten, used again since, or no longer a leaf
                offered.append((tick, key))
                yield key
        finally:  # offered but kept (pinned, or the caller had enough): still leaves
            for tick, key in offered:
                if self._last.get(key) == tick and not self._children[key]:
                    heapq.heappush(self._leaves, (tick, key))
        # every leaf was kept (pinned): the rest, least recently used first
        for key in sorted(self._last, key=self._last.__getitem__):
            if key in self._last:
                yield key


BLOCK_POLICIES: dict[str, Callable[[], BlockPolicy]] = {
    "lru": LruBlockPolicy,
    "cost": CostBlockPolicy,
    "prefix": PrefixBlockPolicy,
}


def make_block_policy(name: str) -> BlockPolicy:
    try:
        return BLOCK_POLICIES[name]()
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"unknown block policy {name!r}; choose from {sorted(BLOCK_POLICIES)}"
        ) from None
