"""TierkitOffloadingWorker: the worker half of TierkitOffloadingSpec (kvstore.vllm.offloading).

It owns the store (opened on the process's tierkit runtime) and serves the scheduler-side
manager's lookups. vLLM hands it the KV caches canonicalised (``CanonicalKVCaches``): tensors
of ``[num_blocks, page_bytes]`` bytes, and per group the tensors (layers) that hold a block.
One offloaded block is the concatenation of its page in each of the group's tensors, in
order; that is the byte string stored under the block's key.

``submit_store`` / ``submit_load`` schedule the transfer on the store's loop thread and return
at once; ``get_finished`` reports finished jobs, ``wait`` blocks for some. A load that finds
fewer blocks than asked (evicted, or dropped as corrupt) fails its job, and vLLM recomputes.

On a GPU the page gathers below are device-to-host copies on the loop thread without a CUDA
stream of their own: correct but synchronous per job (UNTESTED on a GPU; tested here with CPU
tensors against the ABC).

Thread-safety: vLLM calls it from the worker's thread; the transfers run on the loop thread
and touch only the pages of their own job, which vLLM keeps allocated until it is reported.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import numpy as np
import torch
from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult

from kvstore.block_store import KVBlockStore
from kvstore.sync_store import SyncKVBlockStore
from kvstore.vllm.lookup_channel import LookupServer
from kvstore.vllm.offloading import TierkitLoadStoreSpec, TierkitOffloadingSpec
from tiers import default_runtime

__all__ = ["TierkitOffloadingWorker"]


class TierkitOffloadingWorker(OffloadingWorker):
    def __init__(self, spec: TierkitOffloadingSpec, kv_caches: Any) -> None:
        group = spec.config.groups[0].group_id if spec.config.groups else 0
        refs = kv_caches.group_data_refs[group]
        self._pages = [(kv_caches.tensors[ref.tensor_idx].tensor, ref.page_size_bytes)
                       for ref in refs]  # fmt: skip
        self.block_bytes = sum(size for _, size in self._pages)
        self.fingerprint = spec.fingerprint
        if self.block_bytes != self.fingerprint.block_bytes:
            raise ValueError(
                f"a block is {self.block_bytes} bytes in the KV caches, "
                f"{self.fingerprint.block_bytes} in the offloading config"
            )
        self._runtime = default_runtime()
        opening = KVBlockStore.open(spec.path, self.fingerprint, runtime=self._runtime,
                                    **spec.store_options)  # fmt: skip
        self.store: KVBlockStore = self._runtime.submit(opening).result()
        sync = SyncKVBlockStore(self.store, self._runtime, timeout_s=600.0)
        self._server = LookupServer(sync, spec.channel)
        self._jobs: dict[int, concurrent.futures.Future[TransferResult]] = {}

    def _gather(self, block_ids: np.ndarray) -> torch.Tensor:
        ids = torch.from_numpy(block_ids.astype(np.int64))
        parts = [tensor.view(torch.uint8)[ids.to(tensor.device), :size].cpu()
                 for tensor, size in self._pages]  # fmt: skip
        return torch.cat(parts, dim=1)

    def _scatter(self, block_ids: np.ndarray, rows: torch.Tensor) -> None:
        ids = torch.from_numpy(block_ids.astype(np.int64))
        start = 0
        for tensor, size in self._pages:
            data = rows[:, start : start + size].to(tensor.device)
            tensor.view(torch.uint8)[ids.to(tensor.device), :size] = data
            start += size

    def _as_blocks(self, rows: torch.Tensor) -> torch.Tensor:
        return rows.view(len(rows), *self.fingerprint.block_shape).view(
            self.fingerprint.torch_dtype
        )

    async def _store_job(self, job_id: int, block_ids: np.ndarray, keys: list[bytes]) -> Any:
        started = time.monotonic()
        rows = self._gather(block_ids)
        stored = await self.store.store(keys, self._as_blocks(rows))
        success = all(key in self.store for key in keys)
        return TransferResult(job_id, success, stored * self.block_bytes,
                              time.monotonic() - started)  # fmt: skip

    async def _load_job(self, job_id: int, block_ids: np.ndarray, keys: list[bytes]) -> Any:
        started = time.monotonic()
        rows = torch.empty((len(keys), self.block_bytes), dtype=torch.uint8)
        loaded = await self.store.load(keys, self._as_blocks(rows))
        self._scatter(block_ids[:loaded], rows[:loaded])
        return TransferResult(job_id, loaded == len(keys), loaded * self.block_bytes,
                              time.monotonic() - started)  # fmt: skip

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        assert isinstance(dst_spec, TierkitLoadStoreSpec)
        job = self._store_job(job_id, np.asarray(src_spec.block_ids), dst_spec.keys)
        self._jobs[job_id] = self._runtime.submit(job)
        return True

    def submit_load(
        self, job_id: int, src_spec: Any, dst_spec: Any, expedited: bool = False
    ) -> bool:
        assert isinstance(src_spec, TierkitLoadStoreSpec)
        job = self._load_job(job_id, np.asarray(dst_spec.block_ids), src_spec.keys)
        self._jobs[job_id] = self._runtime.submit(job)
        return True

    def get_finished(self) -> list[Any]:
        done = [job_id for job_id, future in self._jobs.items() if future.done()]
        return [self._result(job_id, self._jobs.pop(job_id)) for job_id in done]

    @staticmethod
    def _result(job_id: int, future: concurrent.futures.Future[Any]) -> Any:
        try:
            return future.result()
        except Exception:  # a failed transfer fails its job: vLLM recomputes or skips it
            return TransferResult(job_id, False)

    def wait(self, job_ids: set[int]) -> None:
        concurrent.futures.wait([self._jobs[j] for j in job_ids if j in self._jobs])

    def shutdown(self) -> None:
        concurrent.futures.wait(list(self._jobs.values()))
        self._server.close()
        self._runtime.submit(self.store.aclose()).result()
