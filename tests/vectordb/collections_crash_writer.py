"""A writer process for the kill -9 test of vectordb.collections (killed by its parent).

    python tests/vectordb/collections_crash_writer.py DIRECTORY SEED

Opens (or creates) collection "c" in the catalog at DIRECTORY, prints "ready", then runs the
operations of :func:`schedule` one after another, printing a line (flushed) the moment each is
acknowledged. It never stops by itself; the parent kills it and rebuilds the schedule from SEED.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from vectordb.collections import Catalog, CollectionConfig, CollectionNotFoundError

DIM = 8
IDS = 150
TENANTS = ["a", "b", "c"]
Op = tuple[Any, ...]


def schedule(seed: int, n_ops: int = 600) -> list[Op]:
    """Upserts (batches of new and overwritten points, by the admin and tenants), deletes,
    grants and revokes; the first op indexes the keyword field "g"."""
    rng = np.random.default_rng(seed)
    ops: list[Op] = [("index", "g")]
    for _ in range(n_ops):
        kind = rng.choice(["upsert", "upsert", "upsert", "delete", "grant", "revoke"])
        ids = sorted({int(i) for i in rng.integers(IDS, size=int(rng.integers(1, 6)))})
        tenant = None if rng.random() < 0.4 else str(rng.choice(TENANTS))
        if kind == "upsert":
            vectors = rng.normal(size=(len(ids), DIM)).astype(np.float32)
            payloads = [{"g": str(rng.choice(["x", "y"])), "n": int(rng.integers(99))} for _ in ids]
            ops.append(("upsert", ids, vectors, payloads, tenant))
        elif kind == "delete":
            ops.append(("delete", ids, tenant))
        else:
            ops.append((kind, ids, str(rng.choice(TENANTS))))
    return ops


@dataclass
class ModelPoint:
    vector: np.ndarray
    payload: dict[str, Any]
    owner: str | None
    tenants: list[str] = field(default_factory=list)


def apply(points: dict[int, ModelPoint], op: Op) -> None:
    """What ``op`` does to the model (writes.py's rules, stated plainly)."""
    kind = op[0]
    if kind == "upsert":
        _, ids, vectors, payloads, tenant = op
        if tenant is not None and any(i in points and points[i].owner != tenant for i in ids):
            return  # refused: PointNotWritableError
        for i, vector, payload in zip(ids, vectors, payloads, strict=True):
            before = points.get(i)
            owner = before.owner if before else tenant
            tenants = list(before.tenants) if before else ([tenant] if tenant else [])
            points[i] = ModelPoint(vector, payload, owner, tenants)
    elif kind == "delete":
        _, ids, tenant = op
        for i in ids:
            p = points.get(i)
            if p is None:
                continue
            if tenant is None or p.owner == tenant:
                del points[i]
            elif tenant in p.tenants:
                p.tenants.remove(tenant)
    elif kind in ("grant", "revoke"):
        _, ids, tenant = op
        for i in ids:
            p = points.get(i)
            if p is None or (tenant in p.tenants) == (kind == "grant"):
                continue
            if kind == "grant":
                p.tenants.append(tenant)
            else:
                p.tenants.remove(tenant)
                p.owner = None if p.owner == tenant else p.owner


async def run(directory: str, seed: int) -> None:
    catalog = await Catalog.open(directory)
    try:
        c = catalog.get("c")
    except CollectionNotFoundError:
        c = await catalog.create("c", CollectionConfig(dim=DIM, distance="Euclid"))
    print("ready", flush=True)
    for n, op in enumerate(schedule(seed)):
        kind = op[0]
        if kind == "index":
            await c.create_payload_index(op[1])
        elif kind == "upsert":
            try:
                await c.upsert(op[1], op[2], op[3], tenant=op[4])
            except Exception as exc:  # refused writes are part of the schedule
                if type(exc).__name__ != "PointNotWritableError":
                    raise
        elif kind == "delete":
            await c.delete(op[1], tenant=op[2])
        else:
            await (c.grant if kind == "grant" else c.revoke)(op[1], op[2])
        print(n, flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], int(sys.argv[2])))
