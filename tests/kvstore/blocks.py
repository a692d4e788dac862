"""Helpers for the block store's tests: a small fingerprint, deterministic blocks, a loop."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Coroutine
from typing import Any, TypeVar

import torch

from kvstore import ModelFingerprint

T = TypeVar("T")

FP = ModelFingerprint(
    model="test-model", dtype="bfloat16", num_layers=2, block_tokens=16, num_kv_heads=2,
    head_dim=32,
)  # fmt: skip
BLOCK_BYTES = FP.block_bytes  # 8 KiB


def disk_for(blocks: int) -> int:
    """A store's ``disk_bytes`` that hold exactly ``blocks`` test blocks."""
    from kvstore import KVBlockStore

    return KVBlockStore.disk_bytes_for(blocks, BLOCK_BYTES)


def block_of(block_hash: bytes, fingerprint: ModelFingerprint = FP) -> torch.Tensor:
    """The one block content a hash stands for in these tests (so a reader can check it)."""
    seed = int.from_bytes(hashlib.sha256(block_hash).digest()[:8], "little")
    generator = torch.Generator().manual_seed(seed)
    block = torch.randn(fingerprint.block_shape, generator=generator)
    return block.to(fingerprint.torch_dtype)


def blocks_of(hashes: list[bytes], fingerprint: ModelFingerprint = FP) -> torch.Tensor:
    if not hashes:
        return torch.empty((0, *fingerprint.block_shape), dtype=fingerprint.torch_dtype)
    return torch.stack([block_of(h, fingerprint) for h in hashes])


def chain(name: str, length: int, root: list[bytes] | None = None) -> list[bytes]:
    """``root`` followed by ``length`` hashes derived from ``name``."""
    hashes = list(root or [])
    for i in range(length):
        hashes.append(hashlib.sha256(f"{name}/{i}".encode()).digest())
    return hashes


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)
