"""Prefix caching for Hugging Face ``transformers`` models without vLLM.

``prefill`` restores the longest cached prefix of a prompt from a ``KVBlockStore`` into a
``transformers.DynamicCache``, runs the model on the rest only, and stores the prompt's new
full blocks, so the next prompt sharing the prefix skips it too. ``prefill_sync`` is the same
over a ``SyncKVBlockStore``. The returned cache holds the KV of every prompt token; to decode
on, feed the next token (``logits[:, -1].argmax(-1)`` for greedy) appended to the prompt:
``model.generate(torch.cat([ids, next_token], 1), past_key_values=result.cache, ...)``
(given the bare prompt and a cache covering all of it, ``generate`` would run the last
prompt token a second time, and its KV would then sit in the cache twice).

Invariants:
- At least one prompt token is run, so the caller always gets the last position's logits:
  when every token of the prompt is cached (its length a multiple of ``block_tokens``), all
  its blocks are loaded but the last token's K/V are left out and recomputed (one token of
  work, not one block).
- Only verified blocks are used: ``store.load`` returns the leading run of cached blocks
  whose checksums pass; a corrupted block and every block after it are recomputed, and the
  recomputed blocks the store no longer holds are stored again.
- Batch size 1; models whose every layer is full attention (see ``kvstore.hf_cache``).

``kivi_logit_error`` measures what KIVI compression of the stored blocks costs in logits.

Thread-safety: the functions keep no state; one ``DynamicCache`` belongs to one caller.
``prefill`` runs the model in a worker thread (``asyncio.to_thread``), so the event loop
keeps serving other tasks during the forward pass; the model must tolerate that (inference
under ``torch.no_grad`` does).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kvstore.fingerprint import ModelFingerprint, chain_hashes
from kvstore.hf_cache import blocks_from_cache, cache_from_blocks, fingerprint_for

if TYPE_CHECKING:
    from transformers import DynamicCache

    from kvstore.block_store import KVBlockStore
    from kvstore.sync_store import SyncKVBlockStore

__all__ = ["PrefillResult", "fingerprint_for", "kivi_logit_error", "prefill", "prefill_sync"]


@dataclass
class PrefillResult:
    """What ``prefill`` computed: ``logits`` of the positions it ran, ``[1, n - cached_tokens,
    vocab]``; ``cache`` with the KV of all ``n`` prompt tokens."""

    logits: torch.Tensor
    cache: DynamicCache
    cached_tokens: int  # prompt tokens restored from the store, not run
    stored_blocks: int  # new full blocks written to the store


def _hashes(model: Any, input_ids: torch.Tensor, fingerprint: ModelFingerprint) -> list[bytes]:
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be [1, n > 0], got {tuple(input_ids.shape)}")
    expected = fingerprint_for(model, fingerprint.block_tokens, fingerprint.dtype, name="-")
    if expected.block_shape != fingerprint.block_shape:
        raise ValueError(
            f"the store's blocks {fingerprint.block_shape} do not fit this model's "
            f"{expected.block_shape}"
        )
    return chain_hashes(input_ids[0].tolist(), fingerprint.block_tokens)


def _run_rest(model: Any, input_ids: torch.Tensor, blocks: torch.Tensor) -> tuple[Any, int]:
    """Run the prompt over the restored ``blocks``; returns (the model's output, cached
    tokens)."""
    num_tokens = input_ids.shape[1]
    cached_tokens = min(blocks.shape[0] * blocks.shape[3], num_tokens - 1)
    cache = cache_from_blocks(model, blocks, cached_tokens)
    positions = torch.arange(cached_tokens, num_tokens, device=model.device).unsqueeze(0)
    with torch.no_grad():
        output = model(
            input_ids=input_ids[:, cached_tokens:].to(model.device),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
    return output, cached_tokens


async def prefill(store: KVBlockStore, model: Any, input_ids: torch.Tensor) -> PrefillResult:
    """Run ``input_ids`` ``[1, n]`` through ``model`` over its longest prefix cached in
    ``store``, then store the prompt's full blocks that were not loaded."""
    fingerprint = store.fingerprint
    hashes = _hashes(model, input_ids, fingerprint)
    hits = await store.lookup(hashes) if hashes else 0
    blocks = torch.empty((hits, *fingerprint.block_shape), dtype=fingerprint.torch_dtype)
    loaded = await store.load(hashes[:hits], blocks) if hits else 0
    # in a worker thread: the loop goes on serving other callers' loads meanwhile
    output, cached_tokens = await asyncio.to_thread(_run_rest, model, input_ids, blocks[:loaded])
    stored = 0
    if len(hashes) > loaded:
        new = blocks_from_cache(output.past_key_values, loaded, len(hashes) - loaded, fingerprint)
        parent = hashes[loaded - 1] if loaded else None
        stored = await store.store(hashes[loaded:], new, parent=parent)
    return PrefillResult(output.logits, output.past_key_values, cached_tokens, stored)


def prefill_sync(store: SyncKVBlockStore, model: Any, input_ids: torch.Tensor) -> PrefillResult:
    """``prefill`` for callers without an event loop, over a ``SyncKVBlockStore``."""
    fingerprint = store.fingerprint
    hashes = _hashes(model, input_ids, fingerprint)
    hits = store.lookup(hashes) if hashes else 0
    blocks = torch.empty((hits, *fingerprint.block_shape), dtype=fingerprint.torch_dtype)
    loaded = store.load(hashes[:hits], blocks) if hits else 0
    output, cached_tokens = _run_rest(model, input_ids, blocks[:loaded])
    stored = 0
    if len(hashes) > loaded:
        new = blocks_from_cache(output.past_key_values, loaded, len(hashes) - loaded, fingerprint)
        parent = hashes[loaded - 1] if loaded else None
        stored = store.store_blocks(hashes[loaded:], new, parent=parent)
    return PrefillResult(output.logits, output.past_key_values, cached_tokens, stored)


def kivi_logit_error(
    model: Any, input_ids: torch.Tensor, codec: Any, *, block_tokens: int = 32
) -> float:
    """Max |logit difference| over the uncached tail of ``input_ids`` ``[1, n]`` between a
    prefix restored from ``codec``-compressed blocks and the exact computation.

    The prefix is every full block but at least one token is left to run (``(n - 1) //
    block_tokens`` blocks); the blocks go through ``codec.encode_many`` / ``decode_many`` in
    the model's dtype, as a store opened with ``compression=codec`` would keep them."""
    num_blocks = (input_ids.shape[1] - 1) // block_tokens
    if num_blocks < 1:
        raise ValueError(f"a prompt of {input_ids.shape[1]} tokens has no block to compress")
    residual_tokens = codec.describe().get("residual_tokens", 0)
    if residual_tokens >= block_tokens:
        raise ValueError(
            f"{codec!r} keeps all {block_tokens} tokens of a block in full precision: the "
            "error would be 0 (use residual_tokens < block_tokens)"
        )
    fingerprint = fingerprint_for(model, block_tokens, name="kivi-probe")
    with torch.no_grad():
        exact = model(input_ids=input_ids.to(model.device), use_cache=True)
    blocks = blocks_from_cache(exact.past_key_values, 0, num_blocks, fingerprint)
    restored = torch.empty_like(blocks)
    codec.decode_many(codec.encode_many(blocks), restored)
    output, prefix_tokens = _run_rest(model, input_ids, restored)
    return float((output.logits - exact.logits[:, prefix_tokens:]).abs().max())
