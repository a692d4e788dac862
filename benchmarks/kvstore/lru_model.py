"""Plain LRU caches replaying a trace as an LLM server uses a KV store: the references the
store's "lru" policy is checked against.

``lru_prefix_hits`` is the textbook cache. Per request: the hits are the longest cached prefix
of its chain (those blocks become the most recent, in chain order); then the rest of the chain
is stored block by block, each the most recent, evicting the least recent while over capacity.

``lru_store_model_hits`` is the same LRU with the store's write rules (kvstore.block_store
``store``), which differ where a request's chain crowds the cache: room is made before the
blocks go in, never by evicting the blocks being stored or their parent; a chain longer than
the free room keeps its first blocks (a later block is useless without them); a block already
cached past the prefix is skipped, not refreshed. The store's "lru" must match it exactly.

``lru_oracle_admission_hits`` is the textbook LRU that stores only blocks the trace uses again
(an admission oracle, offline): how much of the gap to Belady is *which* blocks to admit rather
than which to evict. An online store cannot know this; the figure bounds what a perfect
admission rule in front of LRU would give.

Hit rate = prefix hits / accesses. Thread-safety: pure functions.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["lru_oracle_admission_hits", "lru_prefix_hits", "lru_store_model_hits"]


def _prefix(chain: Sequence[int], cache: OrderedDict[int, None]) -> int:
    cached = 0
    while cached < len(chain) and chain[cached] in cache:
        cached += 1
    for block in chain[:cached]:
        cache.move_to_end(block)
    return cached


def lru_prefix_hits(requests: Sequence[Sequence[int]], capacity_blocks: int) -> int:
    """Prefix hits of a textbook LRU cache of ``capacity_blocks`` blocks over ``requests``."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for chain in requests:
        cached = _prefix(chain, cache)
        hits += cached
        for block in chain[cached:]:
            cache[block] = None
            cache.move_to_end(block)
            while len(cache) > capacity_blocks:
                cache.popitem(last=False)
    return hits


def lru_store_model_hits(requests: Sequence[Sequence[int]], capacity_blocks: int) -> int:
    """Prefix hits of an LRU cache that writes as KVBlockStore.store does (module doc)."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for chain in requests:
        cached = _prefix(chain, cache)
        hits += cached
        fresh = list(dict.fromkeys(b for b in chain[cached:] if b not in cache))
        if not fresh:
            continue
        protected = {b for b in chain[cached:] if b in cache}
        if cached:
            protected.add(chain[cached - 1])
        fits = min(len(fresh), capacity_blocks)
        missing = fits - (capacity_blocks - len(cache))
        if missing > 0:
            victims = []
            for block in cache:
                if block not in protected:
                    victims.append(block)
                    if len(victims) == missing:
                        break
            for block in victims:
                del cache[block]
        room = min(fits, capacity_blocks - len(cache))
        for block in fresh[:room]:
            cache[block] = None
    return hits


def lru_oracle_admission_hits(requests: Sequence[Sequence[int]], capacity_blocks: int) -> int:
    """Prefix hits of a textbook LRU that admits only blocks accessed again later (module doc)."""
    last_access: dict[int, int] = {}
    position = 0
    for chain in requests:
        for block in chain:
            last_access[block] = position
            position += 1
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    position = 0
    for chain in requests:
        cached = _prefix(chain, cache)
        hits += cached
        for offset, block in enumerate(chain):
            if offset >= cached and last_access[block] > position + offset:
                cache[block] = None
                cache.move_to_end(block)
                while len(cache) > capacity_blocks:
                    cache.popitem(last=False)
        position += len(chain)
    return hits
