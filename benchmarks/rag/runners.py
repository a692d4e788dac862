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

Stores: one DRAM tier of 1.25 GiB for both caches (no NVMe tier: the long replay's chunks no
longer fit the shared disk; the earlier runs had 256 MiB DRAM over 1 GiB NVMe, and their
TTFTs included the NVMe writes). Thread-safety: one asyncio loop; the model runs in worker
threads, one at a time.
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

__all__ = [
    "Reference",
    "ReplayResult",
    "Replayer",
    "prompt_ids",
    "reference",
    "replay",
    "replay_together",
]

DECODE_TOKENS = 32
BLOCK_TOKENS = 16
# DRAM only, of the capacity the earlier runs had as 256 MiB DRAM over 1 GiB NVMe: a long
# replay's chunks (~0.8 GiB a configuration) no longer fit the shared disk's free space
DRAM_BYTES, DISK_BYTES = 1280 << 20, 0


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


class Replayer:
    """One configuration's store and results, fed one request at a time (``step``), so that
    several configurations can take each request in turn (``replay_together``)."""

    def __init__(self, model: Any, kind: str, work_dir: Path, fraction: float, rule: str) -> None:
        names = {"none": "no cache", "prefix": "prefix caching"}
        self.model, self.kind, self.fraction, self.rule = model, kind, fraction, rule
        self.result = ReplayResult(names.get(kind, f"chunk {rule} f={fraction:g}"))
        self.directory = work_dir / f"store-{kind}-{rule}-{fraction}"
        self.store: Any = None

    async def open(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        if self.kind == "prefix":
            fp = fingerprint_for(self.model, BLOCK_TOKENS, name="rag-bench")
            self.store = await KVBlockStore.open(self.directory, fp, disk_bytes=DISK_BYTES,
                                                 dram_bytes=DRAM_BYTES)  # fmt: skip
        elif self.kind == "chunk":
            fp = fingerprint_for(self.model, 1, name="rag-bench")
            self.store = await ChunkCache.open(self.directory, fp, disk_bytes=DISK_BYTES,
                                               dram_bytes=DRAM_BYTES)  # fmt: skip

    async def step(self, request: RagRequest, ref: Reference | None, quality: bool) -> None:
        """Prefill one request: its tokens and TTFT, and its quality when ``ref`` is given."""
        result = self.result
        first, cache, computed, reused = await _prefill(
            self.model, self.store, self.kind, request, self.fraction, self.rule
        )
        result.ttft_s.append(computed[1])
        result.tokens_computed.append(computed[0])
        result.reused_requests += reused
        if isinstance(cache, tuple):  # the chunk cache's (cache, reused, exact, wait)
            cache, reused_tokens, exact, wait_s = cache
            result.reused_tokens += reused_tokens
            result.exact_tokens += exact
            result.load_wait_s.append(wait_s)
        if quality and ref is not None:
            top1, kl = await asyncio.to_thread(_quality, self.model, first, cache, ref)
            result.top1.append(top1)
            result.kl.append(kl)

    def skip(self, request: RagRequest) -> None:
        """Count a request not run: only for no cache, whose tokens are the prompt's."""
        assert self.kind == "none"
        self.result.tokens_computed.append(float(request.num_tokens))

    async def aclose(self) -> None:
        if self.store is not None:
            await self.store.aclose()
        shutil.rmtree(self.directory, ignore_errors=True)


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
    replayer = Replayer(model, kind, work_dir, fraction, rule)
    await replayer.open()
    try:
        for request, ref in zip(requests, references, strict=True):
            await replayer.step(request, ref, quality)
    finally:
        await replayer.aclose()
    return replayer.result


async def replay_together(
    model: Any,
    requests: Sequence[RagRequest],
    references: Sequence[Reference | None],
    configs: Sequence[tuple[str, float, str]],
    work_dir: Path,
    no_cache_every: int = 1,
    progress: Any = None,
) -> list[ReplayResult]:
    """Every request through every configuration (kind, fraction, rule) in turn, each on its
    own store, the order rotating from request to request, so all see the same moments of
    this shared machine; quality on the requests with a reference. No cache (whose tokens
    are the prompt's by definition) runs only every ``no_cache_every``-th request."""
    replayers = [Replayer(model, kind, work_dir, fraction, rule or "deviation")
                 for kind, fraction, rule in configs]  # fmt: skip
    for replayer in replayers:
        await replayer.open()
    try:
        for number, (request, ref) in enumerate(zip(requests, references, strict=True)):
            shift = number % len(replayers)
            for replayer in replayers[shift:] + replayers[:shift]:
                if replayer.kind == "none" and number % no_cache_every:
                    replayer.skip(request)
                else:
                    await replayer.step(request, ref, True)
            if progress is not None:
                progress(number + 1, [r.result for r in replayers])
    finally:
        for replayer in replayers:
            await replayer.aclose()
    return [r.result for r in replayers]


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
