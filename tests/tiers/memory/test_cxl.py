"""CxlTier: contract (emulated here), emulated latency and bandwidth, NUMA placement, errors."""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from pathlib import Path

import numpy as np
import pytest

from tiers.io.buffers import PAGE_SIZE_BYTES
from tiers.io.errors import (
    EngineUnavailableError,
    InvalidArgumentError,
    NoMemoryError,
    StorageError,
)
from tiers.memory import cxl
from tiers.memory.cxl import CxlTier
from tiers.memory.dram import DramTier
from tiers.memory.numa import cpuless_nodes, pages_on_node
from tiers.storage.tier import Tier
from tiers.testing.tier_contract import TierContract

MiB = 1 << 20


class TestCxlContract(TierContract):
    async def make_tier(self, capacity_bytes: int, tmp_path: Path) -> Tier:
        return CxlTier("cxl", capacity_bytes)


def test_emulated_here_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    if cpuless_nodes():
        pytest.skip("this machine has a CPU-less NUMA node: the tier is not emulated")
    caplog.set_level(logging.INFO, logger="tierkit.tiers")
    tier = CxlTier("cxl", MiB)
    stats = tier.stats()
    assert stats["emulated"] is True and stats["node"] is None and stats["kind"] == "cxl"
    assert stats["added_latency_s"] == 130e-9 and stats["bandwidth_bytes_per_s"] == 25e9
    lines = [r.getMessage() for r in caplog.records if r.name == "tierkit.tiers"]
    assert len(lines) == 1 and "emulated=True" in lines[0] and "'cxl'" in lines[0]
    assert tier.estimated_read_s(0) == pytest.approx(230e-9)
    asyncio.run(tier.aclose())


def test_bandwidth_cap_slows_a_large_get_compared_with_dram() -> None:
    data = np.random.default_rng(0).integers(0, 256, 64 * MiB, dtype=np.uint8)

    async def timed_get(tier: Tier) -> float:
        await tier.put("big", data)
        out = np.ones(64 * MiB, np.uint8)  # touched, so no page faults are timed
        best_s = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            await tier.get("big", into=out)
            best_s = min(best_s, time.perf_counter() - start)
        assert np.array_equal(out, data)
        await tier.aclose()
        return best_s

    dram_s = asyncio.run(timed_get(DramTier("dram", 64 * MiB, pinned=False)))
    cxl_s = asyncio.run(
        timed_get(CxlTier("cxl", 64 * MiB, emulate=True, bandwidth_bytes_per_s=1e9))
    )
    assert cxl_s >= 0.05, f"64 MiB at 1 GB/s took only {cxl_s * 1e3:.1f} ms"
    assert cxl_s > dram_s, (cxl_s, dram_s)


def test_added_latency_is_charged_per_access_even_below_a_microsecond() -> None:
    async def main() -> None:
        slow = CxlTier("slow", MiB, emulate=True, added_latency_s=20e-6)
        await slow.put("k", b"x" * 64)
        start = time.perf_counter()
        for _ in range(200):
            await slow.get("k")
        assert time.perf_counter() - start >= 200 * 20e-6
        # 130 ns per access is never slept alone, but 1000 of them add up and are paid.
        fast = CxlTier("fast", MiB, emulate=True)
        await fast.put("k", b"x" * 64)
        waited_before = fast.emulated_wait_s
        for _ in range(1000):
            await fast.get("k", into=np.empty(64, np.uint8))
        assert fast.emulated_wait_s - waited_before >= 1000 * 130e-9 - 1e-6
        await slow.aclose()
        await fast.aclose()

    asyncio.run(main())


def test_emulated_tier_placed_on_a_node_with_cpus() -> None:
    async def main() -> None:
        tier = CxlTier("cxl", 4 * MiB, node=0)
        assert tier.emulated and tier.stats()["node"] == 0
        assert pages_on_node(tier.arena_address, tier.arena_bytes) == {
            0: tier.arena_bytes // PAGE_SIZE_BYTES
        }
        await tier.put("a", b"on node zero")
        assert (await tier.get("a")).tobytes() == b"on node zero"
        await tier.aclose()

    asyncio.run(main())


def test_a_cpuless_node_is_used_unemulated(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cxl, "cpuless_nodes", lambda: [0])  # pretend node 0 is CXL memory
    caplog.set_level(logging.INFO, logger="tierkit.tiers")
    tier = CxlTier("cxl", MiB)
    assert tier.stats()["emulated"] is False and tier.node == 0
    assert "bound to NUMA node 0" in caplog.records[-1].getMessage()
    asyncio.run(tier.aclose())


def test_mbind_failure_on_a_cpuless_node_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(address: int, size_bytes: int, node: int) -> None:
        raise StorageError(errno.EIO, "Input/output error", f"mbind to NUMA node {node}")

    monkeypatch.setattr(cxl, "cpuless_nodes", lambda: [0])
    monkeypatch.setattr(cxl, "bind_to_node", refuse)
    with pytest.raises(EngineUnavailableError, match="NUMA node 0"):
        CxlTier("cxl", MiB)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError):
        CxlTier("cxl", MiB, bandwidth_bytes_per_s=0)
    with pytest.raises(InvalidArgumentError):
        CxlTier("cxl", MiB, added_latency_s=-1e-9)
    with pytest.raises(InvalidArgumentError):
        CxlTier("cxl", MiB, node=4096)  # no such node
    if not cpuless_nodes():
        with pytest.raises(EngineUnavailableError):
            CxlTier("cxl", MiB, emulate=False)


@pytest.mark.numa
def test_real_cpuless_node_holds_every_page() -> None:
    nodes = cpuless_nodes()
    if not nodes:
        pytest.skip("several NUMA nodes but none without CPUs (no CXL memory)")

    async def main() -> None:
        tier = CxlTier("cxl", 16 * MiB)
        assert tier.node == nodes[0] and tier.stats()["emulated"] is False
        await tier.put("a", np.arange(MiB, dtype=np.uint8))
        assert pages_on_node(tier.arena_address, tier.arena_bytes) == {
            nodes[0]: tier.arena_bytes // PAGE_SIZE_BYTES
        }
        await tier.aclose()

    asyncio.run(main())


def test_an_arena_the_kernel_refuses_is_a_typed_error_naming_the_tier() -> None:
    with pytest.raises(NoMemoryError, match="cxl tier 'huge'") as info:
        CxlTier("huge", 1 << 50, emulate=True)
    assert info.value.errno == errno.ENOMEM


@pytest.mark.parametrize("latency", [float("nan"), -1.0])
def test_nan_or_negative_emulation_settings_are_refused(latency: float) -> None:
    with pytest.raises(InvalidArgumentError):
        CxlTier("cxl", MiB, emulate=True, added_latency_s=latency)
    with pytest.raises(InvalidArgumentError):
        CxlTier("cxl", MiB, emulate=True, bandwidth_bytes_per_s=latency)
