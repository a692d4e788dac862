"""A writer process for the kill -9 test of SpannIndex (run as a script, killed by its parent).

    python tests/vectordb/crash_writer.py DIRECTORY SEED

Opens the index in DIRECTORY, prints "ready", then runs the operations of :func:`schedule` one
after another and prints "<index>" (flushed) the moment each is acknowledged. It never stops by
itself; the parent kills it and rebuilds the same schedule from SEED.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from vectordb import SpannIndex

DIM = 8
BATCH = 24
OPS = 400

Op = tuple[str, np.ndarray, np.ndarray | None]  # (kind, ids, vectors)


def schedule(seed: int, first_id: int = 10_000) -> list[Op]:
    rng = np.random.default_rng(seed)
    ops: list[Op] = []
    inserted: list[int] = []
    next_id = first_id
    for _ in range(OPS):
        if inserted and rng.random() < 0.25:
            victims = rng.choice(inserted, min(8, len(inserted)), replace=False)
            gone = set(victims.tolist())
            inserted = [i for i in inserted if i not in gone]
            ops.append(("delete", victims.astype(np.int64), None))
        else:
            ids = np.arange(next_id, next_id + BATCH, dtype=np.int64)
            next_id += BATCH
            centre = rng.normal(size=DIM) * 4
            ops.append(("insert", ids, (centre + rng.normal(size=(BATCH, DIM))).astype(np.float32)))
            inserted.extend(ids.tolist())
    return ops


async def main(directory: str, seed: int) -> None:
    index = await SpannIndex.open(directory)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for number, (kind, ids, vectors) in enumerate(schedule(seed)):
        if kind == "insert":
            await index.insert(ids, vectors)
        else:
            await index.delete(ids)
        sys.stdout.write(f"{number}\n")
        sys.stdout.flush()
    await asyncio.sleep(3600)  # wait for the kill


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
