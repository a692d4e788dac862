"""TierkitSecondaryTier: a bounded, restart-safe tierkit store behind vLLM's CPU offload tier.

vLLM 0.32's ``TieringOffloadingSpec`` keeps a CPU (primary) tier of KV chunks and cascades
stores to secondary tiers, promoting loads back through the CPU tier. Its own disk tier
(``fs``) has no capacity limit, no eviction and no restart index; this one is a KVBlockStore:
a hard byte cap enforced by eviction (``policy``), checksummed records, and an index rebuilt
on reopen. Configure it as::

    "kv_connector": "OffloadingConnector",
    "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": ..., "secondary_tiers": [{"type": "TierkitSecondaryTier",
        "module_path": "kvstore.vllm.secondary_tier", "path": "/nvme/kv",
        "disk_bytes": 300 << 30, "dram_bytes": 0, "policy": "lru"}]}

A chunk is opaque here: the tier sees the primary tier's memory as a ``memoryview`` whose
rows (``strides[0]`` bytes) are chunk slots, and stores a row's bytes under its
``OffloadKey``. The fingerprint (kvstore.vllm.chunk_format) names the chunk format so that
another model or layout never reads these bytes.

Threads: vLLM calls every method from the scheduler thread and wants them non-blocking, so
``submit_store`` / ``submit_load`` only schedule a coroutine on the store's loop thread, which
copies between the memoryview and the store; ``get_finished_jobs`` collects finished ones.
``lookup`` reads the store's in-memory index (a dict membership test under the GIL).

Tested against the ABC with a memoryview over a bytearray (tests/kvstore/vllm); never run
inside a vLLM engine: vLLM's CPU offloading needs a CUDA or XPU device (UNTESTED on a GPU).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np
import torch
from vllm.v1.kv_offload.base import LookupResult, Medium, RequestOffloadingContext
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from kvstore.block_store import KVBlockStore
from kvstore.vllm.chunk_format import chunk_fingerprint, chunk_rows
from tiers import default_runtime

__all__ = ["TierkitSecondaryTier"]


class TierkitSecondaryTier(SecondaryTierManager):
    medium: ClassVar[Any] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        *,
        path: str,
        disk_bytes: int,
        dram_bytes: int = 0,
        policy: str = "lru",
        model_id: str | None = None,
        locality: str | None = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.fingerprint = chunk_fingerprint(offloading_spec, self.block_size_bytes, model_id)
        self._rows = chunk_rows(primary_kv_view, self.block_size_bytes)
        self._runtime = default_runtime()
        opening = KVBlockStore.open(path, self.fingerprint, disk_bytes=disk_bytes,
                                    dram_bytes=dram_bytes, policy=policy,
                                    runtime=self._runtime)  # fmt: skip
        self.store: KVBlockStore = self._runtime.submit(opening).result()
        self._jobs: dict[int, concurrent.futures.Future[JobResult]] = {}

    def lookup(self, key: bytes, req_context: Any) -> Any:
        return LookupResult.HIT if bytes(key) in self.store else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, self._store_job(job_metadata))

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, self._load_job(job_metadata))

    def _submit(self, job: TransferJob, coroutine: Any) -> None:
        if len(job.keys) != len(job.chunk_ids):
            coroutine.close()
            raise ValueError(f"job {job.job_id}: {len(job.keys)} keys, {len(job.chunk_ids)} ids")
        self._jobs[job.job_id] = self._runtime.submit(coroutine)

    def _blocks(self, count: int) -> torch.Tensor:
        return torch.empty((count, *self.fingerprint.block_shape), dtype=torch.uint8)

    async def _store_job(self, job: TransferJob) -> JobResult:
        started = time.monotonic()
        keys = [bytes(key) for key in job.keys]
        ids = torch.from_numpy(np.asarray(job.chunk_ids, dtype=np.int64))
        blocks = self._rows[ids].view(len(keys), *self.fingerprint.block_shape)
        stored = await self.store.store(keys, blocks.view(self.fingerprint.torch_dtype))
        present = [key for key in keys if key in self.store]
        return JobResult(job.job_id, success=len(present) == len(keys), successful_keys=present,
                         transfer_time=time.monotonic() - started,
                         transfer_bytes=stored * self.block_size_bytes)  # fmt: skip

    async def _load_job(self, job: TransferJob) -> JobResult:
        started = time.monotonic()
        keys = [bytes(key) for key in job.keys]
        staging = self._blocks(len(keys))
        loaded = await self.store.load(keys, staging.view(self.fingerprint.torch_dtype))
        ids = torch.from_numpy(np.asarray(job.chunk_ids, dtype=np.int64))[:loaded]
        self._rows[ids] = staging[:loaded].view(loaded, self.block_size_bytes)
        return JobResult(job.job_id, success=loaded == len(keys), successful_keys=keys[:loaded],
                         transfer_time=time.monotonic() - started,
                         transfer_bytes=loaded * self.block_size_bytes)  # fmt: skip

    def get_finished_jobs(self) -> Iterable[JobResult]:
        done = [job_id for job_id, future in self._jobs.items() if future.done()]
        return [self._result(job_id, self._jobs.pop(job_id)) for job_id in done]

    @staticmethod
    def _result(job_id: int, future: concurrent.futures.Future[JobResult]) -> JobResult:
        try:
            return future.result()
        except Exception:  # a failed transfer is a failed job, never a failed scheduler
            return JobResult(job_id, success=False)

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    def on_new_request(self, req_context: Any) -> Any:
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        concurrent.futures.wait(list(self._jobs.values()))

    def get_stats(self) -> None:
        return None  # vLLM's stats object is a GPU-build class; store.stats() has ours

    def shutdown(self) -> None:
        self.drain_jobs()
        self._runtime.submit(self.store.aclose()).result()
