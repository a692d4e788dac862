"""CxlTier: host memory on a CXL (CPU-less) NUMA node, or emulated CXL where there is none.

Linux shows CXL Type-3 memory as a NUMA node with memory and no CPUs. With such a node (the
first one, or ``node=``), the arena is mmap'd, bound there with ``mbind`` before its first touch,
touched, and its placement checked with ``move_pages``. Without one the tier runs *emulated*: the
arena is ordinary memory and every get and put costs what the modelled device would, i.e.
``max(copy time, size / bandwidth) + added latency``. The defaults come from published figures
(Pond, Melody, MICRO'23: +100-150 ns over local DRAM, ~25 GB/s for a PCIe 5.0 x8 device). Waits
under a microsecond are not slept: they accumulate and are paid once they reach one, so many small
accesses still cost their modelled latency in total. The mode is logged at construction and
reported in stats (``emulated``, ``node``).

Concurrency: one asyncio loop thread (see Tier). An emulated wait blocks the thread, as a copy
from slow memory stalls the CPU doing it; accesses therefore share the device's bandwidth cap.
Invariants: emulated is True exactly when the arena is not on a CPU-less node or emulate=True was
asked; with a node, every page of the arena was placed on it before first use.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tiers.io.buffers import PAGE_SIZE_BYTES
from tiers.io.errors import EngineUnavailableError, InvalidArgumentError, StorageError
from tiers.memory.host_arena import HostArenaTier
from tiers.memory.numa import bind_to_node, cpuless_nodes, pages_on_node

__all__ = ["CXL_ADDED_LATENCY_S", "CXL_BANDWIDTH_BYTES_PER_S", "CxlTier", "cxl_placement"]

log = logging.getLogger("tierkit.tiers")
CXL_ADDED_LATENCY_S = 130e-9
CXL_BANDWIDTH_BYTES_PER_S = 25e9
_DRAM_LATENCY_S = 1e-7
_MIN_WAIT_S = 1e-6  # shorter debts are carried over rather than slept
_SLEEP_SLACK_S = 200e-6  # time.sleep oversleeps by up to about this; spin the rest
_CHECKED_PAGES = 4096  # pages sampled to verify placement (move_pages over all is slow)


def cxl_placement(node: int | None, emulate: bool | None) -> tuple[int | None, bool]:
    """(the NUMA node the arena is bound to, or None; whether accesses are emulated) for the
    arguments of CxlTier: by default the first CPU-less node, emulated where there is none.

    Raises EngineUnavailableError for ``emulate=False`` with no CPU-less node and no ``node``.
    """
    cpuless = cpuless_nodes()
    if node is None and cpuless:
        node = cpuless[0]
    if emulate is None:
        emulate = node not in cpuless
    elif not emulate and node is None:
        raise EngineUnavailableError(
            "cxl", "no CPU-less NUMA node (CXL memory) on this machine; pass emulate=True"
        )
    return node, emulate


class CxlTier(HostArenaTier):
    """``capacity_bytes`` of CXL memory (node ``node``), or of emulated CXL memory."""

    kind = "cxl"

    def __init__(
        self,
        name: str,
        capacity_bytes: int,
        *,
        node: int | None = None,
        emulate: bool | None = None,
        added_latency_s: float = CXL_ADDED_LATENCY_S,
        bandwidth_bytes_per_s: float = CXL_BANDWIDTH_BYTES_PER_S,
    ) -> None:
        if not added_latency_s >= 0 or not bandwidth_bytes_per_s > 0:  # NaN fails too
            raise InvalidArgumentError("CXL emulation needs latency >= 0 and bandwidth > 0")
        node, emulate = cxl_placement(node, emulate)
        # Set before HostArenaTier.__init__, whose _prepare_arena hook reads them.
        self.node = node
        self.emulated = emulate
        self.added_latency_s = added_latency_s
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.read_latency_s = _DRAM_LATENCY_S + added_latency_s
        self.read_bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.emulated_wait_s = 0.0
        self._owed_s = 0.0
        super().__init__(name, capacity_bytes, alignment_bytes=64)
        if emulate:
            log.info(
                "cxl tier %r: emulated=True (%s): +%.0f ns per access, %.1f GB/s cap",
                name,
                f"arena on NUMA node {node}" if node is not None else "no CPU-less NUMA node",
                added_latency_s * 1e9,
                bandwidth_bytes_per_s / 1e9,
            )
        else:
            log.info("cxl tier %r: emulated=False, arena bound to NUMA node %d", name, node)

    def _prepare_arena(self, address: int, size_bytes: int) -> None:
        if self.node is None:
            return
        try:
            bind_to_node(address, size_bytes, self.node)
            self._arena[::PAGE_SIZE_BYTES] = 0  # first touch: the pages now come from the node
            where = pages_on_node(address, size_bytes, sample_pages=_CHECKED_PAGES)
        except StorageError as exc:
            self._release_arena()
            raise EngineUnavailableError(
                "cxl", f"cannot place the {size_bytes}-byte arena on NUMA node {self.node}: {exc}"
            ) from exc
        except BaseException:
            self._release_arena()
            raise
        if set(where) != {self.node}:
            self._release_arena()
            raise EngineUnavailableError(
                "cxl", f"arena pages landed on nodes {where}, not only on node {self.node}"
            )

    # -- emulated cost ----------------------------------------------------------------------------

    def _charge(self, size_bytes: int, started_s: float) -> None:
        """Wait until this access has taken as long as on the modelled device."""
        now = time.perf_counter()
        transfer_s = size_bytes / self.bandwidth_bytes_per_s
        self._owed_s += self.added_latency_s + max(0.0, transfer_s - (now - started_s))
        if self._owed_s < _MIN_WAIT_S:
            return
        deadline = now + self._owed_s
        if self._owed_s > 2 * _SLEEP_SLACK_S:
            time.sleep(self._owed_s - _SLEEP_SLACK_S)
        while time.perf_counter() < deadline:
            pass  # spin: sleeping cannot hit microsecond deadlines
        self.emulated_wait_s += self._owed_s
        self._owed_s = 0.0

    def _write(self, offset_bytes: int, source: Any, size_bytes: int) -> None:
        if not self.emulated:
            return super()._write(offset_bytes, source, size_bytes)
        started = time.perf_counter()
        super()._write(offset_bytes, source, size_bytes)
        self._charge(size_bytes, started)
        return None

    def _read_new(self, offset_bytes: int, size_bytes: int) -> Any:
        if not self.emulated:
            return super()._read_new(offset_bytes, size_bytes)
        started = time.perf_counter()
        out = super()._read_new(offset_bytes, size_bytes)
        self._charge(size_bytes, started)
        return out

    def _read_into(self, offset_bytes: int, size_bytes: int, into: Any) -> Any:
        if not self.emulated:
            return super()._read_into(offset_bytes, size_bytes, into)
        started = time.perf_counter()
        out = super()._read_into(offset_bytes, size_bytes, into)
        self._charge(size_bytes, started)
        return out

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "emulated": self.emulated,
            "node": self.node,
            "added_latency_s": self.added_latency_s,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "emulated_wait_s": self.emulated_wait_s,
        }
