"""A writer process for the kill -9 test of KVBlockStore (killed by its parent).

    python tests/kvstore/block_crash_writer.py DIRECTORY SEED [CAPACITY_BLOCKS]

Opens (or creates) a block store at DIRECTORY, prints "ready", then stores the chains of
:func:`schedule` one ``store`` call after another, four calls in flight at a time, printing a
line (flushed) the moment each is acknowledged. It never stops by itself.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from kvstore import KVBlockStore
from tests.kvstore.blocks import FP, blocks_of, chain, disk_for


def schedule(seed: int, count: int = 100_000) -> list[list[bytes]]:
    """Chains of 1 to 4 blocks; every third shares the root block of the one before it."""
    chains: list[list[bytes]] = []
    for i in range(count):
        root = chains[-1][:1] if i % 3 == 2 else None
        chains.append(chain(f"{seed}/{i}", 1 + (i * 7 + seed) % 4, root=root))
    return chains


async def main(directory: str, seed: int, capacity_blocks: int) -> None:
    store = await KVBlockStore.open(directory, FP, disk_bytes=disk_for(capacity_blocks))
    print("ready", flush=True)
    chains = iter(schedule(seed))
    in_flight = asyncio.Semaphore(4)

    async def one(hashes: list[bytes]) -> None:
        await store.store(hashes, blocks_of(hashes))
        print("acked", flush=True)
        in_flight.release()

    tasks = set()
    for hashes in chains:
        await in_flight.acquire()
        task = asyncio.create_task(one(hashes))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


if __name__ == "__main__":
    capacity = int(sys.argv[3]) if len(sys.argv) > 3 else 100_000
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), capacity))
