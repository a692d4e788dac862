"""ThreadEngine: the reference engine passes the same contract, and its pool grows with what
all callers have outstanding."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

from tiers.io.engine import IOEngine
from tiers.io.env import Env
from tiers.io.threaded import ThreadEngine
from tiers.testing.engine_contract import EngineContract


class TestThreadContract(EngineContract):
    def make_engine(self, queue_depth: int = 32) -> IOEngine:
        return ThreadEngine(queue_depth)


def test_concurrent_single_reads_get_a_worker_each(tmp_path: Path) -> None:
    """32 tasks each awaiting one read_into: the pool grows with the rows outstanding over all
    batches (sized by one batch, the 32 callers shared a single worker: queue depth 1)."""
    path = tmp_path / "d.bin"
    data = os.urandom(32 * 4096)
    path.write_bytes(data)
    release = threading.Event()
    entered = threading.Semaphore(0)

    class SlowEnv(Env):
        def preadv(self, fd: int, buffers: Any, offset_bytes: int) -> int:
            entered.release()
            release.wait(5)  # every read waits: the ones in flight at once are counted
            return super().preadv(fd, buffers, offset_bytes)

    async def main() -> int:
        async with ThreadEngine(64, env=SlowEnv()) as engine:
            file = await engine.open(path)
            buffers = [bytearray(4096) for _ in range(32)]
            reads = [
                asyncio.ensure_future(engine.read_into(file, i * 4096, buffers[i]))
                for i in range(32)
            ]
            in_flight = 0
            while in_flight < 32 and await asyncio.to_thread(entered.acquire, True, 2):
                in_flight += 1
            release.set()
            assert all(n == 4096 for n in await asyncio.gather(*reads))
            assert bytes(buffers[5]) == data[5 * 4096 : 6 * 4096]
            await engine.close_file(file)
            return in_flight

    assert asyncio.run(main()) == 32
