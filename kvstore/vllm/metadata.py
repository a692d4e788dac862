"""What the scheduler half tells the worker half each step: which blocks to load, which to save.

One ``BlockTransfer`` per request and direction: ``hashes[i]`` (vLLM's block hash, bytes) is
the tierkit key of paged block ``block_ids[i]``; for a save, ``parent`` is the hash of the
block before ``hashes[0]`` in the request (None at the start of a sequence), which tierkit's
prefix-aware eviction uses. The metadata is pickled from the engine core to the worker.

Thread-safety: plain values, built by one thread and read by another after the hand-off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

__all__ = ["BlockTransfer", "TierkitConnectorMetadata"]


@dataclass
class BlockTransfer:
    req_id: str
    hashes: list[bytes]
    block_ids: list[int]
    parent: bytes | None = None


@dataclass
class TierkitConnectorMetadata(KVConnectorMetadata):
    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)
