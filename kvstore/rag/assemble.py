"""A RAG prompt from cached chunks plus new text, as a ``transformers.DynamicCache``.

``assemble`` takes a prompt as segments (system text, retrieved chunks, the question), looks
each cacheable segment up in a ``ChunkCache``, streams the hits' KV in layer by layer
(``ChunkCache.load_layer``; layer l is read while layers < l compute), re-rotates their keys
to where they now sit (``RopeRotator``), and runs ``blend_prefill``: the question, new text
and missed chunks are computed, and a ``recompute_fraction`` of the reused tokens is
recomputed. The missed chunks' KV, computed in this prompt, is then stored for the next one.
``generate`` decodes on from the result with ``model.generate``.

Invariants:
- A chunk is reused only if every layer of it loads and passes its checks; a chunk found
  corrupt mid-prefill is dropped by the cache and the prefill starts over with it computed.
- The last segment must be new text (the question): its last token's logits come from the
  model, never from a cache.

Thread-safety: one ``ChunkCache`` per loop; ``assemble`` runs the model in a worker thread
(``asyncio.to_thread``), so the loop keeps serving loads (its own included) meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvstore.rag.blend import blend_prefill
from kvstore.rag.chunk_cache import ChunkCache, ChunkInfo
from kvstore.rag.errors import RagArgumentError
from kvstore.rag.rope import RopeRotator

__all__ = ["RULES", "AssembledPrompt", "Segment", "assemble", "generate"]

RULES = ("deviation", "chunk-start", "hybrid")
HYBRID_CANDIDATES = 3.0  # the hybrid rule checks this many times the recompute fraction


@dataclass(frozen=True)
class Segment:
    token_ids: tuple[int, ...]
    cacheable: bool = True  # False: new text (the question), always computed, never stored


@dataclass
class AssembledPrompt:
    input_ids: torch.Tensor  # [1, n]
    logits: torch.Tensor  # [1, vocab], the last prompt position's
    cache: Any  # DynamicCache of all n tokens
    tokens_computed: float  # token-layers / layers (a full prefill: n)
    reused_tokens: int
    stored_chunks: int


class _ChunkLost(Exception):
    def __init__(self, slots: list[int]) -> None:
        super().__init__(f"segments {slots} failed to load")
        self.slots = slots


async def assemble(
    model: Any,
    chunks: ChunkCache,
    segments: Sequence[Segment],
    *,
    recompute_fraction: float = 0.15,
    check_layer: int = 1,
    rule: str = "deviation",
) -> AssembledPrompt:
    """Prefill ``segments`` reusing ``chunks``' KV; see the module docstring. ``rule`` picks
    the reused tokens to recompute: "deviation" (CacheBlend: the largest K deviation at
    ``check_layer``), "chunk-start" (the first tokens of each reused chunk, no check) or
    "hybrid" (the check on the first ``HYBRID_CANDIDATES`` x fraction of each chunk)."""
    if rule not in RULES:
        raise RagArgumentError(f"rule {rule!r}: expected one of {RULES}")
    if not segments or segments[-1].cacheable or not segments[-1].token_ids:
        raise RagArgumentError("the last segment must be non-empty new text (cacheable=False)")
    offsets, start = [], 0
    for segment in segments:
        offsets.append(start)
        start += len(segment.token_ids)
    ids = torch.tensor([[t for s in segments for t in s.token_ids]], dtype=torch.long)
    rotator = RopeRotator(model)
    hits: dict[int, ChunkInfo] = {}
    for slot, segment in enumerate(segments):
        if segment.cacheable and segment.token_ids:
            info = chunks.lookup(segment.token_ids)
            if info is not None:
                hits[slot] = info
    while True:
        try:
            result = await _run(model, chunks, rotator, ids, offsets, segments, hits,
                                recompute_fraction, check_layer, rule)  # fmt: skip
            break
        except _ChunkLost as lost:  # the cache dropped them: compute them this time
            for slot in lost.slots:
                hits.pop(slot, None)
    missed = []
    for slot, segment in enumerate(segments):
        if segment.cacheable and segment.token_ids and slot not in hits:
            begin, end = offsets[slot], offsets[slot] + len(segment.token_ids)
            kv = torch.stack([
                torch.stack((layer.keys[0, :, begin:end], layer.values[0, :, begin:end]))
                for layer in result.cache.layers
            ]).to(device="cpu", dtype=chunks.fingerprint.torch_dtype)  # fmt: skip
            missed.append((segment.token_ids, kv, begin))
    stored = await chunks.put_many(missed) if missed else 0
    reused = 0 if recompute_fraction >= 1.0 else sum(len(segments[s].token_ids) for s in hits)
    return AssembledPrompt(ids, result.logits, result.cache, result.tokens_computed, reused, stored)


async def _run(
    model: Any, chunks: ChunkCache, rotator: RopeRotator, ids: torch.Tensor,
    offsets: list[int], segments: Sequence[Segment], hits: dict[int, ChunkInfo],
    fraction: float, check_layer: int, rule: str,
) -> Any:  # fmt: skip
    num_layers, n = chunks.fingerprint.num_layers, ids.shape[1]
    reused = torch.zeros(n, dtype=torch.bool)
    priority = None if rule == "deviation" else torch.zeros(n)
    for slot in hits:
        begin, length = offsets[slot], len(segments[slot].token_ids)
        reused[begin : begin + length] = True
        if priority is not None:  # 1 for a chunk's first token, falling to 0 at its end
            priority[begin : begin + length] = 1.0 - torch.arange(length) / length
    first_layer = check_layer if priority is None else 0
    layers: list[concurrent.futures.Future[list[Any]]] = [
        concurrent.futures.Future() for _ in range(num_layers)
    ]

    async def feed() -> None:  # on the loop: layer after layer, while the thread computes
        slots = list(hits)
        try:
            for layer in range(first_layer, num_layers):
                parts = await asyncio.gather(*(chunks.load_layer(hits[s], layer) for s in slots))
                lost = [s for s, part in zip(slots, parts, strict=True) if part is None]
                if lost:
                    raise _ChunkLost(lost)
                layers[layer].set_result(parts)
        except BaseException as exc:  # the thread must never wait for a layer that won't come
            error = exc if isinstance(exc, Exception) else RuntimeError(f"loads stopped: {exc!r}")
            for future in layers:
                if not future.done():
                    future.set_exception(error)
            if not isinstance(exc, _ChunkLost):
                raise

    def layer_kv(layer: int) -> torch.Tensor:
        parts = layers[layer].result()
        full = torch.zeros((2, *parts[0].shape[1:-2], n, parts[0].shape[-1]), dtype=model.dtype)
        for slot, part in zip(hits, parts, strict=True):
            begin, info = offsets[slot], hits[slot]
            keys = rotator.shift(part[0], info.position, begin)
            full[0, :, begin : begin + info.num_tokens] = keys
            full[1, :, begin : begin + info.num_tokens] = part[1]
        return full

    if not hits or fraction >= 1.0:  # nothing is reused: a plain full prefill
        return await asyncio.to_thread(
            blend_prefill, model, ids, torch.zeros(n, dtype=torch.bool), layer_kv,
            recompute_fraction=1.0,
        )  # fmt: skip
    feeder = asyncio.ensure_future(feed())
    try:
        return await asyncio.to_thread(
            blend_prefill, model, ids, reused, layer_kv,
            recompute_fraction=fraction, check_layer=check_layer, priority=priority,
            candidates=min(1.0, HYBRID_CANDIDATES * fraction) if rule == "hybrid" else None,
        )  # fmt: skip
    finally:
        feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)


def generate(model: Any, prompt: AssembledPrompt, max_new_tokens: int = 32, **kwargs: Any) -> Any:
    """``model.generate`` from an assembled prompt, greedy by default: the first new token
    is taken from ``prompt.logits`` and appended, so the cache's last token is not run twice
    (``kvstore.hf`` explains why). Returns the ids of prompt and new tokens, ``[1, n + k]``."""
    first = prompt.logits.argmax(-1, keepdim=True).to(prompt.input_ids.device)
    ids = torch.cat((prompt.input_ids, first), dim=1)
    if max_new_tokens <= 1:
        return ids
    kwargs.setdefault("do_sample", False)
    return model.generate(
        ids.to(model.device), past_key_values=prompt.cache, max_new_tokens=max_new_tokens - 1,
        attention_mask=torch.ones_like(ids, device=model.device), **kwargs,
    )  # fmt: skip
