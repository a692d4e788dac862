"""The worker half of the tierkit connector: copies blocks between the store and vLLM's paged
KV cache.

The worker owns the store (``SyncKVBlockStore``, opened here) and serves the scheduler's
lookups (kvstore.vllm.lookup_channel). Per step, with the scheduler's metadata bound:

- ``start_load_kv`` (before the forward): per request one ``load`` of all its blocks into a
  staging tensor in tierkit layout, then one index-copy per layer into the paged cache. The
  store returns the leading run of blocks that passed their checksum; the rest are reported
  through ``load_errors`` so vLLM (``kv_load_failure_policy="recompute"``) recomputes them, and
  the request saves nothing this step (its new KV attended to the missing blocks).
- ``save_kv_layer`` (after each layer's attention wrote its KV): gathers the planned blocks of
  that layer into a per-request staging tensor.
- ``wait_for_save`` (end of step): one ``store`` per request; it returns once the blocks are
  durable (written through to disk when the store has a disk tier).

Loads and saves are synchronous: on CPU the copies are memcpy and the store's own I/O runs on
its loop thread. A GPU would want the gather on a side stream and an async store; UNTESTED
on a GPU (``PagedLayout``'s GPU mapping is read from vLLM's source, never run).

Thread-safety: vLLM calls the worker connector from the worker's one thread.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import torch

from kvstore.fingerprint import ModelFingerprint
from kvstore.sync_store import SyncKVBlockStore
from kvstore.vllm.layout import PagedLayout, layer_order
from kvstore.vllm.lookup_channel import LookupServer, channel_name
from kvstore.vllm.scheduler_side import TierkitConnectorMetadata

__all__ = ["WorkerHalf"]

_log = logging.getLogger(__name__)


class WorkerHalf:
    def __init__(
        self,
        store: SyncKVBlockStore,
        directory: str,
        *,
        layout: PagedLayout,
        stats_path: str | None = None,
    ) -> None:
        self.store = store
        self.fingerprint: ModelFingerprint = store.fingerprint
        self._layout = layout
        self._stats_path = stats_path
        self._server = LookupServer(store, channel_name(directory, self.fingerprint))
        self._caches: dict[str, torch.Tensor] = {}  # layer name -> its paged KV tensor
        self._layer_index: dict[str, int] = {}
        self._staged: dict[str, torch.Tensor] = {}  # req_id -> blocks being saved this step
        self._failed_reqs: set[str] = set()  # requests whose load failed this step
        self._load_errors: set[int] = set()
        self.counters = {"loaded_blocks": 0, "failed_load_blocks": 0, "saved_blocks": 0,
                         "skipped_save_blocks": 0, "load_calls": 0, "store_calls": 0}  # fmt: skip
        # wall time in the store's load (with the scatter), the per-layer gathers, the stores
        self.seconds = {"load": 0.0, "gather": 0.0, "store": 0.0}

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._layer_index = layer_order(list(kv_caches))
        if len(self._layer_index) != self.fingerprint.num_layers:
            raise ValueError(
                f"{len(kv_caches)} KV cache layers, fingerprint has {self.fingerprint.num_layers}"
            )
        self._caches = dict(kv_caches)

    def start_load(self, meta: TierkitConnectorMetadata) -> None:
        # vLLM calls this before the forward when the step has sync loads (ours always are)
        # and after it otherwise, so the failed set lives until the step ends (wait_for_save)
        for load in meta.loads:
            started = time.perf_counter()
            count = len(load.hashes)
            staging = torch.empty((count, *self.fingerprint.block_shape),
                                  dtype=self.fingerprint.torch_dtype)  # fmt: skip
            try:
                loaded = self.store.load(load.hashes, staging, touch=True)
            except Exception:  # a broken store must cost a recompute, not the server
                _log.exception("tierkit: loading %d blocks failed", count)
                loaded = 0
            self.counters["load_calls"] += 1
            if loaded:
                ids = torch.tensor(load.block_ids[:loaded], dtype=torch.long)
                for name, paged in self._caches.items():
                    layer = staging[:loaded, self._layer_index[name]]
                    self._layout.scatter(paged, ids, layer)
            self.seconds["load"] += time.perf_counter() - started
            self.counters["loaded_blocks"] += loaded
            if loaded < count:
                self._load_errors.update(load.block_ids[loaded:])
                self._failed_reqs.add(load.req_id)
                self.counters["failed_load_blocks"] += count - loaded
                _log.warning("tierkit: %s loaded %d of %d blocks; vLLM recomputes the rest",
                             load.req_id, loaded, count)  # fmt: skip

    def save_layer(self, meta: TierkitConnectorMetadata, layer_name: str, kv_layer: Any) -> None:
        if not meta.saves:
            return
        layer = self._layer_index.get(layer_name)
        if layer is None:
            return  # not an attention layer this connector registered
        started = time.perf_counter()
        for save in meta.saves:
            if save.req_id in self._failed_reqs:
                continue
            staging = self._staged.get(save.req_id)
            if staging is None:
                staging = torch.empty((len(save.hashes), *self.fingerprint.block_shape),
                                      dtype=self.fingerprint.torch_dtype)  # fmt: skip
                self._staged[save.req_id] = staging
            ids = torch.tensor(save.block_ids, dtype=torch.long)
            staging[:, layer] = self._layout.gather(kv_layer, ids)
        self.seconds["gather"] += time.perf_counter() - started

    def wait_for_save(self, meta: TierkitConnectorMetadata | None) -> None:
        started = time.perf_counter()
        for save in meta.saves if meta is not None else ():
            staging = self._staged.pop(save.req_id, None)
            if staging is None:
                self.counters["skipped_save_blocks"] += len(save.hashes)
                continue
            try:
                self.counters["saved_blocks"] += self.store.store_blocks(
                    save.hashes, staging, parent=save.parent
                )
            except Exception:  # a failed save is a future miss, not a failed request
                _log.exception("tierkit: saving %d blocks failed", len(save.hashes))
            self.counters["store_calls"] += 1
        self.seconds["store"] += time.perf_counter() - started
        self._staged.clear()
        self._failed_reqs.clear()
        self._write_stats()

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def _write_stats(self) -> None:
        if not self._stats_path:
            return
        seconds = {f"{name}_s": round(value, 6) for name, value in self.seconds.items()}
        stats = {"pid": os.getpid(), **self.counters, **seconds, "store": self.store.stats()}
        temporary = f"{self._stats_path}.tmp"
        with open(temporary, "w") as f:
            json.dump(stats, f, sort_keys=True)
        os.replace(temporary, self._stats_path)

    def close(self) -> None:
        self._server.close()
        self.store.close()
