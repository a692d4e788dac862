"""Opaque vLLM offload chunks as tierkit blocks: the fingerprint and the byte rows.

vLLM's offloading path (``OffloadingSpec``, ``SecondaryTierManager``) moves whole chunks or
canonical pages whose byte layout vLLM owns (``kv_cache_layout``, ``canonical_layout``,
blocks per chunk). tierkit stores them as they are, as a ``[1, 2, 1, 1, bytes / 2]`` block of
one-byte elements (``float8_e4m3fn``: the store copies bytes and never reads values), under a
fingerprint whose model name spells every part of the format, so a different model, dtype,
layout, chunking or parallel rank gets a different namespace and never these bytes.

Thread-safety: free functions.
"""

from __future__ import annotations

from typing import Any

import torch

from kvstore.fingerprint import ModelFingerprint

__all__ = ["chunk_fingerprint", "chunk_rows"]


def chunk_fingerprint(spec: Any, chunk_bytes: int, model_id: str | None = None) -> ModelFingerprint:
    """The fingerprint of ``chunk_bytes``-byte chunks of the engine ``spec`` configures (an
    ``OffloadingSpec``: its ``config`` is vLLM's ``OffloadingConfig``)."""
    if chunk_bytes <= 0 or chunk_bytes % 2:
        raise ValueError(f"a chunk of {chunk_bytes} bytes: expected a positive even size")
    config = spec.config
    parallel = config.parallel
    name = model_id or config.model.name
    layout = (
        f"{name}|{config.model.dtype}|tokens_per_block={spec.tokens_per_block}"
        f"|blocks_per_chunk={spec.blocks_per_chunk}|layout={config.kv_cache_layout}"
        f"|canonical={config.canonical_layout}|rank={parallel.rank}/{parallel.world_size}"
    )
    return ModelFingerprint(
        model=layout,
        dtype="float8_e4m3fn",
        num_layers=1,
        block_tokens=1,
        num_kv_heads=1,
        head_dim=chunk_bytes // 2,
        kv_layout="vllm-chunk",
    )


def chunk_rows(buffer: Any, chunk_bytes: int) -> torch.Tensor:
    """``buffer`` (a writable, C-contiguous buffer of whole chunks: vLLM's primary memoryview,
    or a tensor) as a ``[num_chunks, chunk_bytes]`` uint8 tensor sharing its memory."""
    if isinstance(buffer, torch.Tensor):
        if not buffer.is_contiguous():
            raise ValueError("the primary KV tensor must be contiguous")
        flat = buffer.view(torch.uint8).reshape(-1)
    else:
        view = memoryview(buffer)
        if not view.c_contiguous:
            raise ValueError("the primary KV memoryview must be C-contiguous")
        flat = torch.frombuffer(view.cast("B"), dtype=torch.uint8)
    if flat.numel() % chunk_bytes:
        raise ValueError(f"{flat.numel()} bytes is not a whole number of {chunk_bytes}-byte chunks")
    return flat.view(-1, chunk_bytes)
