"""A RAG prompt from cached chunks plus new text, as a ``transformers.DynamicCache``.

``assemble`` takes a prompt as segments (system text, retrieved chunks, the question), looks
each cacheable segment up in a ``ChunkCache``, streams the hits' KV in layer by layer
(``ChunkCache.load_layer``; layer l is read while layers < l compute), re-rotates their keys
to where they now sit (``RopeRotator``), and runs ``blend_prefill``: the question, new text
and missed chunks are computed, and a ``recompute_fraction`` of the reused tokens is
recomputed. The missed chunks' KV, computed in this prompt, is then stored for the next one.
``generate`` decodes on from the result with ``model.generate``.

Exact segments: a chunk stored with no approximate reuse before it in its prompt is stored
with the ``context_hash`` of the tokens before it. Reused where the same tokens precede it
at the same position (the system text at position 0, or a run of chunks in the order they
were first computed in), its KV is what a full prefill computes: it is neither checked nor
recomputed, and the recompute fraction counts the other reused tokens only.

Rules (which reused tokens to recompute): "learned", the default: a chunk's first
non-exact reuse checks it whole and the cache keeps each token's first deviation
(``kvstore.rag.learned``); later reuses check only the ``LEARNED_CANDIDATES`` x fraction of
its tokens remembered highest and recompute the worst of them by this prompt's deviation,
so the check costs a small share of a layer per reused token. "learned-refresh": the same,
each check overwriting what it measured (worse). "deviation" (CacheBlend: every reused
token runs the layers below ``check_layer``), "chunk-start" (each chunk's first tokens, no
check), "hybrid" (the check on each chunk's first tokens), "attention" (the check on the
highest alone deviations stored with the chunk, ``kvstore.rag.context_stats``). On the
benchmark's 5,000-request replay at fraction 0.05 "learned" computes 0.350x prefix
caching's tokens ("deviation": 0.520x), top-1 0.9994, mean KL 7.26e-5: within the bound a
default must hold (half of pure reuse's, 9.58e-5; benchmarks/RESULTS.md).

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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvstore.rag.blend import blend_prefill
from kvstore.rag.chunk_cache import ChunkCache, ChunkInfo
from kvstore.rag.chunk_format import context_hashes
from kvstore.rag.context_stats import positional_scores
from kvstore.rag.errors import RagArgumentError
from kvstore.rag.learned import UNSEEN, remember, token_scores
from kvstore.rag.rope import RopeRotator

__all__ = [
    "DEFAULT_FRACTION",
    "DEFAULT_RULE",
    "RULES",
    "AssembledPrompt",
    "Segment",
    "assemble",
    "generate",
]

RULES = ("deviation", "chunk-start", "hybrid", "attention", "learned", "learned-refresh")
LEARNED_RULES = ("learned", "learned-refresh")
LEARNED_CANDIDATES = 3.0  # a learned chunk's candidates for the check: this x the fraction
DEFAULT_RULE, DEFAULT_FRACTION = "learned", 0.05  # the sweep in benchmarks/RESULTS.md
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
    exact_tokens: int = 0  # of reused_tokens: exact (see the module docstring), never recomputed
    load_wait_s: float = 0.0  # the forward pass waiting for chunk layers to arrive


class _ChunkLost(Exception):
    def __init__(self, slots: list[int]) -> None:
        super().__init__(f"segments {slots} failed to load")
        self.slots = slots


async def assemble(
    model: Any,
    chunks: ChunkCache,
    segments: Sequence[Segment],
    *,
    recompute_fraction: float = DEFAULT_FRACTION,
    check_layer: int = 1,
    rule: str = DEFAULT_RULE,
) -> AssembledPrompt:
    """Prefill ``segments`` reusing ``chunks``' KV; see the module docstring. ``rule`` picks
    the reused tokens to recompute (``RULES``): "learned" (default), "learned-refresh",
    "deviation", "chunk-start", "hybrid" (the check on the first ``HYBRID_CANDIDATES`` x
    fraction of each chunk), "attention" (the check on the ``HYBRID_CANDIDATES`` x fraction
    with the highest stored alone deviation)."""
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
    contexts = context_hashes([segment.token_ids for segment in segments])
    scores: dict[int, torch.Tensor] = {}
    if rule == "attention" and recompute_fraction < 1.0:
        for slot, info in list(hits.items()):
            found, kept = await chunks.scores(info)
            if not found:  # gone or its header failed: compute it
                hits.pop(slot)
            elif kept is None:  # stored without statistics: by position in the chunk
                scores[slot] = positional_scores(info.num_tokens)
            else:
                scores[slot] = kept
    while True:
        exact = {
            slot for slot, info in hits.items()
            if recompute_fraction < 1.0 and info.context is not None
            and info.position == offsets[slot] and info.context == contexts[slot]
        }  # fmt: skip
        try:
            result, wait_s = await _run(model, chunks, rotator, ids, offsets, segments, hits,
                                        exact, recompute_fraction, check_layer, rule,
                                        scores)  # fmt: skip
            break
        except _ChunkLost as lost:  # the cache dropped them: compute them this time
            for slot in lost.slots:
                hits.pop(slot, None)
    # a missed chunk's KV is exact when nothing before it was reused approximately
    approximate = [offsets[slot] for slot in hits if slot not in exact and recompute_fraction < 1]
    exact_until = min(approximate, default=ids.shape[1])
    missed, missed_contexts, missed_scores = [], [], []
    for slot, segment in enumerate(segments):
        if segment.cacheable and segment.token_ids and slot not in hits:
            begin, end = offsets[slot], offsets[slot] + len(segment.token_ids)
            kv = torch.stack([
                torch.stack((layer.keys[0, :, begin:end], layer.values[0, :, begin:end]))
                for layer in result.cache.layers
            ]).to(device="cpu", dtype=chunks.fingerprint.torch_dtype)  # fmt: skip
            missed.append((segment.token_ids, kv, begin))
            missed_contexts.append(contexts[slot] if begin <= exact_until else None)
            stats = result.context_attention
            missed_scores.append(None if stats is None else stats[begin:end].clone())
    stored = await chunks.put_many(missed, missed_contexts, missed_scores) if missed else 0
    reused = 0 if recompute_fraction >= 1.0 else sum(len(segments[s].token_ids) for s in hits)
    exact_tokens = sum(len(segments[s].token_ids) for s in exact)
    return AssembledPrompt(ids, result.logits, result.cache, result.tokens_computed, reused,
                           stored, exact_tokens, wait_s)  # fmt: skip


async def _run(
    model: Any, chunks: ChunkCache, rotator: RopeRotator, ids: torch.Tensor,
    offsets: list[int], segments: Sequence[Segment], hits: dict[int, ChunkInfo],
    exact: set[int], fraction: float, check_layer: int, rule: str,
    scores: dict[int, torch.Tensor],
) -> tuple[Any, float]:  # fmt: skip
    """(the blend's result, seconds its forward pass waited for loads)."""
    num_layers, n = chunks.fingerprint.num_layers, ids.shape[1]
    reused = torch.zeros(n, dtype=torch.bool)
    exact_mask = torch.zeros(n, dtype=torch.bool)
    priority = None if rule == "deviation" else torch.zeros(n)
    candidates = min(1.0, HYBRID_CANDIDATES * fraction) if rule in ("hybrid", "attention") else None
    unseen = 0
    for slot in hits:
        begin, length = offsets[slot], len(segments[slot].token_ids)
        reused[begin : begin + length] = True
        exact_mask[begin : begin + length] = slot in exact
        if priority is None:
            continue
        if rule == "attention":  # the mass stored with the chunk (context_stats)
            priority[begin : begin + length] = scores.get(slot, positional_scores(length))
        elif rule in LEARNED_RULES:  # earlier checks' measurements (kvstore.rag.learned)
            chunk_scores = token_scores(length, hits[slot].learned)
            if slot not in exact:
                unseen += int((chunk_scores >= UNSEEN).sum())
            priority[begin : begin + length] = chunk_scores
        else:  # 1 for a chunk's first token, falling to 0 at its end
            priority[begin : begin + length] = 1.0 - torch.arange(length) / length
    # the "attention" rule's statistics of the chunks computed here, stored with them
    own_start: torch.Tensor | None = None
    if rule == "attention":
        own_start = torch.full((n,), -1, dtype=torch.long)
        for slot, segment in enumerate(segments):
            if segment.cacheable and segment.token_ids and slot not in hits:
                own_start[offsets[slot] : offsets[slot] + len(segment.token_ids)] = offsets[slot]
    context_from = _context_from(offsets, segments)
    if rule in LEARNED_RULES:
        free = int(reused.sum()) - int(exact_mask.sum())
        wanted = unseen + LEARNED_CANDIDATES * fraction * free
        candidates = min(1.0, wanted / max(free, 1))
    # below the check layer only the exact chunks' KV is read
    first_layer = check_layer if priority is None and not exact else 0
    layers: list[concurrent.futures.Future[list[Any]]] = [
        concurrent.futures.Future() for _ in range(num_layers)
    ]
    waited = [0.0]

    async def feed() -> None:  # on the loop: layer after layer, while the thread computes
        slots = list(hits)
        try:
            for layer in range(first_layer, num_layers):
                wanted = slots if layer >= check_layer or priority is not None else list(exact)
                parts = await asyncio.gather(*(chunks.load_layer(hits[s], layer) for s in wanted))
                lost = [s for s, part in zip(wanted, parts, strict=True) if part is None]
                if lost:
                    raise _ChunkLost(lost)
                layers[layer].set_result(list(zip(wanted, parts, strict=True)))
        except BaseException as exc:  # the thread must never wait for a layer that won't come
            error = exc if isinstance(exc, Exception) else RuntimeError(f"loads stopped: {exc!r}")
            for future in layers:
                if not future.done():
                    future.set_exception(error)
            if not isinstance(exc, _ChunkLost):
                raise

    def layer_kv(layer: int) -> torch.Tensor:
        started = time.perf_counter()
        parts = layers[layer].result()
        waited[0] += time.perf_counter() - started
        shape = parts[0][1].shape
        full = torch.zeros((2, shape[1], n, shape[-1]), dtype=model.dtype)
        for slot, part in parts:
            begin, info = offsets[slot], hits[slot]
            keys = rotator.shift(part[0], info.position, begin)
            full[0, :, begin : begin + info.num_tokens] = keys
            full[1, :, begin : begin + info.num_tokens] = part[1]
        return full

    if not hits or fraction >= 1.0:  # nothing is reused: a plain full prefill
        result = await asyncio.to_thread(
            blend_prefill, model, ids, torch.zeros(n, dtype=torch.bool), layer_kv,
            recompute_fraction=1.0, own_start=own_start, context_from=context_from,
        )  # fmt: skip
        return result, 0.0
    feeder = asyncio.ensure_future(feed())
    try:
        result = await asyncio.to_thread(
            blend_prefill, model, ids, reused, layer_kv,
            recompute_fraction=fraction, check_layer=check_layer, priority=priority,
            candidates=candidates,
            exact=exact_mask, own_start=own_start, context_from=context_from,
        )  # fmt: skip
        if rule in LEARNED_RULES and result.deviation is not None:  # keep what the check saw
            for slot, info in hits.items():
                begin = offsets[slot]
                seen = result.deviation[begin : begin + info.num_tokens]
                info.learned = remember(info.learned, seen, rule == "learned-refresh")
        return result, waited[0]
    finally:
        feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)


def _context_from(offsets: list[int], segments: Sequence[Segment]) -> int:
    """Where the context that changes between prompts begins: after the first segment (the
    system text, the same in every prompt) when it is cacheable, else after the first token
    (the attention sink)."""
    return offsets[1] if len(segments) > 1 and segments[0].cacheable else 1


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
