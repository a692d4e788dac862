"""kvstore.vllm's offloading plug-ins against vLLM's ABCs, run by pytest INSIDE .venv-vllm.

Not collected by the main test run (no ``test_`` prefix): test_vllm_offload.py runs this file
with .venv-vllm's pytest. vLLM 0.32 runs offloading only on CUDA/XPU, so these drive the
plug-ins the way vLLM's offloading connector and tiering manager would, with CPU tensors and a
memoryview standing in for device and host memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    LookupResult,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager, TransferJob

from kvstore import KVBlockStore
from kvstore.vllm.offloading import TierkitOffloadingSpec
from kvstore.vllm.secondary_tier import TierkitSecondaryTier

PAGE_BYTES = 4096  # one layer's block
LAYERS = 2
BLOCKS = 16
CONTEXT = ReqContext(req_id="r0")


def _config(path: Path, model: str = "tiny") -> Any:
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(32, ("l0", "l1"), 0),),
        worker_kv_bytes_per_block=LAYERS * PAGE_BYTES,
        enable_kv_cache_events=False,
        extra_config={"path": str(path), "disk_bytes": 4 << 20, "policy": "lru"},
        engine_id="e0",
        model=OffloadingModelConfig(name=model, dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=32, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, False),
    )


def _kv_caches(seed: int) -> tuple[Any, list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    tensors = [torch.randint(-128, 127, (BLOCKS, PAGE_BYTES), dtype=torch.int8,
                             generator=generator) for _ in range(LAYERS)]  # fmt: skip
    caches = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(t, PAGE_BYTES) for t in tensors],
        group_data_refs=[[CanonicalKVCacheRef(i, PAGE_BYTES) for i in range(LAYERS)]],
    )
    return caches, tensors


def _keys(count: int, salt: bytes = b"") -> list[bytes]:
    return [make_offload_key(bytes([i]) * 31 + salt[:1].rjust(1, b"k"), 0) for i in range(count)]


def _run(worker: Any, submit: Any, job_id: int) -> Any:
    assert submit(job_id)
    worker.wait({job_id})
    (result,) = worker.get_finished()
    assert result.job_id == job_id
    return result


def test_spec_manager_and_worker_store_and_load_blocks_across_a_restart(tmp_path: Path) -> None:
    spec = TierkitOffloadingSpec(_config(tmp_path))
    caches, tensors = _kv_caches(seed=1)
    worker = spec.get_worker(caches)
    manager = spec.get_manager()
    keys = _keys(3)
    assert [manager.lookup(k, CONTEXT) for k in keys] == [LookupResult.MISS] * 3
    prepared = manager.prepare_store(keys, CONTEXT)
    assert prepared.keys_to_store == keys
    assert manager.lookup(keys[0], CONTEXT) == LookupResult.MISS  # in flight: not loadable
    source = GPULoadStoreSpec([4, 5, 6], [3], [0])
    result = _run(worker, lambda j: worker.submit_store(j, source, prepared.store_spec), 7)
    assert result.success and result.transfer_size == 3 * LAYERS * PAGE_BYTES
    manager.complete_store(keys, CONTEXT)
    assert [manager.lookup(k, CONTEXT) for k in keys] == [LookupResult.HIT] * 3
    assert manager.prepare_store(keys, CONTEXT).keys_to_store == []  # already offloaded
    expected = [t[[4, 5, 6]].clone() for t in tensors]
    worker.shutdown()
    manager.shutdown()

    # a new engine over the same directory: the blocks are found and load into new slots
    spec = TierkitOffloadingSpec(_config(tmp_path))
    caches, tensors = _kv_caches(seed=2)
    worker, manager = spec.get_worker(caches), spec.get_manager()
    assert [manager.lookup(k, CONTEXT) for k in keys] == [LookupResult.HIT] * 3
    load_spec = manager.prepare_load(keys, CONTEXT)
    target = GPULoadStoreSpec([9, 1, 12], [3], [0])
    result = _run(worker, lambda j: worker.submit_load(j, load_spec, target), 8)
    assert result.success
    for tensor, want in zip(tensors, expected, strict=True):
        assert torch.equal(tensor[[9, 1, 12]], want)
    worker.shutdown()
    manager.shutdown()


def test_a_load_of_a_missing_block_fails_its_job(tmp_path: Path) -> None:
    spec = TierkitOffloadingSpec(_config(tmp_path))
    caches, _ = _kv_caches(seed=3)
    worker = spec.get_worker(caches)
    load_spec = spec.get_manager().prepare_load(_keys(2), CONTEXT)
    result = _run(
        worker, lambda j: worker.submit_load(j, load_spec, GPULoadStoreSpec([0, 1], [2], [0])), 1
    )
    assert not result.success
    worker.shutdown()


def test_another_model_never_sees_the_blocks(tmp_path: Path) -> None:
    spec = TierkitOffloadingSpec(_config(tmp_path))
    caches, _ = _kv_caches(seed=4)
    worker, manager = spec.get_worker(caches), spec.get_manager()
    keys = _keys(1)
    prepared = manager.prepare_store(keys, CONTEXT)
    _run(worker, lambda j: worker.submit_store(j, GPULoadStoreSpec([0], [1], [0]),
                                               prepared.store_spec), 1)  # fmt: skip
    worker.shutdown()
    manager.shutdown()
    other = TierkitOffloadingSpec(_config(tmp_path, model="other"))
    caches, _ = _kv_caches(seed=5)
    worker, manager = other.get_worker(caches), other.get_manager()
    assert manager.lookup(keys[0], CONTEXT) == LookupResult.MISS
    worker.shutdown()
    manager.shutdown()


# ---------------------------------------------------------------- secondary tier
CHUNK_BYTES = 2048
SLOTS = 8


def _tier(path: Path, primary: memoryview, **options: Any) -> TierkitSecondaryTier:
    spec = TierkitOffloadingSpec(_config(path / "spec"))
    disk_bytes = options.pop("disk_bytes", 1 << 20)
    tier_path = str(path / "tier")
    return TierkitSecondaryTier(
        spec, primary, "TierkitSecondaryTier", path=tier_path, disk_bytes=disk_bytes, **options
    )


def _primary(seed: int) -> tuple[np.ndarray, memoryview]:
    rows = np.random.default_rng(seed).integers(0, 256, (SLOTS, CHUNK_BYTES), dtype=np.uint8)
    return rows, memoryview(rows)


def _finish(tier: SecondaryTierManager) -> list[Any]:
    tier.drain_jobs()
    return list(tier.get_finished_jobs())


def test_secondary_tier_cascades_and_promotes_chunks_through_the_memoryview(tmp_path: Path) -> None:
    rows, view = _primary(seed=1)
    assert view.strides[0] == CHUNK_BYTES
    tier = _tier(tmp_path, view)
    assert isinstance(tier, SecondaryTierManager)
    keys = _keys(3, b"s")
    assert tier.lookup(keys[0], CONTEXT) == LookupResult.MISS
    tier.submit_store(TransferJob(1, keys, np.array([2, 3, 5]), False, CONTEXT))
    (result,) = _finish(tier)
    assert result.success and sorted(result.successful_keys) == sorted(keys)
    assert [tier.lookup(k, CONTEXT) for k in keys] == [LookupResult.HIT] * 3
    expected = rows[[2, 3, 5]].copy()
    rows[:] = 0
    tier.submit_load(TransferJob(2, keys, np.array([7, 0, 1]), True, CONTEXT))
    (result,) = _finish(tier)
    assert result.success and result.transfer_bytes == 3 * CHUNK_BYTES
    assert np.array_equal(rows[[7, 0, 1]], expected)
    tier.shutdown()

    # restart: a new tier over the same directory still holds the chunks
    rows, view = _primary(seed=2)
    tier = _tier(tmp_path, view)
    assert [tier.lookup(k, CONTEXT) for k in keys] == [LookupResult.HIT] * 3
    tier.submit_load(TransferJob(3, keys[:1], np.array([4]), True, CONTEXT))
    assert _finish(tier)[0].success and np.array_equal(rows[4], expected[0])
    tier.shutdown()


def test_secondary_tier_keeps_to_its_capacity(tmp_path: Path) -> None:
    _, view = _primary(seed=3)
    tier = _tier(tmp_path, view, disk_bytes=KVBlockStore.disk_bytes_for(4, CHUNK_BYTES))
    for job in range(4):
        keys = _keys(2, bytes([job + 1]))
        tier.submit_store(TransferJob(job, keys, np.array([2 * job % SLOTS, 2 * job % SLOTS + 1]),
                                      False, CONTEXT))  # fmt: skip
        assert _finish(tier)[0].success
    assert len(tier.store) <= 4
    assert tier.store.stats()["tiers"]["nvme"]["used_bytes"] <= 4 * CHUNK_BYTES
    tier.shutdown()


def test_secondary_tier_load_of_a_missing_chunk_fails_the_job(tmp_path: Path) -> None:
    _, view = _primary(seed=4)
    tier = _tier(tmp_path, view)
    tier.submit_load(TransferJob(1, _keys(1, b"m"), np.array([0]), True, CONTEXT))
    (result,) = _finish(tier)
    assert not result.success and not result.successful_keys
    tier.shutdown()
