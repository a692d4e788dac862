"""BlockLoads: the load half of KVBlockStore, and the checks and codec steps it shares.

``load`` reads the leading run of cached blocks of a chain straight into the caller's tensor
with one ``get_many`` (one engine submission on NVMe, each record's checksum verified);
``load_layer`` reads one layer of many blocks, a byte range of each: the blocks the NVMe tier
serves with one ``get_many(byte_ranges=...)`` of that tier (one submission, planned over arrays,
read in place where the destination is page-aligned; the tiered store's hit counters do not see
these reads), a block with a DRAM copy through the tiered store. The tier reads and checks only
the chunks of each record that cover the layer (a block of 1 MiB or more is a chunked record:
tiers.nvme.chunks), so a layer costs its own bytes, not its block's. With a codec the bytes land
in a staging buffer and are decoded into the caller's tensor.

A record that fails its checksum raises CorruptionError inside the tier; here the batch is
read again key by key, every damaged block is deleted and counted, and the load stops before
the first of them, so a caller gets a shorter prefix and recomputes the rest, never bad KV.

Concurrency: as KVBlockStore (its loop thread).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kvstore.block_index import BlockIndex, BlockInfo, check_hashes
from tiers import CorruptionError, InvalidArgumentError
from tiers.nvme import NvmeTier

if TYPE_CHECKING:
    from kvstore.fingerprint import ModelFingerprint
    from tiers import TieredStore

__all__ = ["BlockLoads"]

_PAGE_BYTES = 4096


class BlockLoads:
    """Mixed into KVBlockStore; the attributes below are the store's."""

    fingerprint: ModelFingerprint
    compression: Any
    object_bytes: int
    counters: dict[str, int]
    _store: TieredStore
    _index: BlockIndex

    # KVBlockStore's methods (declared here, defined there)
    _drop: Callable[[list[bytes]], Awaitable[int]]
    _touch: Callable[[list[bytes]], None]

    def _info(self, block_hash: bytes | None) -> BlockInfo | None:
        return self._index.blocks.get(block_hash) if block_hash is not None else None

    async def load(self, hashes: Any, into: torch.Tensor, *, touch: bool = False) -> int:
        """Fill ``into[i]`` (shape ``[n, *block_shape]``, the fingerprint's dtype) with block
        ``hashes[i]`` for the leading run of cached, intact blocks; returns how many. With
        ``touch`` the loaded blocks count as used (for callers that looked up without)."""
        chain = check_hashes(hashes)
        self._check_blocks(into, len(chain), "into")
        count = self._index.prefix_length(chain)
        if not count:
            return 0
        keys = [self._index.blocks[h].key for h in chain[:count]]
        if touch:
            self._touch(chain[:count])
        if self.compression is None and into.device.type == "cpu" and into.is_contiguous():
            outs: list[Any] = [into[i] for i in range(count)]
            return await self._read(chain, keys, outs)
        staging = torch.empty((count, self.object_bytes), dtype=torch.uint8)
        loaded = await self._read(chain, keys, [staging[i] for i in range(count)])
        if self.compression is not None:
            encoded = self.compression.encoded_bytes(self.fingerprint)  # before the padding
            if into.device.type == "cpu":  # the codec writes any strides: no second pass
                self.compression.decode_many(staging[:loaded, :encoded], into[:loaded])
            else:
                decoded = torch.empty((loaded, *self.fingerprint.block_shape), dtype=into.dtype)
                self.compression.decode_many(staging[:loaded, :encoded], decoded)
                into[:loaded].copy_(decoded)
        else:
            raw = staging[:loaded].view(self.fingerprint.torch_dtype)
            into[:loaded].copy_(raw.view(loaded, *self.fingerprint.block_shape))
        return loaded

    async def load_layer(self, hashes: Any, layer: int, into: torch.Tensor) -> int:
        """Fill ``into[i]`` (shape ``[n, *layer_shape]``) with layer ``layer`` of block
        ``hashes[i]`` for the leading run of cached, intact blocks; returns how many."""
        fingerprint = self.fingerprint
        if not 0 <= layer < fingerprint.num_layers:
            raise InvalidArgumentError(f"layer {layer} of a {fingerprint.num_layers}-layer model")
        if self.compression is not None:
            raise InvalidArgumentError("load_layer reads raw blocks; this store compresses")
        chain = check_hashes(hashes)
        if tuple(into.shape) != (len(chain), *fingerprint.layer_shape) or (
            into.dtype != fingerprint.torch_dtype or not into.is_contiguous()
        ):
            raise InvalidArgumentError(
                f"into must be a contiguous {fingerprint.dtype} tensor of shape "
                f"{(len(chain), *fingerprint.layer_shape)}, got {tuple(into.shape)} {into.dtype}"
            )
        count = self._index.prefix_length(chain)
        span = (layer * fingerprint.layer_bytes, fingerprint.layer_bytes)
        cpu = into if into.device.type == "cpu" else torch.empty_like(into, device="cpu")
        keys = [self._index.blocks[h].key for h in chain[:count]]
        results = await self._read_ranges(chain, keys, [cpu[i] for i in range(count)], span)
        loaded = _leading(results)
        if cpu is not into:
            into[:loaded].copy_(cpu[:loaded])
        self.counters["loaded_blocks"] += loaded
        return loaded

    async def _read_ranges(
        self, chain: list[bytes], keys: list[str], outs: list[Any], span: tuple[int, int]
    ) -> list[Any]:
        """``span`` of each key's block into its ``outs``: the blocks that the NVMe tier
        serves in one ``get_many`` with byte ranges (one submission, planned over arrays, a
        chunked record's range read in place when its destination allows), the others (a
        DRAM copy) by the tiered store's ``get``. Why not one gathered ``get`` per block:
        each of those is planned as its own record read and staged, then copied out (see
        benchmarks.kvstore.layer_loads)."""
        tier = self._store.tiers[-1]
        nvme = tier if isinstance(tier, NvmeTier) else None
        batched: list[int] = []
        if nvme is not None:
            batched = [s for s, key in enumerate(keys) if self._store.tier_of(key) == nvme.name]
        results: list[Any] = [None] * len(keys)

        async def one(slot: int) -> None:
            try:
                results[slot] = await self._store.get(keys[slot], into=outs[slot], byte_range=span)
            except CorruptionError:
                await self._damaged(chain[slot])

        async def batch() -> None:
            assert nvme is not None
            try:
                got = await nvme.get_many(
                    [keys[s] for s in batched], [outs[s] for s in batched],
                    byte_ranges=[span] * len(batched),
                )  # fmt: skip
            except CorruptionError:  # find the damaged ones, key by key
                await asyncio.gather(*(one(slot) for slot in batched))
                return
            for slot, value in zip(batched, got, strict=True):
                results[slot] = value

        singles = sorted(set(range(len(keys))).difference(batched))
        await asyncio.gather(*(one(slot) for slot in singles), *([batch()] if batched else []))
        return results

    async def _read(self, chain: list[bytes], keys: list[str], outs: list[Any]) -> int:
        try:
            results = await self._store.get_many(keys, into=outs)
        except CorruptionError:  # find the damaged ones, key by key
            results = []
            for slot, key in enumerate(keys):
                try:
                    results.append(await self._store.get(key, into=outs[slot]))
                except CorruptionError:
                    await self._damaged(chain[slot])
                    results.append(None)
        loaded = _leading(results)
        self.counters["loaded_blocks"] += loaded
        return loaded

    async def _damaged(self, block_hash: bytes) -> None:
        self.counters["corrupt_blocks"] += 1
        info = self._info(block_hash)
        if info is not None:
            info.pins = 0
            await self._drop([block_hash])

    def _check_blocks(self, blocks: Any, count: int, name: str) -> None:
        shape = (count, *self.fingerprint.block_shape)
        if not isinstance(blocks, torch.Tensor):
            raise InvalidArgumentError(f"{name} must be a torch.Tensor, got {type(blocks)}")
        if tuple(blocks.shape) != shape or blocks.dtype != self.fingerprint.torch_dtype:
            raise InvalidArgumentError(
                f"{name} must be a {self.fingerprint.dtype} tensor of shape {shape}, "
                f"got {tuple(blocks.shape)} {blocks.dtype}"
            )

    async def _encode(self, blocks: list[torch.Tensor]) -> list[Any]:
        """What each block is stored as: its bytes, or its codec's, padded to a page (so
        the NVMe record is bare: its size on disk is what the tier charges)."""
        if self.compression is None:
            return [block.contiguous() for block in blocks]
        encoded = self.compression.encode_many(torch.stack([b.cpu() for b in blocks]))
        padded = np.zeros((len(blocks), self.object_bytes), dtype=np.uint8)
        padded[:, : encoded.shape[1]] = encoded.numpy()
        return list(padded)


def _leading(results: list[Any]) -> int:
    for count, result in enumerate(results):
        if result is None:
            return count
    return len(results)


def padded_bytes(size_bytes: int) -> int:
    return -(-size_bytes // _PAGE_BYTES) * _PAGE_BYTES
