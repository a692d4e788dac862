"""A writer process for the kill -9 test of NvmeTier (run as a script, killed by its parent).

    python tests/tiers/nvme/nvme_crash_writer.py DIRECTORY SEED

Opens the tier in DIRECTORY, prints "ready", then runs WORKERS concurrent workers, each doing the
operations of :func:`schedule` on its own keys one after another, and prints "<worker> <index>"
(flushed) the moment each operation is acknowledged. It never stops by itself; the parent kills
it. The parent rebuilds the same schedule from SEED to know what each printed line means.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

from tiers.nvme.nvme_tier import NvmeTier

WORKERS = 4
KEYS_PER_WORKER = 4
OPS_PER_WORKER = 2000
CAPACITY_BYTES = 16 << 20
EXTENT_FILE_BYTES = 2 << 20

Op = tuple[str, str, int]  # (kind "put" | "delete", key, size_bytes)


def schedule(seed: int, worker: int) -> list[Op]:
    rng = np.random.default_rng([seed, worker])
    ops: list[Op] = []
    for _ in range(OPS_PER_WORKER):
        key = f"w{worker}/k{int(rng.integers(KEYS_PER_WORKER))}"
        if rng.random() < 0.2:
            ops.append(("delete", key, 0))
        else:
            ops.append(("put", key, int(rng.integers(0, 300_000))))
    return ops


def payload(seed: int, worker: int, index: int, size: int) -> bytes:
    return np.random.default_rng([seed, worker, index, 1]).bytes(size)


async def _worker(tier: NvmeTier, seed: int, worker: int) -> None:
    for index, (kind, key, size) in enumerate(schedule(seed, worker)):
        if kind == "put":
            await tier.put(key, payload(seed, worker, index, size))
        else:
            await tier.delete(key)
        sys.stdout.write(f"{worker} {index}\n")
        sys.stdout.flush()


async def main(directory: str, seed: int) -> None:
    tier = await NvmeTier.open(
        "nvme", CAPACITY_BYTES, directory, extent_file_bytes=EXTENT_FILE_BYTES, create=True
    )
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await asyncio.gather(*(_worker(tier, seed, w) for w in range(WORKERS)))
    await tier.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
