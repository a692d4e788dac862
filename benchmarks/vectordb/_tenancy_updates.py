"""The tenancy benchmark's update phase (``ours_updates``, run by _tenancy_worker.py).

On a scratch copy of the tenancy build: grant / revoke / insert / delete_tenant timings
(batched: 1,000 ids per call, per pair; single: one id per call), ``count`` checked against the
harness's own model and searches after every step checked for leaks; plus insert timings on a
copy of the build without tenancy, for comparison. Grants and revokes leave work to the next
checkpoint (copies of granted vectors; merges of revoked shortlists): that checkpoint is timed
against an idle one, and ``*_settle_us`` / ``*_amortized_us`` put the difference per pair
beside the calls' own figures.

Runs in the worker's process, one asyncio loop; the copy of the build it changes is removed
after (or, without room for a copy, the build itself is changed and loses its BUILT stamp).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.vectordb._common import log
from benchmarks.vectordb._tenancy_ours import index_bytes
from benchmarks.vectordb._tenancy_peers import Context, K
from vectordb import SearchParams, SpannIndex

_BATCH = 1000
_BATCHES = 5
_SINGLES = 200


def _us(seconds: list[float], per: int = 1) -> float:
    return round(statistics.median(seconds) / per * 1e6, 2)


async def _timed(coro: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = await coro
    return result, time.perf_counter() - start


class _Model:
    """The harness's own access model of the tenants the update phase touches."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.readers: dict[Any, set[int]] = {}

    def of(self, tenant: Any) -> set[int]:
        if tenant not in self.readers:
            docs = self.ctx.docs_of(tenant) if isinstance(tenant, int) else np.zeros(0, np.int64)
            self.readers[tenant] = {int(d) for d in docs}
        return self.readers[tenant]


async def _leaks(index: Any, model: _Model, tenant: Any, queries: np.ndarray) -> tuple[int, int]:
    """(results the model says ``tenant`` may not read, count() minus the model's count)."""
    found = await index.search(queries, K, SearchParams(), tenant=tenant)
    allowed = model.of(tenant)
    ids = np.asarray(found[0])
    leaks = sum(int(i) not in allowed for i in ids[ids >= 0])
    return leaks, int(index.count(tenant)) - len(allowed)


async def _updates(ctx: Context, tenancy_dir: Path, plain_dir: Path, scratch: Path) -> dict:
    rng = np.random.default_rng(5)
    n = len(ctx.base)
    batch = min(_BATCH, max(1, n // 20))  # a tiny (smoke) set gets smaller batches
    singles_n = min(_SINGLES, max(1, n // 20))
    sizes = np.diff(ctx.t_indptr)
    tenant = int(np.flatnonzero(sizes >= np.median(sizes[sizes > 0]))[0])  # a mid-size tenant
    probe = ctx.queries[rng.choice(len(ctx.queries), min(20, len(ctx.queries)), replace=False)]
    new_vectors = ctx.base[rng.choice(n, batch * _BATCHES + singles_n, replace=False)]
    new_vectors = new_vectors + 0.05 * rng.standard_normal(new_vectors.shape).astype(np.float32)
    new_vectors /= np.linalg.norm(new_vectors, axis=1, keepdims=True)
    out: dict[str, Any] = {"tenant": tenant, "batch": batch}
    leaks, count_errors = 0, 0
    model = _Model(ctx)

    async def check(who: Any) -> None:
        nonlocal leaks, count_errors
        leak, off = await _leaks(index, model, who, probe)
        leaks += leak
        count_errors += off != 0

    start = time.perf_counter()
    work = _scratch_copy(tenancy_dir, scratch / "ours-tenancy")
    out["copy_s"], out["in_place"] = round(time.perf_counter() - start, 2), work == tenancy_dir
    index: Any = await SpannIndex.open(work)
    try:
        await check(tenant)
        others = np.setdiff1d(np.arange(n), ctx.docs_of(tenant))
        chosen = rng.choice(others, batch * _BATCHES + singles_n, replace=False)
        batches, singles = chosen[: batch * _BATCHES], chosen[batch * _BATCHES :]
        timings: dict[str, list[float]] = {}
        for part in np.split(batches, _BATCHES):  # grant 1,000 ids to a tenant per call
            granted, took = await _timed(index.grant(part, tenant))
            timings.setdefault("grant_batch", []).append(took / max(granted, 1))
            model.of(tenant).update(int(i) for i in part)
        for doc in singles:
            _, took = await _timed(index.grant([int(doc)], tenant))
            timings.setdefault("grant_single", []).append(took)
            model.of(tenant).add(int(doc))
        out["pending_after_grants"] = int(index.stats().get("pending_grants", 0))
        # the grants' copies into the tenant's runs wait for a checkpoint (pending grants,
        # searched from their home copies meanwhile): a search then, and the checkpoint that
        # settles them, and an idle one after it (the difference is their deferred cost)
        _, took = await _timed(check(tenant))
        out["search_with_pending_us"] = round(took * 1e6, 1)
        _, took = await _timed(index.checkpoint())
        out["checkpoint_after_grants_us"] = round(took * 1e6, 1)
        out["checkpoint_idle_after_grants_us"] = await _idle_checkpoint_us(index)
        await check(tenant)
        for part in np.split(batches, _BATCHES):
            removed, took = await _timed(index.revoke(part, tenant))
            timings.setdefault("revoke_batch", []).append(took / max(removed, 1))
            model.of(tenant).difference_update(int(i) for i in part)
        for doc in singles:
            _, took = await _timed(index.revoke([int(doc)], tenant))
            timings.setdefault("revoke_single", []).append(took)
            model.of(tenant).discard(int(doc))
        await check(tenant)
        # the revokes' shortlist merges and rewrites wait for a checkpoint: time it, and an
        # idle one after it (the difference is their deferred cost)
        _, took = await _timed(index.checkpoint())
        out["checkpoint_after_revokes_us"] = round(took * 1e6, 1)
        out["checkpoint_idle_us"] = await _idle_checkpoint_us(index)
        await check(tenant)
        # a new tenant named by a string, granted in batches: it reads exactly those ids
        fresh = "bench-new-tenant"
        for part in np.split(batches, _BATCHES):
            await index.grant(part, fresh)
            model.of(fresh).update(int(i) for i in part)
        await check(fresh)
        # inserts: each new vector readable by the mid-size tenant and the new one
        next_id = n + 10
        for step in range(_BATCHES):
            rows = new_vectors[step * batch : (step + 1) * batch]
            ids = np.arange(next_id, next_id + len(rows))
            _, took = await _timed(index.insert(ids, rows, tenants=[[tenant, fresh]] * len(rows)))
            timings.setdefault("insert_batch", []).append(took / len(rows))
            model.of(tenant).update(map(int, ids))
            model.of(fresh).update(map(int, ids))
            next_id += len(rows)
        for row in new_vectors[batch * _BATCHES :]:
            _, took = await _timed(index.insert([next_id], row[None], tenants=[[tenant]]))
            timings.setdefault("insert_single", []).append(took)
            model.of(tenant).add(next_id)
            next_id += 1
        await check(tenant)
        await check(fresh)
        # a tenant dropped: reads nothing afterwards
        dropped, took = await _timed(index.delete_tenant(fresh))
        out["delete_tenant_us"] = round(took * 1e6, 1)
        out["delete_tenant_pairs"] = int(dropped)
        model.readers[fresh] = set()
        await check(fresh)
        # survives a reopen: the same answers from the log
        await index.aclose()
        index = await SpannIndex.open(work)
        await check(tenant)
        await check(fresh)
        for key, values in timings.items():
            out[f"{key}_us"] = _us(values)
        _amortized(out, timings, batch * _BATCHES + singles_n)
        out["stats"] = {k: v for k, v in index.stats().items() if k.startswith("tenant")}
    finally:
        await index.aclose()
        _drop_scratch(work, tenancy_dir)
    out["leaks"], out["count_errors"] = leaks, count_errors
    out.update(await _plain_inserts(plain_dir, scratch, new_vectors, n + 10, batch))
    return out


async def _idle_checkpoint_us(index: Any) -> float:
    """A checkpoint with nothing to settle: the faster of two in a row (the first may still
    hand back runs the one before freed)."""
    walls = [(await _timed(index.checkpoint()))[1] for _ in range(2)]
    return round(min(walls) * 1e6, 1)


def _amortized(out: dict[str, Any], timings: dict[str, list[float]], pairs: int) -> None:
    """Per pair, what a grant or revoke costs with the work it leaves to the checkpoint: the
    batched calls' mean, plus (checkpoint after them - an idle one) over every pair of the
    phase (batches and single calls)."""
    for kind, after, idle in (
        ("grant", "checkpoint_after_grants_us", "checkpoint_idle_after_grants_us"),
        ("revoke", "checkpoint_after_revokes_us", "checkpoint_idle_us"),
    ):
        settle_us = max(0.0, out[after] - out[idle]) / pairs
        out[f"{kind}_settle_us"] = round(settle_us, 2)
        mean_us = statistics.mean(timings[f"{kind}_batch"]) * 1e6
        out[f"{kind}_batch_mean_us"] = round(mean_us, 2)
        out[f"{kind}_amortized_us"] = round(mean_us + settle_us, 2)


async def _plain_inserts(
    plain_dir: Path, scratch: Path, vectors: np.ndarray, first: int, batch: int
) -> dict:
    work = _scratch_copy(plain_dir, scratch / "ours-plain")
    index = await SpannIndex.open(work)
    batched: list[float] = []
    single: list[float] = []
    try:
        next_id = first
        for part in range(_BATCHES):
            rows = vectors[part * batch : (part + 1) * batch]
            start = time.perf_counter()
            await index.insert(np.arange(next_id, next_id + len(rows)), rows)
            batched.append((time.perf_counter() - start) / len(rows))
            next_id += len(rows)
        for row in vectors[batch * _BATCHES :]:
            start = time.perf_counter()
            await index.insert([next_id], row[None])
            single.append(time.perf_counter() - start)
            next_id += 1
    finally:
        await index.aclose()
        _drop_scratch(work, plain_dir)
    return {"plain_insert_batch_us": _us(batched), "plain_insert_single_us": _us(single)}


def _scratch_copy(build: Path, work: Path) -> Path:
    """A copy of ``build`` to change, or ``build`` itself when the disk has no room for one (a
    1M tenancy build is ~12 GiB): its BUILT stamp goes, so the next run builds it again."""
    shutil.rmtree(work, ignore_errors=True)
    work.parent.mkdir(parents=True, exist_ok=True)  # a fresh --out has no scratch folder yet
    if shutil.disk_usage(work.parent).free < index_bytes(build) + (4 << 30):
        log(f"ours_updates: no room for a copy of {build}: changing it in place")
        (build / "BUILT").unlink(missing_ok=True)
        return build
    shutil.copytree(build, work)
    return work


def _drop_scratch(work: Path, build: Path) -> None:
    if work != build:
        shutil.rmtree(work, ignore_errors=True)


def update_timings(ctx: Context, tenancy_dir: str, plain_dir: str, scratch: str) -> dict:
    return asyncio.run(_updates(ctx, Path(tenancy_dir), Path(plain_dir), Path(scratch)))
