"""Early flushes of single requests: when a wave of completions leaves fewer requests on the
device than it resumes callers, those callers hand their next requests to the kernel every
``EARLY_FLUSH_CALLERS`` callers, not all at the end of the loop pass; small waves keep the one
flush at the end. Page-cache reads complete inside the submitting call, so a wave of N reads
submitted together is reaped as one wave of N with nothing else in flight."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tiers.io import aligned_empty
from tiers.io.uring.engine import UringEngine
from tiers.io.uring.singles import EARLY_FLUSH_CALLERS
from tiers.testing.engine_contract import run

pytestmark = pytest.mark.uring
BLOCK = 4096
BLOCKS = 256


def _data_file(tmp_path: Path) -> tuple[Path, np.ndarray]:
    data = np.random.default_rng(11).integers(0, 256, BLOCK * BLOCKS, dtype=np.uint8)
    path = tmp_path / "data.bin"
    path.write_bytes(data.tobytes())  # in the page cache from here
    return path, data


def _queued_at_resume(path: Path, data: np.ndarray, callers: int) -> list[int]:
    """Each caller reads two blocks; returns, in resume order, how many single requests were
    queued but not yet handed to the kernel when each caller's first read returned."""

    async def body() -> list[int]:
        engine = UringEngine(32)
        async with engine:
            file = await engine.open(path)
            warm = aligned_empty(BLOCK)
            await engine.read_into(file, 0, warm)  # the ring exists from here
            seen: list[int] = []

            async def caller(i: int) -> None:
                out = aligned_empty(BLOCK)
                for offset in (i * BLOCK, (BLOCKS - 1 - i) * BLOCK):
                    assert await engine.read_into(file, offset, out) == BLOCK
                    if offset == i * BLOCK:
                        seen.append(len(engine._q_offsets))
                    assert np.array_equal(out, data[offset : offset + BLOCK])

            await asyncio.gather(*(caller(i) for i in range(callers)))
            assert engine._inflight == 0 and not engine._single_recs
            return seen

    return run(body)


def test_a_large_wave_on_an_idle_device_flushes_every_few_callers(tmp_path: Path) -> None:
    path, data = _data_file(tmp_path)
    seen = _queued_at_resume(path, data, 32)
    assert len(seen) == 32
    # without early flushes the k-th caller to resume would find k requests queued (0..31)
    assert max(seen) < EARLY_FLUSH_CALLERS
    assert seen[:EARLY_FLUSH_CALLERS] == list(range(EARLY_FLUSH_CALLERS))


def test_a_small_wave_keeps_one_flush_at_the_end(tmp_path: Path) -> None:
    path, data = _data_file(tmp_path)
    callers = EARLY_FLUSH_CALLERS
    assert _queued_at_resume(path, data, callers) == list(range(callers))
