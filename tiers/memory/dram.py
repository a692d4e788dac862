"""DramTier: the host-memory tier, one page-aligned arena pinned for GPU DMA when CUDA is present.

Objects are extents of a single anonymous mmap (see HostArenaTier and ArenaTier): no malloc per
object, holes merged as they are freed, compaction when holes are too small. Where torch sees a
CUDA device, the arena is page-locked in one ``cudaHostRegister`` call, so copies between it and
GPU tensors run at full PCIe speed without a staging buffer. ``pinned`` is reported in stats.

Concurrency: one asyncio loop thread (see Tier); copies are synchronous.
Invariants: the arena stays pinned from construction to ``aclose`` when ``pinned`` is True.
"""

from __future__ import annotations

import logging
from typing import Any

from tiers.io.errors import EngineUnavailableError
from tiers.memory.host_arena import HostArenaTier

__all__ = ["DramTier"]

log = logging.getLogger("tierkit.tiers")
_HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every CUDA context


def _cuda_runtime() -> Any | None:
    """torch's CUDA runtime bindings, or None without torch or a CUDA device."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.cudart() if torch.cuda.is_available() else None


class DramTier(HostArenaTier):
    """``capacity_bytes`` of host memory; ``pinned`` None pins exactly when CUDA is available."""

    kind = "dram"
    read_latency_s = 1e-7
    read_bandwidth_bytes_per_s = 10e9

    def __init__(self, name: str, capacity_bytes: int, *, pinned: bool | None = None) -> None:
        super().__init__(name, capacity_bytes, alignment_bytes=64)
        self.pinned = False
        self._cudart: Any = None
        if pinned is False:
            return
        cudart = _cuda_runtime()
        if cudart is None:
            if pinned:
                self._release_arena()
                raise EngineUnavailableError("pinned DRAM", "torch sees no CUDA device")
            return
        code = int(
            cudart.cudaHostRegister(self.arena_address, self.arena_bytes, _HOST_REGISTER_PORTABLE)
        )
        if code != 0:
            if pinned:
                self._release_arena()
                raise EngineUnavailableError(
                    "pinned DRAM", f"cudaHostRegister of {self.arena_bytes} bytes failed: {code}"
                )
            # Pinning is an optimisation: an unpinned arena still works, only copies are slower.
            log.warning("dram tier %r: cudaHostRegister failed (%d), not pinned", name, code)
            return
        self.pinned = True
        self._cudart = cudart

    def _release_arena(self) -> None:
        if self.pinned:
            self._cudart.cudaHostUnregister(self.arena_address)
            self.pinned = False
        super()._release_arena()

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "pinned": self.pinned}
