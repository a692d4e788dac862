"""Tenancy crash consistency (issue 15): simulated power cuts (FaultyEngine) at many points of a
run of grants, revokes, inserts with tenants, deletes and delete_tenant, and a real ``kill -9``
of a writer process doing the same. After each crash the reopened index must hold exactly the
state after the acknowledged operations, or that state plus the one operation in flight, whole:
every acknowledged grant, revoke and insert survives, and an unacknowledged insert is either
there with every one of its tenants or not there at all (likewise a grant or revoke batch)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.vectordb import tenancy_crash_writer as writer
from tests.vectordb.helpers import run_and_kill, run_until_power_cut
from tests.vectordb.tenancy_check import (
    EVERYTHING,
    Model,
    assert_index_matches,
    assert_no_leaks,
)
from vectordb import SearchParams, SpannIndex

PROBE_TENANTS: list[Any] = [*writer.TENANTS, "never-granted"]


def _models(ops: list[writer.Op], acked: int) -> tuple[Model, Model]:
    """The state after the acknowledged ops, and after the one in flight too."""
    ids, vectors, rows = writer.base()
    model = Model()
    model.insert(ids.tolist(), vectors, rows)
    for op in ops[:acked]:
        model.apply(op)
    after = model.copy()
    if acked < len(ops):
        after.apply(ops[acked])
    return model, after


State = tuple[frozenset[int], dict[int, frozenset[Any]], dict[Any, int]]


def _state_of(model: Model, ids: list[int]) -> State:
    access = {i: frozenset(model.tenants_of(i)) for i in ids}
    return frozenset(model.vectors), access, {t: model.count(t) for t in PROBE_TENANTS}


async def _observe(index: SpannIndex, candidates: tuple[Model, Model], ids: list[int]) -> State:
    """What the reopened index holds: which of the candidates' vectors are live (each finds
    itself), tenants_of every id, count of every tenant."""
    vectors: dict[int, np.ndarray] = {}
    for model in candidates:
        vectors.update(model.vectors)
    known = sorted(vectors)
    found, _ = await index.search(np.stack([vectors[i] for i in known]), 1, EVERYTHING)
    live = frozenset(i for i, f in zip(known, found[:, 0].tolist(), strict=True) if i == f)
    assert index.stats()["n_vectors"] == len(live), "live vectors no candidate state holds"
    access = {i: frozenset(index.tenants_of(i)) for i in ids}
    return live, access, {t: index.count(t) for t in PROBE_TENANTS}


def _diff(got: State, want: State) -> str:
    live = sorted(got[0] ^ want[0])[:8]
    access = {i: (sorted(map(str, got[1][i])), sorted(map(str, want[1][i])))
              for i in want[1] if got[1][i] != want[1][i]}  # fmt: skip
    counts = {t: (got[2][t], want[2][t]) for t in want[2] if got[2][t] != want[2][t]}
    return f"live differs at {live}; tenants_of (got, want) {dict(list(access.items())[:6])}; " + (
        f"counts (got, want) {counts}"
    )


async def _check(directory: Path, ops: list[writer.Op], acked: int) -> None:
    before, after = _models(ops, acked)
    ids = sorted(set(before.vectors) | set(after.vectors) | set(range(writer.BASE)))
    async with await SpannIndex.open(directory) as index:
        got = await _observe(index, (before, after), ids)
        states = [_state_of(before, ids), _state_of(after, ids)]
        which = [n for n, state in enumerate(states) if got == state]
        in_flight = ops[acked][0] if acked < len(ops) else None
        assert which, (
            f"after {acked} acknowledged ops (next: {in_flight}) the index holds neither state:\n"
            f"vs acknowledged: {_diff(got, states[0])}\nvs with next: {_diff(got, states[1])}"
        )
        model = (before, after)[which[-1]]
        await assert_index_matches(index, model, PROBE_TENANTS, ids, f"after {acked} ops: ")
        queries = np.stack(list(model.vectors.values())[:40])
        tenants = [PROBE_TENANTS[q % len(PROBE_TENANTS)] for q in range(len(queries))]
        found, _ = await index.search(queries, 10, SearchParams(), tenant=tenants)
        assert_no_leaks(found, tenants, model.readable)


async def _run(
    directory: Path, ops: list[writer.Op], cut_at: int, seed: int, keep: Any
) -> tuple[int, int]:
    """Runs ``ops`` over an engine that loses power before its ``cut_at``-th batch; returns how
    many were acknowledged, and the engine's batch count."""
    acked, starts = await run_until_power_cut(
        directory, ops, writer.run_op, cut_at, seed=seed, keep=keep
    )
    return acked, starts[-1]


@pytest.mark.parametrize(("seed", "keep"), [(1, "random"), (3, "none")])
def test_power_cut_at_many_points_keeps_every_acknowledged_change(
    tmp_path: Path, seed: int, keep: str
) -> None:
    ops = writer.schedule(seed)[:24]

    async def main() -> None:
        dry = tmp_path / "dry"
        await writer.create(dry)
        acked, total = await _run(dry, ops, 10**9, seed, keep)
        assert acked == len(ops)
        await _check(dry, ops, len(ops))  # uncut, it is all there
        rng = np.random.default_rng(seed)
        points = sorted({2, total - 1, *rng.choice(np.arange(3, total - 1), 6).tolist()})
        tried = []
        for cut_at in points:
            directory = tmp_path / f"cut{cut_at}"
            await writer.create(directory)
            acked, _ = await _run(directory, ops, int(cut_at), seed, keep)
            tried.append((int(cut_at), acked))
            await _check(directory, ops, acked)
        assert any(0 < acked < len(ops) for _, acked in tried), tried  # cuts inside the run
        print(f"{total} batches; (cut at, acknowledged): {tried}")

    asyncio.run(main())


def test_power_cut_in_every_batch_of_one_grant_and_one_insert(tmp_path: Path) -> None:
    """Every cut point of a short run (a grant, a revoke, an insert with tenants): no partial
    batch of pairs, no insert without its tenants."""
    ids, vectors, _ = writer.base()
    ops: list[writer.Op] = [
        ("grant", ids[:40], "ops"),
        ("insert", np.arange(20_000, 20_006), vectors[:6] + 0.01, [[1, "5"]] * 5 + [["ops"]]),
        ("revoke", ids[:20], "ops"),
        ("grant", np.arange(20_000, 20_006), 5),
        ("delete_tenant", "5"),
    ]

    async def main() -> None:
        dry = tmp_path / "dry"
        await writer.create(dry)
        acked, total = await _run(dry, ops, 10**9, 0, "random")
        assert acked == len(ops)
        rng = np.random.default_rng(0)  # a third of the points (~60 batches), both parities
        points = sorted(rng.choice(np.arange(2, total + 1), total // 3, replace=False).tolist())
        for cut_at in points:
            directory = tmp_path / f"cut{cut_at}"
            await writer.create(directory)
            acked, _ = await _run(directory, ops, cut_at, cut_at, "random")
            await _check(directory, ops, acked)

    asyncio.run(main())


def _run_and_kill(directory: Path, seed: int, acks_before_kill: int, delay_s: float) -> int:
    return run_and_kill(Path(writer.__file__), directory, seed, acks_before_kill, delay_s)


@pytest.mark.parametrize(("seed", "acks", "delay_s"), [(5, 30, 0.02), (6, 80, 0.0)])
def test_kill_9_of_a_writer_loses_no_acknowledged_change(
    tmp_path: Path, seed: int, acks: int, delay_s: float
) -> None:
    directory = tmp_path / "index"
    asyncio.run(writer.create(directory))
    acked = _run_and_kill(directory, seed, acks, delay_s)
    assert acks <= acked < writer.OPS
    asyncio.run(_check(directory, writer.schedule(seed), acked))
