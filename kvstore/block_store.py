"""KVBlockStore: an LLM's KV-cache blocks on the tiered store, bounded and restart-safe.

A block is one ``block_tokens``-token slice of a sequence's KV for every layer, stored as one
object (layout: ``ModelFingerprint.block_shape``) under its block hash, in the namespace of the
model's fingerprint (kvstore.block_index has the key format). Blocks form chains: a block's
parent is the block before it in its sequence, and ``lookup`` returns the longest cached prefix
of a chain, since a server can only reuse a prefix.

Capacity: the last tier (NVMe, or DRAM when there is no disk) holds every block; its capacity
is a hard cap, enforced before each write by evicting blocks by the store's policy
(kvstore.policies), never by letting the tier overflow. DRAM above it keeps the hot blocks
(the tiered store's LRU). Pinned blocks are never evicted.

Durability: with a disk tier every ``store`` is written through to NVMe (one submission, one
fdatasync per file, one catalog commit) before it returns, so an acknowledged block survives
``kill -9``; each record is checksummed and verified on every load, and a block that fails
its check is dropped and counted, never returned. Reopening rebuilds the index from the
catalog's key list (no block is read).

Concurrency: one asyncio loop (the loop that opened it); any number of tasks may call it.
Writes (store, evict) are serialised by a lock; lookups and loads take none, and a block
evicted while it loads reads as a miss. SyncKVBlockStore wraps it for threads.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from kvstore.block_index import BlockIndex, check_hashes
from kvstore.block_loads import BlockLoads, padded_bytes
from kvstore.cache_tiers import gc_paused, open_cache_store
from kvstore.fingerprint import ModelFingerprint
from kvstore.policies import make_block_policy
from tiers import InvalidArgumentError, TieredStore
from tiers.io import IORuntime
from tiers.nvme import catalog_entry_bytes

__all__ = ["KVBlockStore"]


class KVBlockStore(BlockLoads):
    """Blocks of one model (``fingerprint``) on ``store``; see the module docstring."""

    def __init__(
        self,
        store: TieredStore,  # opened on the running loop
        fingerprint: ModelFingerprint,
        *,
        policy: str = "prefix",
        compression: Any = None,
        owns_store: bool = False,
    ) -> None:
        self.fingerprint = fingerprint
        self.compression = compression
        self.policy_name = policy
        self._store = store
        self._owns_store = owns_store
        self._policy = make_block_policy(policy)
        self._index = BlockIndex(_namespace(fingerprint, compression))
        self.object_bytes = _object_bytes(fingerprint, compression)
        self._lock = asyncio.Lock()
        self.counters = dict.fromkeys(
            ("lookups", "hit_blocks", "miss_blocks", "stored_blocks", "evicted_blocks",
             "loaded_blocks", "corrupt_blocks", "rejected_blocks", "declined_blocks"), 0,
        )  # fmt: skip
        self._policy.size_for(store.tiers[-1].capacity_bytes // self.object_bytes)
        self._policy.admit_many(self._index.rebuild(store.keys("kv/")))

    @classmethod
    async def open(
        cls,
        directory: str | os.PathLike[str] | None,
        fingerprint: ModelFingerprint,
        *,
        disk_bytes: int = 0,
        dram_bytes: int = 0,
        policy: str = "prefix",
        create: bool = True,
        compression: Any = None,
        runtime: IORuntime | None = None,
    ) -> KVBlockStore:
        """A store with a DRAM tier of ``dram_bytes`` (0: none) above an NVMe tier of
        ``disk_bytes`` in ``directory`` (0: none, and nothing survives a restart). The disk cap
        covers the whole directory: blocks, the extent files' growth and the tier's catalog
        (``disk_bytes_for`` sizes it in blocks). With ``create=False`` a directory that holds
        no store is an error, not a new cache."""
        object_bytes = _object_bytes(fingerprint, compression)
        data_bytes = _data_bytes(disk_bytes, object_bytes) if disk_bytes else 0
        store = await open_cache_store(
            directory, dram_bytes=dram_bytes, disk_bytes=data_bytes, create=create,
            runtime=runtime,
        )  # fmt: skip
        try:
            with gc_paused():
                return cls(
                    store, fingerprint, policy=policy, compression=compression, owns_store=True
                )
        except BaseException:
            await store.aclose()
            raise

    @staticmethod
    def disk_bytes_for(blocks: int, block_bytes: int) -> int:
        """The ``disk_bytes`` that hold ``blocks`` blocks of ``block_bytes`` (a fingerprint's
        ``block_bytes``, or a compressed store's ``object_bytes``) with their catalog."""
        return _CATALOG_BASE_BYTES + blocks * (block_bytes + _catalog_bytes_per_block(block_bytes))

    # ------------------------------------------------------------------ lookups
    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._index.blocks

    async def lookup(self, hashes: Iterable[bytes], *, touch: bool = True) -> int:
        """How many of ``hashes``, from the first, are cached (no I/O). With ``touch`` those
        count as used (the policy's hit); without, no block's standing changes (vLLM's
        scheduler asks again and again about one request: its load touches instead). Either
        way an admission filter learns that the chain was asked for."""
        chain = check_hashes(hashes)
        count = self._index.prefix_length(chain)
        if self._policy.admission is not None:
            self._policy.admission.looked_up(chain)
        if not touch:
            return count
        self._touch(chain[:count])
        self.counters["lookups"] += 1
        self.counters["hit_blocks"] += count
        self.counters["miss_blocks"] += len(chain) - count
        return count

    async def lookup_many(
        self, chains: Iterable[Iterable[bytes]], *, touch: bool = True
    ) -> list[int]:
        return [await self.lookup(chain, touch=touch) for chain in chains]

    def _touch(self, hashes: list[bytes]) -> None:
        for block_hash in hashes:
            info = self._index.blocks.get(block_hash)
            if info is not None:
                self._policy.touch(info.key)

    # ------------------------------------------------------------------ writes
    async def store(
        self, hashes: Iterable[bytes], blocks: torch.Tensor, *, parent: bytes | None = None
    ) -> int:
        """Store the blocks of a chain: ``blocks[i]`` under ``hashes[i]``, whose parent is
        ``hashes[i - 1]`` (``parent`` for the first). Blocks already cached are skipped;
        room is made by evicting other blocks. Returns how many were stored: fewer than
        asked when the policy's admission filter declines the chain's last blocks (counted
        in ``declined_blocks``), or when pinned blocks leave too little room (counted in
        ``rejected_blocks``); either way the chain's first blocks are the ones stored, since
        a later block is useless without them."""
        chain = check_hashes(hashes)
        parents = [check_hashes([parent])[0] if parent is not None else None, *chain[:-1]]
        self._check_blocks(blocks, len(chain), "blocks")
        async with self._lock:
            fresh = {}
            for slot, block_hash in enumerate(chain):
                if block_hash not in self._index.blocks and block_hash not in fresh:
                    fresh[block_hash] = slot
            if not fresh:
                return 0
            offered = list(fresh.values())
            admission = self._policy.admission
            admitted = len(offered)
            if admission is not None:
                admitted = admission.admit_count(len(chain), offered)
                admission.offered(((chain[s], len(chain) - 1 - s) for s in offered), admitted)
                self.counters["declined_blocks"] += len(offered) - admitted
            protected = {info.key for h in (*chain, parents[0]) if (info := self._info(h))}
            count = await self._make_room(admitted, protected) if admitted else 0
            slots = offered[:count]
            self.counters["rejected_blocks"] += admitted - count
            if not slots:
                return 0
            payloads = await self._encode([blocks[slot] for slot in slots])
            infos = [self._index.add(chain[s], parents[s]) for s in slots]
            try:
                await self._store.put_many(
                    {info.key: data for info, data in zip(infos, payloads, strict=True)}
                )
            except BaseException:
                for slot in slots:
                    self._index.remove(chain[slot])
                raise
            for slot, info in zip(slots, infos, strict=True):
                parent_info = self._info(parents[slot])
                self._policy.admit(info.key, parent_info.key if parent_info else None, info.depth)
            self.counters["stored_blocks"] += len(slots)
            return len(slots)

    async def evict(self, hashes: Iterable[bytes]) -> int:
        """Drop the unpinned blocks of ``hashes``; how many were dropped."""
        chain = check_hashes(hashes)
        async with self._lock:
            victims = [h for h in chain if (info := self._info(h)) and not info.pins]
            return await self._drop(victims)

    async def pin(self, hashes: Iterable[bytes]) -> int:
        """Keep the cached blocks of ``hashes`` from eviction until as many ``unpin``s;
        how many were cached (and are now pinned)."""
        pinned = 0
        for block_hash in check_hashes(hashes):
            info = self._info(block_hash)
            if info is not None:
                info.pins += 1
                pinned += 1
        return pinned

    async def unpin(self, hashes: Iterable[bytes]) -> int:
        unpinned = 0
        for block_hash in check_hashes(hashes):
            info = self._info(block_hash)
            if info is not None and info.pins:
                info.pins -= 1
                unpinned += 1
        return unpinned

    async def _make_room(self, wanted: int, protected: set[str]) -> int:
        """Evict until ``wanted`` blocks fit in the last tier, or as many as can; returns
        how many fit. Victims leave the policy as they are chosen (so a prefix policy offers
        a parent once its last child is chosen) and are deleted in one batch."""
        tier = self._store.tiers[-1]
        size = self.object_bytes
        fits = min(wanted, tier.capacity_bytes // size)
        missing = fits * size - tier.free_bytes
        victims: list[bytes] = []
        if missing > 0:
            candidates = self._policy.victims()
            try:
                for key in candidates:
                    block_hash = self._index.by_key.get(key)
                    info = self._index.blocks.get(block_hash) if block_hash else None
                    if info is None or info.pins or key in protected:
                        continue
                    self._policy.forget(key)
                    victims.append(block_hash)  # type: ignore[arg-type]
                    missing -= size
                    if missing <= 0:
                        break
            finally:  # let the policy take back what it offered and we kept
                getattr(candidates, "close", lambda: None)()
            await self._drop(victims)
        return min(fits, max(0, tier.free_bytes // size))

    async def _drop(self, victims: Sequence[bytes]) -> int:
        keys = []
        for block_hash in victims:
            info = self._index.remove(block_hash)
            if info is not None:
                self._policy.forget(info.key)
                keys.append(info.key)
        if keys:
            await self._store.delete_many(keys)
            self.counters["evicted_blocks"] += len(keys)
        return len(keys)

    # ------------------------------------------------------------------ the rest
    def stats(self) -> dict[str, Any]:
        tiers = {
            tier.name: {"used_bytes": tier.used_bytes, "capacity_bytes": tier.capacity_bytes}
            for tier in self._store.tiers
        }
        return {
            "blocks": len(self._index),
            "block_bytes": self.object_bytes,
            "policy": self.policy_name,
            "namespace": self._index.namespace,
            "tiers": tiers,
            **self.counters,
            "admission_reuse_rates": (
                self._policy.admission.rates() if self._policy.admission is not None else None
            ),
        }

    async def aclose(self) -> None:
        async with self._lock:
            if self._owns_store:
                await self._store.aclose()


def _object_bytes(fingerprint: ModelFingerprint, compression: Any) -> int:
    if compression is None:
        return fingerprint.block_bytes
    return padded_bytes(compression.encoded_bytes(fingerprint))


# The tier's LMDB catalog lives in the same directory but is not charged to the tier: measured
# ~250 bytes a block (key, entry, B-tree pages, free pages of copy-on-write), so twice that,
# plus twice the CRC table a record of 1 MiB or more carries in its entry (4 B a 256 KiB chunk).
_CATALOG_BYTES_PER_BLOCK = 512
_CATALOG_BASE_BYTES = 64 << 10


def _catalog_bytes_per_block(object_bytes: int) -> int:
    return _CATALOG_BYTES_PER_BLOCK + 2 * (catalog_entry_bytes(object_bytes) - _PLAIN_ENTRY_BYTES)


_PLAIN_ENTRY_BYTES = catalog_entry_bytes(1)


def _data_bytes(disk_bytes: int, object_bytes: int) -> int:
    """What the blocks may take of ``disk_bytes``, so the whole directory stays within it."""
    per_block = object_bytes + _catalog_bytes_per_block(object_bytes)
    blocks = (disk_bytes - _CATALOG_BASE_BYTES) // per_block
    if blocks < 1:
        raise InvalidArgumentError(
            f"disk_bytes {disk_bytes} cannot hold one {object_bytes}-byte block and its "
            f"catalog ({_CATALOG_BASE_BYTES + per_block} bytes)"
        )
    return blocks * object_bytes


def _namespace(fingerprint: ModelFingerprint, compression: Any) -> str:
    if compression is None:
        return fingerprint.digest()
    codec = repr(sorted(compression.describe().items()))
    return hashlib.sha256(f"{fingerprint.digest()}|{codec}".encode()).hexdigest()[:16]
