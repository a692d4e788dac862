"""HbmTier: the accelerator-memory tier, objects carved from one preallocated torch tensor.

The arena is a single ``torch.empty(arena_bytes, dtype=uint8, device=device)`` made at
construction; an object is a slice of it, so nothing is allocated on the device per object. A get
without ``into`` returns a clone of the slice (a new uint8 tensor on the device: the caller never
aliases the arena, which compaction may rearrange); with ``into`` (any device, any dtype, or a host
buffer) it copies into it. Puts take tensors on any device and host buffers. The device is CUDA
where torch has it and the CPU otherwise (tests run the same code there). torch is imported by the
constructor, so ``import tiers`` does not need it.

Concurrency: one asyncio loop thread (see Tier). Copies between device tensors are ordered on the
current CUDA stream; copies to and from host memory return once the host side is done.
An arena larger than the device's memory is refused before allocating, and an allocation the
device refuses (out of memory) is a NoMemoryError naming the tier.

Invariants: the arena tensor never changes for the tier's life; results never alias it.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from tiers.io.byte_views import host_bytes, is_tensor, tensor_bytes
from tiers.io.errors import EngineUnavailableError, InvalidArgumentError
from tiers.memory.arena import ArenaTier

__all__ = ["HbmTier"]

_MOVE_CHUNK_BYTES = 64 << 20  # staging size for overlapping moves inside the arena


class HbmTier(ArenaTier):
    """``capacity_bytes`` of memory on ``device`` (default: "cuda" if available, else "cpu")."""

    kind = "hbm"
    read_latency_s = 1e-5  # a device-to-device copy launch, roughly
    read_bandwidth_bytes_per_s = 1e12

    def __init__(self, name: str, capacity_bytes: int, *, device: Any = None) -> None:
        try:
            import torch
        except ImportError as exc:
            raise EngineUnavailableError("hbm", f"torch is not installed ({exc})") from exc
        super().__init__(name, capacity_bytes, alignment_bytes=256)
        self._torch = torch
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise InvalidArgumentError(f"hbm tier {name!r}: unknown device {device!r}") from exc
        if self.device.type == "cpu":
            # The same code on the host: model a slower device so placement is not misled.
            self.read_latency_s, self.read_bandwidth_bytes_per_s = 1e-7, 10e9
        self._check_device_memory()
        try:
            self._arena = torch.empty(self.arena_bytes, dtype=torch.uint8, device=self.device)
        except (RuntimeError, AssertionError) as exc:  # OOM, or a torch built without CUDA
            if _out_of_memory(exc):
                raise self._no_memory(str(exc).splitlines()[0], str(self.device)) from exc
            raise EngineUnavailableError("hbm", f"cannot allocate the arena: {exc}") from exc
        # On the CPU, host buffers copy through numpy: no torch dispatch per small copy.
        self._host_arena = self._arena.numpy() if self.device.type == "cpu" else None
        self.arena_address: int = self._arena.data_ptr()

    def _check_device_memory(self) -> None:
        """Refuse an arena larger than the whole CUDA device, before trying to allocate it."""
        cuda = self._torch.cuda
        if self.device.type != "cuda" or not cuda.is_available():
            return  # the host: the configuration checks its memory; torch.empty fails cleanly
        try:
            total_bytes = cuda.get_device_properties(self.device).total_memory
        except (RuntimeError, AssertionError) as exc:
            raise EngineUnavailableError("hbm", f"no device {self.device}: {exc}") from exc
        if self.arena_bytes > total_bytes:
            raise self._no_memory(f"the device has {total_bytes} bytes", str(self.device))

    def _from_host(self, array: np.ndarray) -> Any:
        if array.flags.writeable:
            return self._torch.from_numpy(array)
        # torch warns about read-only arrays; this one is only ever read.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return self._torch.from_numpy(array)

    # -- ArenaTier hooks --------------------------------------------------------------------------

    def _source(self, data: Any) -> tuple[Any, int]:
        if is_tensor(data):
            view = tensor_bytes(data)
            return view, view.numel()
        view = host_bytes(data)
        return view, view.size

    def _write(self, offset_bytes: int, source: Any, size_bytes: int) -> None:
        end = offset_bytes + size_bytes
        if isinstance(source, np.ndarray):
            if self._host_arena is not None:
                np.copyto(self._host_arena[offset_bytes:end], source)
                return
            source = self._from_host(source)
        self._arena[offset_bytes:end].copy_(source)

    def _read_new(self, offset_bytes: int, size_bytes: int) -> Any:
        return self._arena[offset_bytes : offset_bytes + size_bytes].clone()

    def _read_into(self, offset_bytes: int, size_bytes: int, into: Any) -> Any:
        end = offset_bytes + size_bytes
        if is_tensor(into):
            dst = tensor_bytes(into)
            self._check_into_size(dst.numel(), size_bytes)
            dst[:size_bytes].copy_(self._arena[offset_bytes:end])
            return into
        dst = host_bytes(into, writable=True)
        self._check_into_size(dst.size, size_bytes)
        if self._host_arena is not None:
            np.copyto(dst[:size_bytes], self._host_arena[offset_bytes:end])
        else:
            self._torch.from_numpy(dst[:size_bytes]).copy_(self._arena[offset_bytes:end])
        return into

    def _move(self, dst_offset_bytes: int, src_offset_bytes: int, size_bytes: int) -> None:
        arena = self._arena
        if src_offset_bytes - dst_offset_bytes >= size_bytes:  # disjoint: one copy
            arena[dst_offset_bytes : dst_offset_bytes + size_bytes].copy_(
                arena[src_offset_bytes : src_offset_bytes + size_bytes]
            )
            return
        # torch refuses overlapping copies; stage in chunks, front to back, so every chunk is
        # read before any write can reach it.
        stage = self._torch.empty(
            min(size_bytes, _MOVE_CHUNK_BYTES), dtype=self._torch.uint8, device=self.device
        )
        for done in range(0, size_bytes, len(stage)):
            n = min(len(stage), size_bytes - done)
            stage[:n].copy_(arena[src_offset_bytes + done : src_offset_bytes + done + n])
            arena[dst_offset_bytes + done : dst_offset_bytes + done + n].copy_(stage[:n])

    def _release_arena(self) -> None:
        self._host_arena = None
        self._arena = self._torch.empty(0, dtype=self._torch.uint8, device=self.device)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "device": str(self.device)}


def _out_of_memory(exc: BaseException) -> bool:
    """Whether torch failed for want of memory (CUDA OOM, or the CPU allocator's ENOMEM)."""
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text
