"""One replay of the RAG requests per configuration: no cache, prefix caching, chunk cache.

Each configuration prefills every request of the replay on fresh stores and records, per
request: prefill tokens computed (token-layers / layers for the chunk cache), the time to the
first token's logits (TTFT: lookups, loads, re-rotation, the forward pass and the stores the
call makes before it returns; all three do their stores inside the timed call), and, on the
requests that have a reference (an evenly spaced sample, or all), the quality against a full
prefill over the first 32 generated tokens: the reference greedy tokens are fed to both caches
(teacher forcing) and each step's next-token distributions are compared, top-1 agreement and
KL(full || configuration) in nats. The chunk cache also reports the seconds its forward pass
waited for layer loads (``load_wait_s``: ~0 when loads overlap compute).

- no cache: ``model(ids)`` on every request;
- prefix caching: ``kvstore.hf.prefill`` over a ``KVBlockStore`` (16-token blocks): reuses
  the longest cached exact prefix (here the system text, and more when a question recurs with
  its chunks in the same order);
- chunk cache: ``kvstore.rag.assemble`` over a ``ChunkCache`` at one recompute fraction.

Stores: a DRAM tier of 256 MiB above an NVMe tier of 1 GiB in the scratch directory, for both
caches. Thread-safety: one asyncio loop; the model runs in worker threads, one at a time.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.rag.workload import RagRequest
from kvstore import KVBlockStore
from kvstore.hf import fingerprint_for, prefill
from kvstore.rag import ChunkCache, Segment, assemble

__all__ = ["Reference", "ReplayResult", "prompt_ids", "reference", "replay"]

DECODE_TOKENS = 32
BLOCK_TOKENS = 16
DRAM_BYTES, DISK_BYTES = 256 << 20, 1 << 30


@dataclass
class Reference:
    """The full prefill's view of one request: its greedy tokens and their distributions."""

    ids: torch.Tensor  # [1, n]
    tokens: torch.Tensor  # [1, DECODE_TOKENS] greedy
    log_probs: torch.Tensor  # [DECODE_TOKENS, vocab]


@dataclass
class ReplayResult:
    name: str
    tokens_computed: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    top1: list[float] = field(default_factory=list)  # per request: agreeing steps / steps
    kl: list[float] = field(default_factory=list)  # per request: mean KL per step
    reused_requests: int = 0  # requests reusing a chunk (prefix caching: the first one whole)
    reused_tokens: int = 0  # chunk cache: tokens whose stored KV was used (exact ones included)
    exact_tokens: int = 0  # chunk cache: reused tokens that were exact (no check, no recompute)
    load_wait_s: list[float] = field(default_factory=list)  # chunk cache, per request


def prompt_ids(request: RagRequest) -> torch.Tensor:
    return torch.tensor([[*request.system, *(t for c in request.chunks for t in c),
                          *request.question]])  # fmt: skip


def reference(model: Any, request: RagRequest) -> Reference:
    ids = prompt_ids(request)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=DECODE_TOKENS, do_sample=False,
                             attention_mask=torch.ones_like(ids))  # fmt: skip
        tokens = out[:, ids.shape[1] :]
        full = model(input_ids=torch.cat((ids, tokens[:, :-1]), 1)).logits
    log_probs = full[0, ids.shape[1] - 1 :].log_softmax(-1)
    return Reference(ids, tokens, log_probs)


def _quality(model: Any, first_logits: torch.Tensor, cache: Any, ref: Reference) -> tuple:
    """(top-1 agreement, mean KL) of a prefilled cache against the reference, teacher-forced."""
    n = ref.ids.shape[1]
    positions = torch.arange(n, n + DECODE_TOKENS - 1).unsqueeze(0)
    with torch.no_grad():
        rest = model(input_ids=ref.tokens[:, :-1], past_key_values=cache,
                     position_ids=positions).logits[0]  # fmt: skip
    ours = torch.cat((first_logits.reshape(1, -1), rest)).log_softmax(-1)
    agree = (ours.argmax(-1) == ref.log_probs.argmax(-1)).float().mean()
    kl = (ref.log_probs.exp() * (ref.log_probs - ours)).sum(-1).clamp_min(0).mean()
    return float(agree), float(kl)


async def replay(
    model: Any,
    requests: Sequence[RagRequest],
    references: Sequence[Reference | None],
    kind: str,
    work_dir: Path,
    fraction: float = 0.15,
    rule: str = "deviation",
    quality: bool = True,
) -> ReplayResult:
    """Replay ``requests`` through one configuration: ``kind`` "none", "prefix" or "chunk"
    (with ``rule`` at ``fraction``); ``quality`` False skips the comparison with the
    reference (it does not depend on the round); requests whose reference is None are
    timed and counted but not compared."""
    names = {"none": "no cache", "prefix": "prefix caching"}
    name = names.get(kind, f"chunk {rule} f={fraction:g}")
    result = ReplayResult(name)
    directory = work_dir / f"store-{kind}-{rule}-{fraction}"
    shutil.rmtree(directory, ignore_errors=True)
    store: Any = None
    if kind == "prefix":
        fp = fingerprint_for(model, BLOCK_TOKENS, name="rag-bench")
        store = await KVBlockStore.open(directory, fp, disk_bytes=DISK_BYTES, dram_bytes=DRAM_BYTES)
    elif kind == "chunk":
        fp = fingerprint_for(model, 1, name="rag-bench")
        store = await ChunkCache.open(directory, fp, disk_bytes=DISK_BYTES, dram_bytes=DRAM_BYTES)
    try:
        for request, ref in zip(requests, references, strict=True):
            first, cache, computed, reused = await _prefill(model, store, kind, request,
                                                            fraction, rule)  # fmt: skip
            result.ttft_s.append(computed[1])
            result.tokens_computed.append(computed[0])
            result.reused_requests += reused
            if isinstance(cache, tuple):  # the chunk cache's (cache, reused, exact, wait)
                cache, reused_tokens, exact, wait_s = cache
                result.reused_tokens += reused_tokens
                result.exact_tokens += exact
                result.load_wait_s.append(wait_s)
            if quality and ref is not None:
                top1, kl = await asyncio.to_thread(_quality, model, first, cache, ref)
                result.top1.append(top1)
                result.kl.append(kl)
    finally:
        if store is not None:
            await store.aclose()
        shutil.rmtree(directory, ignore_errors=True)
    return result


async def _prefill(
    model: Any,
    store: Any,
    kind: str,
    request: RagRequest,
    fraction: float,
    rule: str,
) -> tuple[torch.Tensor, Any, tuple[float, float], bool]:
    """(first-token logits, cache, (tokens computed, TTFT s), reused beyond the system); the
    chunk cache's cache comes as (cache, reused tokens, exact tokens, load wait s)."""
    ids = prompt_ids(request)
    n = ids.shape[1]
    started = time.perf_counter()
    if kind == "none":

        def run() -> Any:
            with torch.no_grad():
                return model(input_ids=ids, use_cache=True, logits_to_keep=1)

        out = await asyncio.to_thread(run)
        elapsed = time.perf_counter() - started
        return out.logits[:, -1], out.past_key_values, (float(n), elapsed), False
    if kind == "prefix":
        got = await prefill(store, model, ids)
        elapsed = time.perf_counter() - started
        # every prompt shares the system text and the "[doc] " that opens the first chunk
        reused = got.cached_tokens >= len(request.system) + len(request.chunks[0])
        return got.logits[:, -1], got.cache, (float(n - got.cached_tokens), elapsed), reused
    segments = [Segment(request.system), *(Segment(c) for c in request.chunks),
                Segment(request.question, cacheable=False)]  # fmt: skip
    prompt = await assemble(model, store, segments, recompute_fraction=fraction, rule=rule)
    elapsed = time.perf_counter() - started
    reused = prompt.reused_tokens > len(request.system)
    extra = (prompt.cache, prompt.reused_tokens, prompt.exact_tokens, prompt.load_wait_s)
    return prompt.logits, extra, (prompt.tokens_computed, elapsed), reused
