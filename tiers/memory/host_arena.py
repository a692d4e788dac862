"""HostArenaTier: an ArenaTier whose arena is one page-aligned anonymous mmap of host memory.

The base of DramTier and CxlTier. The arena is viewed as a flat uint8 numpy array; host buffers
(numpy arrays of any dtype, CPU tensors, bytes-likes) move in and out with one ``np.copyto``, and
tensors on an accelerator with one ``Tensor.copy_`` against a torch view of the same arena (made
on first use, so torch is imported only by callers that already use it). Subclasses may place or
pin the mapping before its first touch through ``_prepare_arena``. A mapping the kernel refuses
(ENOMEM: more than it will overcommit) is a NoMemoryError naming the tier.

Concurrency: one asyncio loop thread (see Tier); copies are synchronous.
Invariants: the arena starts on a page boundary and never moves or grows; ``arena_address`` is
its address for its whole life; results are copies, never views of the arena.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
from typing import Any

import numpy as np

from tiers.io.byte_views import U8, host_bytes, is_tensor, tensor_bytes
from tiers.memory.arena import ArenaTier

__all__ = ["HostArenaTier"]


class HostArenaTier(ArenaTier):
    """A memory tier over ``capacity_bytes`` of page-aligned host memory."""

    def __init__(self, name: str, capacity_bytes: int, *, alignment_bytes: int = 64) -> None:
        super().__init__(name, capacity_bytes, alignment_bytes=alignment_bytes)
        try:
            self._mmap: mmap.mmap | None = mmap.mmap(-1, self.arena_bytes)
        except OSError as exc:
            raise self._no_memory(exc.strerror or str(exc), "host memory") from exc
        self._arena = np.frombuffer(self._mmap, dtype=U8)
        self.arena_address: int = self._arena.__array_interface__["data"][0]
        self._arena_tensor: Any = None  # torch view of the arena, for device tensors
        self._prepare_arena(self.arena_address, self.arena_bytes)

    def _prepare_arena(self, address: int, size_bytes: int) -> None:
        """Hook run once the arena is mapped and before anything touches it (NUMA binding)."""

    def _torch_arena(self) -> Any:
        if self._arena_tensor is None:
            import torch  # a device tensor reached us, so torch is imported already

            self._arena_tensor = torch.from_numpy(self._arena)
        return self._arena_tensor

    # -- ArenaTier hooks --------------------------------------------------------------------------

    def _source(self, data: Any) -> tuple[Any, int]:
        if is_tensor(data) and data.device.type != "cpu":
            view = tensor_bytes(data)
            return view, view.numel()
        view = host_bytes(data)
        return view, view.size

    def _write(self, offset_bytes: int, source: Any, size_bytes: int) -> None:
        if isinstance(source, np.ndarray):
            self._arena[offset_bytes : offset_bytes + size_bytes] = source
        else:
            self._torch_arena()[offset_bytes : offset_bytes + size_bytes].copy_(source)

    def _read_new(self, offset_bytes: int, size_bytes: int) -> Any:
        return self._arena[offset_bytes : offset_bytes + size_bytes].copy()

    def _read_into(self, offset_bytes: int, size_bytes: int, into: Any) -> Any:
        if not isinstance(into, np.ndarray) and is_tensor(into) and into.device.type != "cpu":
            dst = tensor_bytes(into)
            self._check_into_size(dst.numel(), size_bytes)
            src = self._torch_arena()[offset_bytes : offset_bytes + size_bytes]
            dst[:size_bytes].copy_(src)
            return into
        dst = host_bytes(into, writable=True)
        if dst.size < size_bytes:
            self._check_into_size(dst.size, size_bytes)
        # Slice assignment is the same single numpy copy as np.copyto, with less call overhead.
        dst[:size_bytes] = self._arena[offset_bytes : offset_bytes + size_bytes]
        return into

    def _move(self, dst_offset_bytes: int, src_offset_bytes: int, size_bytes: int) -> None:
        # memmove copes with overlap in place; np.copyto would stage a temporary copy.
        base = self.arena_address
        ctypes.memmove(base + dst_offset_bytes, base + src_offset_bytes, size_bytes)

    def _release_arena(self) -> None:
        self._arena_tensor = None
        self._arena = np.empty(0, U8)
        if self._mmap is not None:
            # A view that escaped (it should not) keeps the mapping alive until it goes.
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "arena_address": self.arena_address}
