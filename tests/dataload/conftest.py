"""Fixtures for the loader tests: small real files whose samples carry their own index."""

from __future__ import annotations

import asyncio
import gc
import threading
from pathlib import Path

import numpy as np
import pytest

from tiers.io import default_runtime

STAMP_BYTES = 16  # sample i is int64 i followed by int64 i * 7


def write_stamped(path: Path, count: int) -> Path:
    """A raw file of ``count`` 16-byte records: record i = (i, 7 i) as little-endian int64."""
    values = np.stack([np.arange(count), np.arange(count) * 7], axis=1).astype("<i8")
    path.write_bytes(values.tobytes())
    return path


def ids_of(batch) -> list[int]:
    """Sample indices of a default-collated batch of stamped records (an (n, 16) uint8 tensor)."""
    return batch.numpy().view("<i8")[:, 0].tolist()


@pytest.fixture
def stamped(tmp_path: Path):
    """Factory: stamped(count) -> path of a stamped record file."""
    return lambda count: write_stamped(tmp_path / f"stamped_{count}.bin", count)


@pytest.fixture
def no_thread_leak():
    """Fails the test if a loader it made keeps an engine lease, a task on the runtime's loop,
    or a thread of its own (loaders run on the shared runtime and own no threads)."""
    runtime = default_runtime()
    leases = runtime.stats()["leases"]
    yield
    gc.collect()  # loaders dropped without close() give their lease back when collected
    assert runtime.stats()["leases"] == leases, "a loader kept its engine lease"
    if runtime.stats()["loop_thread"]:
        tasks = runtime.submit(_other_tasks()).result(timeout=10)
        assert not tasks, f"tasks left on the runtime's loop: {tasks}"
    prefixes = ("tierkit-loader", "tierkit-decode")
    leftover = [t.name for t in threading.enumerate() if t.name.startswith(prefixes)]
    assert not leftover, f"threads left running: {leftover}"


async def _other_tasks() -> list[str]:
    current = asyncio.current_task()
    return [repr(task) for task in asyncio.all_tasks() if task is not current]
