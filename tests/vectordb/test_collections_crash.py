"""kill -9 of a process writing to a collection loses no acknowledged write (issue 16).

The writer (collections_crash_writer.py) prints each operation as it is acknowledged; after a
real SIGKILL at a random moment the collection is reopened (the store's intents replayed) and
must equal the model after the acknowledged operations, or after one more (the one in flight
may have committed): every caller's points with their payloads and vectors, and the index
caught up with the store (each point's own vector finds it first, through the caller's label).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tests.vectordb import collections_crash_writer as writer
from tests.vectordb.helpers import run_and_kill
from vectordb.collections import Catalog, Collection, CollectionConfig
from vectordb.collections import collection as collection_module

CALLERS: list[str | None] = [None, *writer.TENANTS]
State = dict[str | None, dict[int, tuple[dict, list[float]]]]


def _model_state(acked: int, seed: int) -> State:
    points: dict[int, writer.ModelPoint] = {}
    for op in writer.schedule(seed)[:acked]:
        writer.apply(points, op)
    return {
        caller: {
            i: (p.payload, p.vector.tolist())
            for i, p in points.items()
            if caller is None or caller in p.tenants
        }
        for caller in CALLERS
    }


async def _observed(c: Collection) -> State:
    state: State = {}
    for caller in CALLERS:
        got = await c.retrieve(list(range(writer.IDS)), tenant=caller, with_vector=True)
        state[caller] = {int(p.id): (p.payload or {}, p.vector or []) for p in got}
    return state


def _same(got: State, want: State) -> bool:
    for caller in CALLERS:
        if set(got[caller]) != set(want[caller]):
            return False
        for i, (payload, vector) in want[caller].items():
            if got[caller][i][0] != payload or not np.allclose(got[caller][i][1], vector):
                return False
    return True


async def _check(directory: Path, acked: int, seed: int) -> None:
    catalog = await Catalog.open(directory)
    try:
        c = catalog.get("c")
        got = await _observed(c)
        wants = [_model_state(acked, seed), _model_state(acked + 1, seed)]
        assert any(_same(got, want) for want in wants), f"after {acked} acknowledged writes"
        for caller in CALLERS:  # the index holds what the store holds, under the right labels
            ids = sorted(got[caller])[:20]
            if not ids:
                continue
            vectors = np.array([got[caller][i][1] for i in ids], np.float32)
            rows = await c.query(vectors, limit=1, tenant=caller, with_payload=False)
            assert [row[0].id for row in rows] == ids, caller
    finally:
        await catalog.aclose()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("seed", "acks", "delay_s"), [(1, 40, 0.0), (2, 150, 0.013), (3, 5, 0.002)]
)
def test_kill_9_of_a_writer_loses_no_acknowledged_write(
    tmp_path: Path, seed: int, acks: int, delay_s: float
) -> None:
    acked = run_and_kill(Path(writer.__file__), tmp_path, seed, acks, delay_s)
    assert acked >= acks
    asyncio.run(_check(tmp_path, acked, seed))


class _Crash(Exception):
    pass


async def _crash(*args: object, **kwargs: object) -> None:
    raise _Crash


@pytest.mark.parametrize("write", ["upsert", "delete", "grant", "revoke", "payload_index"])
def test_a_write_committed_but_not_applied_is_replayed_on_open(
    tmp_path: Path, write: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies between the store's commit and the index's update: reopening applies
    the intent left in the store, so the index agrees with the acknowledged points."""
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(60, 4)).astype(np.float32)
    payloads = [{"g": "x" if i % 2 else "y"} for i in range(60)]

    async def main() -> None:
        catalog = await Catalog.open(tmp_path)
        c = await catalog.create("c", CollectionConfig(dim=4, distance="Euclid"))
        await c.upsert(list(range(50)), vectors[:50], payloads[:50], tenant="a")
        await c.revoke([5], "a")
        monkeypatch.setattr(collection_module, "apply_intent", _crash)
        with pytest.raises(_Crash):
            if write == "upsert":
                await c.upsert(list(range(50, 60)), vectors[50:], payloads[50:], tenant="a")
            elif write == "delete":
                await c.delete([1, 2], tenant="a")
            elif write == "grant":
                await c.grant([5], "a")
            elif write == "revoke":
                await c.revoke([7], "a")
            else:
                await c.create_payload_index("g")
        monkeypatch.undo()
        await catalog.aclose()

        catalog = await Catalog.open(tmp_path)
        c = catalog.get("c")
        live = {
            "upsert": set(range(60)) - {5},
            "delete": set(range(50)) - {1, 2, 5},
            "grant": set(range(50)),
            "revoke": set(range(50)) - {5, 7},
            "payload_index": set(range(50)) - {5},
        }[write]
        assert c.index.count("t:a") == len(live)
        rows = await c.query(vectors[:60], limit=1, tenant="a", with_payload=False)
        found = {i for i, row in enumerate(rows) if row and row[0].id == i}
        assert found == live
        if write == "payload_index":
            assert c.index.count('k:["g","x"]') == 25
        await catalog.aclose()

    asyncio.run(main())
