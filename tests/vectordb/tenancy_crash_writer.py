"""A writer process for the kill -9 test of tenancy (run as a script, killed by its parent).

    python tests/vectordb/tenancy_crash_writer.py DIRECTORY SEED

Opens the tenancy index in DIRECTORY (made by :func:`create`), prints "ready", then runs the
operations of :func:`schedule` (mostly grants and revokes, some inserts with tenants, deletes
and delete_tenant) one after another and prints "<index>" (flushed) the moment each is
acknowledged. It never stops by itself; the parent kills it and rebuilds the same schedule from
SEED. The power-cut test runs the same schedules in-process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from tests.vectordb.tenancy_check import small_config
from vectordb import SpannIndex

DIM = 8
BASE = 300
OPS = 400
TENANTS: list[Any] = [0, 1, 2, 5, "5", "ops", "qa-team", 10**12]
CONFIG = small_config(
    posting_limit=32,
    checkpoint_wal_bytes=2048,  # checkpoints in the middle of the schedule (and of power cuts)
)

# (kind, *arguments) as tests.vectordb.tenancy_check.Model.apply takes them:
# ("insert", ids, vectors, rows) ("grant", ids, tenant) ("revoke", ids, tenant)
# ("delete", ids) ("delete_tenant", tenant)
Op = tuple[Any, ...]


def base(seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[list[Any]]]:
    """The index's contents before the schedule: ids, vectors, tenants of each row."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(10, DIM)) * 4
    vectors = (centres[rng.integers(10, size=BASE)] + rng.normal(size=(BASE, DIM))).astype(
        np.float32
    )
    rows = [[t for t in TENANTS if rng.random() < 0.1] for _ in range(BASE)]
    return np.arange(BASE, dtype=np.int64), vectors, rows


async def create(directory: str | Path, metric: str = "l2") -> None:
    """The base index; ``metric`` "cosine" or "ip": one with compact twins (tenant_store)."""
    ids, vectors, rows = base()
    config = dataclasses.replace(CONFIG, metric=metric)
    async with await SpannIndex.create(directory, config) as index:
        await index.build(ids, vectors, tenants=rows)


def schedule(seed: int, first_id: int = 10_000) -> list[Op]:
    rng = np.random.default_rng(seed)
    ops: list[Op] = []
    live = list(range(BASE))
    next_id = first_id
    for _ in range(OPS):
        tenant = TENANTS[int(rng.integers(len(TENANTS)))]
        roll = rng.random()
        if roll < 0.4:  # grant a batch, some ids deleted or unknown
            ids = rng.choice(live, int(rng.integers(1, 24)), replace=False).tolist()
            ops.append(("grant", np.array([*ids, 10**9], np.int64), tenant))
        elif roll < 0.7:
            ids = rng.choice(live, int(rng.integers(1, 24)), replace=False).tolist()
            ops.append(("revoke", np.array(ids, np.int64), tenant))
        elif roll < 0.88:  # an insert whose rows carry tenants: atomic with its grants
            n = int(rng.integers(1, 12))
            ids = list(range(next_id, next_id + n))
            next_id += n
            centre = rng.normal(size=DIM) * 4
            vectors = (centre + rng.normal(size=(n, DIM))).astype(np.float32)
            rows = [[t for t in TENANTS if rng.random() < 0.3] or [tenant] for _ in range(n)]
            ops.append(("insert", np.array(ids, np.int64), vectors, rows))
            live.extend(ids)
        elif roll < 0.95:
            victims = rng.choice(live, 4, replace=False).tolist()
            gone = set(victims)
            live = [i for i in live if i not in gone]
            ops.append(("delete", np.array(victims, np.int64)))
        else:
            ops.append(("delete_tenant", tenant))
    return ops


async def run_op(index: SpannIndex, op: Op) -> Any:
    kind, *args = op
    if kind == "insert":
        ids, vectors, rows = args
        return await index.insert(ids, vectors, tenants=rows)
    return await getattr(index, kind)(*args)


async def main(directory: str, seed: int) -> None:
    index = await SpannIndex.open(directory)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for number, op in enumerate(schedule(seed)):
        await run_op(index, op)
        sys.stdout.write(f"{number}\n")
        sys.stdout.flush()
    await asyncio.sleep(3600)  # wait for the kill


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
