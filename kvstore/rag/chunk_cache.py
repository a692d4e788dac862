"""ChunkCache: retrieved chunks' KV on the tiered store, keyed by content, evicted by value.

A chunk is a variable number of tokens, so it is stored as ONE object of a ``TieredStore``
(not padded into fixed ``KVBlockStore`` blocks: a 100-token chunk in 32-token blocks would
waste up to a block each and need a chain per chunk for no prefix semantics). The NVMe tier
gives the object a checksum, verified on every read, and a durable catalog, so the cache
survives a restart; the DRAM tier above keeps hot chunks in memory.

Object: ``kvstore.rag.chunk_format`` has the byte-level spec (key, header page, KV layout
[layers, 2, kv_heads, tokens, head_dim], one layer one byte range: per-layer loads). The
namespace is the model fingerprint's digest, so one model never reads another's chunks;
the token count and the position the KV was computed at are in the key, so a reopen rebuilds
the index from the key list without reading a byte; the header repeats them and is checked
on every whole load.

Eviction by value, not recency: GreedyDual-Size-Frequency, priority = clock + (hits + 1) x
recompute cost / bytes, where the cost is the chunk's prefill FLOPs relative to a block's
(``kvstore.recompute_cost`` per 32 tokens of context); the clock rises to each victim's
priority so that long-idle chunks age out. A corrupt object (checksum or header) is dropped,
counted, and reported as a miss: the caller recomputes, never uses it.

Concurrency: one asyncio loop (the one that opened it); writes (put, drop) hold a lock;
lookups take none; loads take none and a chunk evicted while it loads reads as a miss.
"""

from __future__ import annotations

import asyncio
import heapq
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvstore.cache_tiers import open_cache_store
from kvstore.fingerprint import ModelFingerprint
from kvstore.policies import recompute_cost
from kvstore.rag.chunk_format import (
    HEADER_BYTES,
    chunk_hash,
    chunk_key,
    encode_chunk,
    header_ok,
    kv_view,
    layer_bytes,
    parse_chunk_key,
    read_header,
)
from kvstore.rag.context_stats import decode_scores
from kvstore.rag.errors import ChunkShapeError
from tiers import CorruptionError, InvalidArgumentError, TieredStore
from tiers.io import IORuntime

__all__ = ["ChunkCache", "ChunkInfo", "chunk_hash"]


@dataclass
class ChunkInfo:
    """One cached chunk: its key, shape and value bookkeeping (in memory only)."""

    key: str
    chunk_hash: bytes
    num_tokens: int
    position: int  # the first position its KV was computed at
    size_bytes: int
    context: bytes | None = None  # context_hash of the tokens before it, when its KV is exact
    scores: torch.Tensor | None = None  # per-token context attention (context_stats)
    scores_known: bool = False  # False after a reopen until the header page is read
    learned: torch.Tensor | None = None  # per-token check deviation seen (NaN: never checked)
    hits: int = 0
    priority: float = 0.0

    @property
    def cost(self) -> float:
        depth = (self.position + self.num_tokens // 2) // 32
        return self.num_tokens / 32 * recompute_cost(depth)


class ChunkCache:
    """Chunks' KV of one model (``fingerprint``) on ``store``; see the module docstring."""

    def __init__(
        self, store: TieredStore, fingerprint: ModelFingerprint, *, owns_store: bool = False
    ) -> None:
        self.fingerprint = fingerprint
        self.namespace = fingerprint.digest()
        self._store = store
        self._owns_store = owns_store
        self._lock = asyncio.Lock()
        self._chunks: dict[bytes, ChunkInfo] = {}
        self._heap: list[tuple[float, str, bytes]] = []
        self._clock = 0.0
        self.counters = dict.fromkeys(
            ("lookups", "hits", "misses", "stored", "evicted", "corrupt", "rejected"), 0
        )
        for key in store.keys(f"rag/{self.namespace}/"):
            parsed = parse_chunk_key(key)
            if parsed is not None:
                digest, num_tokens, position, context = parsed
                size = store.size_of(key) or 0
                self._admit(ChunkInfo(key, digest, num_tokens, position, size, context=context))

    @classmethod
    async def open(
        cls,
        directory: str | os.PathLike[str] | None,
        fingerprint: ModelFingerprint,
        *,
        disk_bytes: int = 0,
        dram_bytes: int = 0,
        create: bool = True,
        runtime: IORuntime | None = None,
    ) -> ChunkCache:
        """A cache with a DRAM tier of ``dram_bytes`` (0: none) above an NVMe tier of
        ``disk_bytes`` in ``directory`` (0: none, and nothing survives a restart). With
        ``create=False`` a directory that holds no cache is an error, not a new cache."""
        store = await open_cache_store(
            directory, dram_bytes=dram_bytes, disk_bytes=disk_bytes, create=create,
            runtime=runtime,
        )  # fmt: skip
        return cls(store, fingerprint, owns_store=True)

    # ------------------------------------------------------------------ reads
    def __len__(self) -> int:
        return len(self._chunks)

    def lookup(self, token_ids: Sequence[int]) -> ChunkInfo | None:
        """The cached chunk of exactly these tokens, or None (no I/O); a hit raises its
        value."""
        self.counters["lookups"] += 1
        info = self._chunks.get(chunk_hash(token_ids))
        if info is None or info.num_tokens != len(token_ids):
            self.counters["misses"] += 1
            return None
        self.counters["hits"] += 1
        info.hits += 1
        self._prioritise(info)
        return info

    def kv_shape(self, num_tokens: int) -> tuple[int, ...]:
        f = self.fingerprint
        return (f.num_layers, 2, f.num_kv_heads, num_tokens, f.head_dim)

    async def load(self, info: ChunkInfo) -> torch.Tensor | None:
        """The chunk's KV ``kv_shape(tokens)``; None when it is gone or fails its checks
        (then it is dropped: recompute it)."""
        staging = torch.empty(info.size_bytes, dtype=torch.uint8)
        if not await self._get(info, staging, None):
            return None
        header = staging[:HEADER_BYTES]
        if not header_ok(header, self.namespace, info.num_tokens, info.position, info.context):
            await self._damaged(info)
            return None
        return kv_view(self.fingerprint, staging[HEADER_BYTES:], info.num_tokens, None)

    async def scores(self, info: ChunkInfo) -> tuple[bool, torch.Tensor | None]:
        """(found, the chunk's per-token context scores or None when it was stored without).
        Kept in memory from ``put``; after a reopen read once from the header page, which is
        checked: found is False when the chunk is gone or its header fails (then it is
        dropped: recompute it)."""
        if info.scores_known:
            return True, info.scores
        staging = torch.empty(HEADER_BYTES, dtype=torch.uint8)
        if not await self._get(info, staging, (0, HEADER_BYTES)):
            return False, None
        header = read_header(staging, self.namespace, info.num_tokens, info.position,
                             info.context)  # fmt: skip
        if header is None:
            await self._damaged(info)
            return False, None
        info.scores = decode_scores(header.get("scores"), info.num_tokens)
        info.scores_known = True
        return True, info.scores

    async def load_layer(self, info: ChunkInfo, layer: int) -> torch.Tensor | None:
        """Layer ``layer`` of the chunk's KV, ``[2, kv_heads, tokens, head_dim]``; None as
        ``load``. One byte-range read: layer l can arrive while layer l - 1 computes."""
        if not 0 <= layer < self.fingerprint.num_layers:
            raise InvalidArgumentError(
                f"layer {layer} of a {self.fingerprint.num_layers}-layer model"
            )
        size = layer_bytes(self.fingerprint, info.num_tokens)
        staging = torch.empty(size, dtype=torch.uint8)
        if not await self._get(info, staging, (HEADER_BYTES + layer * size, size)):
            return None
        return kv_view(self.fingerprint, staging, info.num_tokens, 1)[0]

    # ------------------------------------------------------------------ writes
    async def put(
        self,
        token_ids: Sequence[int],
        kv: torch.Tensor,
        position: int,
        context: bytes | None = None,
        scores: torch.Tensor | None = None,
    ) -> ChunkInfo | None:
        """Store ``kv`` (``kv_shape(len(token_ids))``, the fingerprint's dtype), computed with
        its first token at ``position`` (``context``: the ``context_hash`` of the tokens
        before it, only when the KV is exactly a full prefill's for them; ``scores``: its
        per-token context statistics, ``[tokens]``); evicts lower-valued chunks to make room.
        Returns the chunk (the one already cached, if any), or None when it cannot fit."""
        await self.put_many([(token_ids, kv, position)], contexts=[context], scores=[scores])
        return self._chunks.get(chunk_hash(token_ids))

    async def put_many(
        self,
        items: Sequence[tuple[Sequence[int], torch.Tensor, int]],
        contexts: Sequence[bytes | None] | None = None,
        scores: Sequence[torch.Tensor | None] | None = None,
    ) -> int:
        """``put`` each (token_ids, kv, position) (with ``contexts[i]`` and ``scores[i]``, as
        ``put``'s) with one durable write for all (one submission, one fdatasync per file,
        one catalog commit); how many were stored."""
        contexts = list(contexts) if contexts is not None else [None] * len(items)
        all_scores = list(scores) if scores is not None else [None] * len(items)
        if len(contexts) != len(items) or len(all_scores) != len(items):
            raise InvalidArgumentError(
                f"{len(contexts)} contexts, {len(all_scores)} scores for {len(items)} chunks"
            )
        for (token_ids, kv, position), score in zip(items, all_scores, strict=True):
            self._check(token_ids, kv, position)
            if score is not None and tuple(score.shape) != (len(token_ids),):
                raise ChunkShapeError(
                    f"scores {tuple(score.shape)} for a chunk of {len(token_ids)} tokens"
                )
        async with self._lock:
            fresh: dict[bytes, ChunkInfo] = {}
            payloads: dict[bytes, torch.Tensor] = {}
            for (token_ids, kv, position), context, score in zip(
                items, contexts, all_scores, strict=True
            ):
                digest = chunk_hash(token_ids)
                if digest in self._chunks or digest in fresh:
                    continue
                key = chunk_key(self.namespace, digest, len(token_ids), position, context)
                payloads[digest] = encode_chunk(kv, self.namespace, position, context, score)
                size = payloads[digest].numel()
                kept_scores = None  # as stored: float16, and none where the header had no room
                if score is not None:
                    header = read_header(payloads[digest][:HEADER_BYTES], self.namespace,
                                         len(token_ids), position, context)  # fmt: skip
                    kept_scores = decode_scores((header or {}).get("scores"), len(token_ids))
                fresh[digest] = ChunkInfo(key, digest, len(token_ids), position, size, context,
                                          kept_scores, scores_known=True)  # fmt: skip
            kept: list[ChunkInfo] = []
            for info in fresh.values():
                # room for the ones kept so far too: they are written together below
                held = sum(k.size_bytes for k in kept)
                if await self._make_room(held + info.size_bytes):
                    kept.append(info)
                else:
                    self.counters["rejected"] += 1
            if not kept:
                return 0
            await self._store.put_many({info.key: payloads[info.chunk_hash] for info in kept})
            for info in kept:
                self._admit(info)
            self.counters["stored"] += len(kept)
            return len(kept)

    def _check(self, token_ids: Sequence[int], kv: torch.Tensor, position: int) -> None:
        num_tokens = len(token_ids)
        expected = self.kv_shape(num_tokens)
        if (
            not isinstance(kv, torch.Tensor)
            or tuple(kv.shape) != expected
            or (kv.dtype != self.fingerprint.torch_dtype)
        ):
            raise ChunkShapeError(
                f"a chunk of {num_tokens} tokens needs a {self.fingerprint.dtype} tensor "
                f"{expected}, got {getattr(kv, 'shape', type(kv))} {getattr(kv, 'dtype', '')}"
            )
        if num_tokens == 0 or position < 0:
            raise InvalidArgumentError(f"{num_tokens} tokens at position {position}")

    def stats(self) -> dict[str, Any]:
        tiers = {t.name: {"used_bytes": t.used_bytes, "capacity_bytes": t.capacity_bytes}
                 for t in self._store.tiers}  # fmt: skip
        return {"chunks": len(self._chunks), "tiers": tiers, **self.counters}

    async def aclose(self) -> None:
        async with self._lock:
            if self._owns_store:
                await self._store.aclose()

    # ------------------------------------------------------------------ internals
    async def _get(self, info: ChunkInfo, into: torch.Tensor, span: Any) -> bool:
        try:
            got = await self._store.get(info.key, into=into, byte_range=span)
        except CorruptionError:
            await self._damaged(info)
            return False
        return got is not None

    async def _damaged(self, info: ChunkInfo) -> None:
        self.counters["corrupt"] += 1
        async with self._lock:
            await self._drop(info)

    def _admit(self, info: ChunkInfo) -> None:
        self._chunks[info.chunk_hash] = info
        self._prioritise(info)

    def _prioritise(self, info: ChunkInfo) -> None:
        info.priority = self._clock + (info.hits + 1) * info.cost / max(info.size_bytes, 1)
        heapq.heappush(self._heap, (info.priority, info.key, info.chunk_hash))

    async def _make_room(self, size: int) -> bool:
        tier = self._store.tiers[-1]
        if size > tier.capacity_bytes:
            return False
        while tier.free_bytes < size and self._heap:
            priority, key, digest = heapq.heappop(self._heap)
            info = self._chunks.get(digest)
            if info is None or info.key != key or info.priority != priority:
                continue  # a stale heap entry: the chunk was re-prioritised or dropped
            self._clock = priority
            await self._drop(info)
            self.counters["evicted"] += 1
        return tier.free_bytes >= size

    async def _drop(self, info: ChunkInfo) -> None:
        if self._chunks.get(info.chunk_hash) is info:
            del self._chunks[info.chunk_hash]
            await self._store.delete(info.key)
