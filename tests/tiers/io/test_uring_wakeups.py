"""The compiled drive's kernel entries and wake-ups: a lone read costs one submission call, one
wake-up and one look after it (no spurious second wake-up from the CQEs our own enter posted),
and no completion is ever left to the watchdog (a lost wake-up would be)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tiers.io import aligned_empty
from tiers.io.uring.compiled_drive import CompiledDriver, _load
from tiers.io.uring.engine import UringEngine
from tiers.testing.engine_contract import run

pytestmark = pytest.mark.uring
SIZE = 1 << 20
LONE_READS = 200


def _data_file(tmp_path: Path) -> tuple[Path, np.ndarray]:
    data = np.random.default_rng(5).integers(0, 256, SIZE, dtype=np.uint8)
    path = tmp_path / "data.bin"
    path.write_bytes(data.tobytes())
    return path, data


def _count_calls(engine: UringEngine) -> list[int]:
    """Counts every compiled call the engine's driver makes (the driver exists once opened)."""
    calls = [0]
    driver = engine._compiled
    assert isinstance(driver, CompiledDriver)
    original = driver._call

    def counted(*args):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return original(*args)

    driver._call = counted  # type: ignore[method-assign]
    return calls


def test_lone_reads_take_one_wakeup_and_three_calls(tmp_path: Path) -> None:
    if _load() is None:
        pytest.skip("numba is not available here: only the Python path runs")
    path, data = _data_file(tmp_path)

    async def body() -> tuple[int, int, int]:
        engine = UringEngine(8)
        file = await engine.open(path, direct=True)  # device reads: they complete later
        out = aligned_empty(4096)
        await engine.read_into(file, 0, out)  # the ring and its driver exist from here
        calls = _count_calls(engine)
        wakeups0 = engine.counters["wakeups"]
        for i in range(LONE_READS):
            offset = (i * 7919 % (SIZE // 4096)) * 4096
            assert await engine.read_into(file, offset, out) == 4096
            assert np.array_equal(out, data[offset : offset + 4096])
        # cached reads may complete inside the submitting call: those need no wake-up at all
        await asyncio.sleep(0.01)  # a spurious wake-up left over would land here
        wakeups = engine.counters["wakeups"] - wakeups0
        await engine.aclose()
        return calls[0], wakeups, engine.counters.get("watchdog_reaps", 0)

    calls, wakeups, rescued = run(body)
    assert rescued == 0
    assert wakeups <= LONE_READS, wakeups  # was ~2 a read: one for the CQE our enter posted
    assert calls <= 3 * LONE_READS, calls  # was ~6: a second look after the submission, two
    # after the spurious wake-up


def test_many_tasks_and_batches_never_need_the_watchdog(tmp_path: Path) -> None:
    if _load() is None:
        pytest.skip("numba is not available here: only the Python path runs")
    path, data = _data_file(tmp_path)
    pages = SIZE // 4096

    async def body() -> int:
        engine = UringEngine(16)
        file = await engine.open(path, direct=True)
        rng = np.random.default_rng(9)

        async def singles(seed: int) -> None:
            out = aligned_empty(4096)
            for offset in (np.random.default_rng(seed).integers(0, pages, 60) * 4096).tolist():
                assert await engine.read_into(file, offset, out) == 4096
                assert np.array_equal(out, data[offset : offset + 4096])

        async def batches() -> None:
            for _ in range(20):
                n = int(rng.integers(1, 40))  # some above the queue depth: refills in-loop
                offsets = rng.integers(0, pages, n) * 4096
                out = aligned_empty(n * 4096)
                got = await engine.read_batch(file, out, offsets, 4096)
                assert (got == 4096).all()
                for i, offset in enumerate(offsets.tolist()):
                    assert np.array_equal(
                        out[i * 4096 : (i + 1) * 4096], data[offset : offset + 4096]
                    )

        await asyncio.wait_for(
            asyncio.gather(*(singles(s) for s in range(12)), batches(), batches()), 30
        )
        rescued = engine.counters.get("watchdog_reaps", 0)
        await engine.aclose()
        return rescued

    assert run(body) == 0
