"""TierkitOffloadingSpec: vLLM's OffloadingConnector with a tierkit store as the offload medium.

Selected with ``kv_connector="OffloadingConnector"`` and ``kv_connector_extra_config``
``{"spec_name": "TierkitOffloadingSpec", "spec_module_path": "kvstore.vllm.offloading",
"path": ..., "disk_bytes": ..., "dram_bytes": ..., "policy": "lru"}``. The spec builds:

- ``TierkitOffloadingManager`` (scheduler process): which blocks are offloaded. It asks the
  store, which the worker owns, over kvstore.vllm.lookup_channel (a tierkit store admits one
  opening process), so blocks stored before a restart are found; blocks whose store is still
  in flight read as MISS until ``complete_store``. The spec it hands the worker is a
  ``TierkitLoadStoreSpec``: the keys themselves, since the store addresses blocks by key.
- ``TierkitOffloadingWorker`` (kvstore.vllm.offloading_worker; worker process): the
  transfers, asynchronous on the store's loop thread.

Scope: one KV cache group, ``blocks_per_chunk == 1`` (an offloaded block is one vLLM block);
the store evicts by its own policy, so ``PrepareStoreOutput.evicted_keys`` is empty and no
eviction events are emitted. vLLM 0.32 runs its offloading connector only on CUDA or XPU, so
this spec is tested against the ABCs with CPU tensors and never inside an engine (UNTESTED
on a GPU).

Thread-safety: vLLM 0.32 calls the manager from the scheduler thread. vLLM 0.33 asks a
manager entered from other threads for a real ``lock`` property, and callers to hold it; this
one provides it, and its lookup client (one socket) relies on that.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from typing import Any

from vllm.v1.kv_offload.base import (
    LoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingSpec,
    PrepareStoreOutput,
    RequestOffloadingContext,
)

from kvstore.fingerprint import ModelFingerprint
from kvstore.vllm.chunk_format import chunk_fingerprint
from kvstore.vllm.lookup_channel import LookupClient, channel_name

__all__ = ["TierkitLoadStoreSpec", "TierkitOffloadingManager", "TierkitOffloadingSpec"]


class TierkitLoadStoreSpec(LoadStoreSpec):
    """Where blocks live in the tierkit medium: their keys, in transfer order."""

    def __init__(self, keys: Collection[bytes]) -> None:
        self.keys = [bytes(key) for key in keys]

    def __repr__(self) -> str:
        return f"TierkitLoadStoreSpec({len(self.keys)} keys)"


class TierkitOffloadingSpec(OffloadingSpec):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        extra = dict(self.extra_config)
        if not extra.get("path"):
            raise ValueError("TierkitOffloadingSpec needs kv_connector_extra_config['path']")
        if len(config.groups) != 1 or self.blocks_per_chunk != 1:
            raise ValueError("TierkitOffloadingSpec supports one KV group and blocks_per_chunk=1")
        self.path = str(extra["path"])
        self.store_options: dict[str, Any] = {
            "disk_bytes": int(extra.get("disk_bytes", 0)),
            "dram_bytes": int(extra.get("dram_bytes", 0)),
            "policy": str(extra.get("policy", "lru")),
        }
        self.fingerprint: ModelFingerprint = chunk_fingerprint(
            self, config.worker_kv_bytes_per_block, extra.get("model_id")
        )
        self.channel = channel_name(self.path, self.fingerprint)

    def get_manager(self) -> TierkitOffloadingManager:
        return TierkitOffloadingManager(LookupClient(self.channel))

    def get_worker(self, kv_caches: Any) -> Any:
        from kvstore.vllm.offloading_worker import TierkitOffloadingWorker

        return TierkitOffloadingWorker(self, kv_caches)


class TierkitOffloadingManager(OffloadingManager):
    def __init__(self, client: LookupClient) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._storing: set[bytes] = set()  # prepared, not yet completed: not loadable

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def lookup(self, key: bytes, req_context: Any) -> Any:
        key = bytes(key)
        if key in self._storing:
            return LookupResult.MISS
        return LookupResult.HIT if self._client.lookup([key]) == 1 else LookupResult.MISS

    def prepare_load(self, keys: Collection[bytes], req_context: Any) -> TierkitLoadStoreSpec:
        # no pin: the store may evict a block before the worker reads it; the load then
        # fails and vLLM recomputes (a pin would need one more round trip per request)
        return TierkitLoadStoreSpec(keys)

    def prepare_store(self, keys: Collection[bytes], req_context: Any) -> PrepareStoreOutput:
        wanted = [bytes(key) for key in keys if key not in self._storing]
        cached = {key for key in wanted if self._client.lookup([key]) == 1}
        fresh = [key for key in wanted if key not in cached]
        self._storing.update(fresh)
        return PrepareStoreOutput(
            keys_to_store=fresh, store_spec=TierkitLoadStoreSpec(fresh), evicted_keys=[]
        )

    def complete_store(
        self, keys: Collection[bytes], req_context: Any, success: bool = True
    ) -> None:
        self._storing.difference_update(bytes(key) for key in keys)

    def on_new_request(self, req_context: Any) -> Any:
        return RequestOffloadingContext()

    def shutdown(self) -> None:
        self._client.close()
