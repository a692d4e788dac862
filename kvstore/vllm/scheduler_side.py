"""The scheduler half of the tierkit connector: what to load and what to save, per request.

Keys are vLLM's own block hashes (``request.block_hashes``: sha256 bytes over the parent
hash, the block's tokens and extra keys such as LoRA, multimodal hashes and cache salt).
With the default ``prefix_caching_hash_algo="sha256"`` vLLM seeds the chain with a fixed
NONE_HASH (unless PYTHONHASHSEED is set), so equal prompts hash equally in any process and
a later server finds an earlier one's blocks. A non-crypto hash (xxhash) has a random seed
per process: then nothing is found again, but nothing wrong is loaded either.

Loads: ``matched_tokens`` asks the store (through ``lookup``) for the longest cached prefix
of the request's full blocks and offers the part beyond vLLM's own prefix-cache hit, never the
whole prompt (vLLM must compute at least one token to sample). ``after_alloc`` turns the
accepted offer into a ``BlockTransfer`` to the paged blocks vLLM allocated; loads are
synchronous (done in the worker's ``start_load_kv`` before the forward).

Saves: every full block whose KV the step computes (prompt and generated tokens alike) and
that the store did not already hold is saved once; a request rewound after a failed load
(vLLM lowers ``num_computed_tokens``) saves its recomputed blocks again.

The plan reaches the worker as ``TierkitConnectorMetadata``, built here by one thread and
read by the worker after vLLM hands it over.

Thread-safety: vLLM calls the scheduler connector from the engine core's one thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

__all__ = ["BlockTransfer", "SchedulerHalf", "TierkitConnectorMetadata"]

_log = logging.getLogger(__name__)


@dataclass
class BlockTransfer:
    """One request's blocks to move in one direction this step: ``hashes[i]`` (vLLM's block
    hash) is the store key of paged block ``block_ids[i]``; for a save, ``parent`` is the hash
    of the block before ``hashes[0]`` (None at a sequence's start), for prefix-aware eviction."""

    req_id: str
    hashes: list[bytes]
    block_ids: list[int]
    parent: bytes | None = None


@dataclass
class TierkitConnectorMetadata(KVConnectorMetadata):
    """What the scheduler half tells the worker half each step (pickled to the worker)."""

    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)


@dataclass
class _Tracked:
    request: Any  # vllm.v1.request.Request
    saved_blocks: int  # blocks [0, saved_blocks) are in the store or planned to be saved


class SchedulerHalf:
    def __init__(
        self,
        block_tokens: int,
        lookup: Callable[[Sequence[bytes]], int],
        block_ids_of: Callable[[str], list[int]],
    ) -> None:
        self._block_tokens = block_tokens
        self._lookup = lookup
        self._block_ids_of = block_ids_of  # req_id -> its paged block ids (first group)
        self._offers: dict[str, tuple[int, int]] = {}  # req_id -> (cached blocks, local tokens)
        self._tracked: dict[str, _Tracked] = {}
        self._loads: list[BlockTransfer] = []
        self.counters = {"queries": 0, "hit_tokens": 0, "planned_load_blocks": 0,
                         "planned_save_blocks": 0}  # fmt: skip

    def matched_tokens(self, request: Any, num_computed_tokens: int) -> int:
        """Tokens beyond ``num_computed_tokens`` (vLLM's block-aligned local hit) that the
        store can supply."""
        hashes = list(request.block_hashes)
        cached = self._lookup(hashes) if hashes else 0
        self._offers[request.request_id] = (cached, num_computed_tokens)
        loadable = min(cached, (request.num_tokens - 1) // self._block_tokens)
        offered = max(loadable * self._block_tokens - num_computed_tokens, 0)
        self.counters["queries"] += 1
        self.counters["hit_tokens"] += offered
        return offered

    def after_alloc(self, request: Any, block_ids: list[int], num_external_tokens: int) -> None:
        cached, local_tokens = self._offers.pop(request.request_id, (0, 0))
        self._tracked[request.request_id] = _Tracked(request, saved_blocks=cached)
        if num_external_tokens <= 0:
            return
        start = local_tokens // self._block_tokens
        count = -(-num_external_tokens // self._block_tokens)
        hashes = list(request.block_hashes[start : start + count])
        ids = list(block_ids[start : start + count])
        if len(hashes) != count or len(ids) != count:
            # vLLM would treat these tokens as loaded; an error here beats silent garbage
            raise RuntimeError(
                f"tierkit: request {request.request_id} offered {count} blocks from block "
                f"{start} but has {len(hashes)} hashes and {len(ids)} blocks there"
            )
        self._loads.append(BlockTransfer(request.request_id, hashes, ids))
        self.counters["planned_load_blocks"] += count

    def build(self, num_scheduled_tokens: dict[str, int]) -> TierkitConnectorMetadata:
        """This step's loads (accepted since the last call) and saves."""
        meta = TierkitConnectorMetadata(loads=self._loads)
        self._loads = []
        for req_id, scheduled in num_scheduled_tokens.items():
            tracked = self._tracked.get(req_id)
            if tracked is None:
                continue
            request = tracked.request
            computed = request.num_computed_tokens  # before this step
            # after a failed load vLLM rewinds num_computed_tokens: the blocks from there on
            # were dropped from the store (corrupt) and are computed again now
            tracked.saved_blocks = min(tracked.saved_blocks, computed // self._block_tokens)
            end = min((computed + scheduled) // self._block_tokens, len(request.block_hashes))
            start = tracked.saved_blocks
            if end <= start:
                continue
            hashes = list(request.block_hashes[start:end])
            ids = list(self._block_ids_of(req_id)[start:end])
            parent = request.block_hashes[start - 1] if start else None
            meta.saves.append(BlockTransfer(req_id, hashes, ids, parent))
            tracked.saved_blocks = end
            self.counters["planned_save_blocks"] += end - start
        return meta

    def finished(self, req_id: str) -> None:
        self._tracked.pop(req_id, None)
        self._offers.pop(req_id, None)
