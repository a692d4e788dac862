"""Hit rates of the real KVBlockStore replaying a trace, as an LLM server drives it.

For each request in order: ``n = await store.lookup(chain)`` (the longest cached prefix; a
server reuses only that), then ``store(chain[n:], blocks, parent=chain[n-1])`` as after its
prefill. Hit rate = prefix-hit blocks / block accesses.

Scaling: with every block the same size, a hit rate depends only on how many blocks fit, so
the replay uses a tiny fingerprint (``REPLAY_FP``: 1 layer, 16 tokens, 1 head, 64 dims, bf16:
4 KiB a block) and gives the store's last tier ``capacity_blocks * block_bytes``. That last
tier holds every cached block and its cap is what evicts (kvstore.block_store); on ``disk``
it is the NVMe tier (nothing in DRAM), on ``dram`` a DRAM tier alone (faster to replay,
same policy decisions).

Capacity check: after every ``store`` the largest ``used_bytes - capacity_bytes`` over the
tiers; and every ``du_every`` requests (and at the end) the bytes the store's directory
occupies on disk (sum of ``st_blocks * 512``) against the disk cap, in all and for its data
(extent) files alone: the LMDB catalog beside them is not counted by the tier.

Thread-safety: one asyncio loop; a store is used by one replay at a time.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.kvstore.trace import block_key
from kvstore import KVBlockStore, ModelFingerprint

_EXTENT_PREFIX = "extents-"  # the NVMe tier's data files; the rest is its catalog and lock

__all__ = [
    "REPLAY_FP",
    "ReplayCounts",
    "directory_bytes",
    "disk_bytes_for",
    "open_replay_store",
    "replay_requests",
]

REPLAY_FP = ModelFingerprint(
    model="bench-replay", dtype="bfloat16", num_layers=1, block_tokens=16, num_kv_heads=1,
    head_dim=64,
)  # fmt: skip


@dataclass
class ReplayCounts:
    accesses: int = 0
    hits: int = 0
    stored_blocks: int = 0
    max_resident_blocks: int = 0
    tier_overrun_bytes: int = -(1 << 62)  # max of used - capacity over tiers and stores
    disk_overrun_bytes: int = -(1 << 62)  # max of directory bytes - disk cap, when on disk
    max_directory_bytes: int = 0
    max_extent_overrun_bytes: int = -(1 << 62)  # the same for the extent (data) files alone
    elapsed_s: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "accesses": self.accesses,
            "hits": self.hits,
            "hit_rate": round(self.hit_rate, 5),
            "stored_blocks": self.stored_blocks,
            "max_resident_blocks": self.max_resident_blocks,
            "tier_overrun_bytes": self.tier_overrun_bytes,
            "disk_overrun_bytes": self.disk_overrun_bytes,
            "max_directory_bytes": self.max_directory_bytes,
            "max_extent_overrun_bytes": self.max_extent_overrun_bytes,
            "elapsed_s": round(self.elapsed_s, 2),
            **self.extra,
        }


def directory_bytes(directory: Path, prefix: str = "") -> int:
    """Bytes the files under ``directory`` whose names start with ``prefix`` occupy on disk
    (allocated blocks, not sizes)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            if not name.startswith(prefix):
                continue
            with contextlib.suppress(FileNotFoundError):  # removed while we walked
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def disk_bytes_for(capacity_blocks: int) -> int:
    """The ``disk_bytes`` that hold ``capacity_blocks`` replay blocks: with their catalog
    where the store charges it against the disk cap (``KVBlockStore.disk_bytes_for``), else
    the blocks' bytes."""
    sizing = getattr(KVBlockStore, "disk_bytes_for", None)
    if sizing is None:
        return capacity_blocks * REPLAY_FP.block_bytes
    return int(sizing(capacity_blocks, REPLAY_FP.block_bytes))


async def open_replay_store(
    directory: Path, capacity_blocks: int, policy: str, tier: str, *, create: bool = True
) -> KVBlockStore:
    """A store whose last tier holds ``capacity_blocks`` replay blocks (see module doc)."""
    capacity_bytes = capacity_blocks * REPLAY_FP.block_bytes
    if tier == "disk":
        return await KVBlockStore.open(
            directory, REPLAY_FP, disk_bytes=disk_bytes_for(capacity_blocks), policy=policy,
            create=create,
        )  # fmt: skip
    if tier == "dram":
        return await KVBlockStore.open(None, REPLAY_FP, dram_bytes=capacity_bytes, policy=policy)
    raise ValueError(f"tier must be 'disk' or 'dram', got {tier!r}")


async def replay_requests(
    store: KVBlockStore,
    requests: Sequence[Sequence[int]],
    counts: ReplayCounts,
    *,
    directory: Path | None = None,
    disk_cap_bytes: int = 0,
    data_cap_bytes: int | None = None,
    du_every: int = 500,
) -> ReplayCounts:
    """Replay ``requests`` on ``store``, adding to ``counts`` (returned). The directory is
    checked against ``disk_cap_bytes`` (the store's ``disk_bytes``), its extent files against
    ``data_cap_bytes`` (default: the same)."""
    longest = max((len(chain) for chain in requests), default=0)
    blocks = torch.zeros((max(longest, 1), *REPLAY_FP.block_shape), dtype=REPLAY_FP.torch_dtype)
    start_s = time.perf_counter()
    for number, chain in enumerate(requests, 1):
        keys = [block_key(block) for block in chain]
        cached = await store.lookup(keys)
        counts.accesses += len(keys)
        counts.hits += cached
        if cached < len(keys):
            parent = keys[cached - 1] if cached else None
            counts.stored_blocks += await store.store(
                keys[cached:], blocks[: len(keys) - cached], parent=parent
            )
        stats = store.stats()
        counts.max_resident_blocks = max(counts.max_resident_blocks, int(stats["blocks"]))
        for tier in stats["tiers"].values():
            overrun = int(tier["used_bytes"]) - int(tier["capacity_bytes"])
            counts.tier_overrun_bytes = max(counts.tier_overrun_bytes, overrun)
        if directory is not None and (number % du_every == 0 or number == len(requests)):
            used = directory_bytes(directory)
            counts.max_directory_bytes = max(counts.max_directory_bytes, used)
            counts.disk_overrun_bytes = max(counts.disk_overrun_bytes, used - disk_cap_bytes)
            data_cap = disk_cap_bytes if data_cap_bytes is None else data_cap_bytes
            extents = directory_bytes(directory, _EXTENT_PREFIX) - data_cap
            counts.max_extent_overrun_bytes = max(counts.max_extent_overrun_bytes, extents)
    counts.elapsed_s += time.perf_counter() - start_s
    return counts
