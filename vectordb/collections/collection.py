"""Collection: points (id, vector, payload) with tenants, filters and keyword indexes.

Files (``<directory>/``): ``points/`` (PointStore, the truth: records in LMDB, vectors in
``vectors.dat``) and ``index/`` (a SpannIndex with tenancy: every point's vector under its
internal id, labelled with the tenants that may read it and its keyword-indexed payload
values, labels.py).

A write is: check the caller's input and rights (writes.py), commit the points and an intent
in one synced LMDB transaction, apply the intent to the index (intents.py), return. A crash
between the two leaves the intent in the store; opening replays it. So an acknowledged write
survives ``kill -9``, and reads never see a point the store does not hold (a hit whose record
is gone is dropped). Reads run concurrently with each other and with one writer.

Thread-safety: one asyncio loop (the index's). Writes are serialised by ``_write_lock``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np
import orjson

from tiers.io import IORuntime
from vectordb import head_scan, navigator
from vectordb.collections import writes
from vectordb.collections.errors import InvalidPointError
from vectordb.collections.filters import Filter
from vectordb.collections.inputs import (
    check_payloads,
    check_point_ids,
    check_tenant,
    check_vectors,
)
from vectordb.collections.intents import apply_intent
from vectordb.collections.labels import tenant_label
from vectordb.collections.listing import keyword_grants, matching_keys, page
from vectordb.collections.point_store import PointStore, StoreChange
from vectordb.collections.points import (
    DISTANCES,
    CollectionConfig,
    Point,
    PointId,
    ScoredPoint,
    point_from_key,
    point_key,
)
from vectordb.collections.query import Hit, run_query
from vectordb.config import IndexConfig, SearchParams, default_postings
from vectordb.index import SpannIndex

__all__ = ["Collection"]

_MAX_TENANT_CHARS = 1000


async def _warm_head_scan(index: SpannIndex, dim: int) -> None:
    """An index with at least half the heads at which its head scan turns to bfloat16
    products makes torch's code for them now (head_scan.warm_up: a fixed few shapes, ~30 MiB
    once): growing past the threshold while serving then costs no memory step and no slow
    first batch. Smaller indexes are left alone: they may never get there."""
    cells = index.navigator.n_heads * dim
    if 2 * cells >= navigator.BFLOAT16_FROM_CELLS and head_scan.bfloat16_is_native():
        await asyncio.to_thread(head_scan.warm_up, dim)


class Collection:
    def __init__(
        self, name: str, config: CollectionConfig, store: PointStore, index: SpannIndex
    ) -> None:
        self.name, self.config, self.store, self.index = name, config, store, index
        self.payload_indexes: list[str] = store.meta_json(b"indexes") or []
        self._write_lock = asyncio.Lock()
        self._done: list[int] = []  # applied intents, cleared by the next write

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    async def create(
        cls,
        name: str,
        directory: str,
        config: CollectionConfig,
        runtime: IORuntime | None = None,
        memory_budget_bytes: int | None = None,
    ) -> Collection:
        store = PointStore(os.path.join(directory, "points"))
        try:
            await store.write(StoreChange(meta={b"config": orjson.dumps(config.to_dict())}))
            index_config = IndexConfig(
                dim=config.dim, metric=DISTANCES[config.distance], dtype=config.dtype, tenancy=True
            )
            index = await SpannIndex.create(
                os.path.join(directory, "index"),
                index_config,
                runtime=runtime,
                memory_budget_bytes=memory_budget_bytes,
            )
        except BaseException:
            await store.aclose()
            raise
        return cls(name, config, store, index)

    @classmethod
    async def open(
        cls,
        name: str,
        directory: str,
        runtime: IORuntime | None = None,
        memory_budget_bytes: int | None = None,
    ) -> Collection:
        """Open and replay the intents a crash left (the index catches up with the points)."""
        store = PointStore(os.path.join(directory, "points"))
        try:
            config = CollectionConfig.from_dict(store.meta_json(b"config"))
            index = await SpannIndex.open(
                os.path.join(directory, "index"),
                runtime=runtime,
                memory_budget_bytes=memory_budget_bytes,
            )
        except BaseException:
            await store.aclose()
            raise
        collection = cls(name, config, store, index)
        try:
            await _warm_head_scan(index, config.dim)
            for seq, ops in store.intents():
                await apply_intent(index, store, ops, collection.payload_indexes)
                collection._done.append(seq)
        except BaseException:
            await collection.aclose()
            raise
        return collection

    async def aclose(self) -> None:
        async with self._write_lock:
            try:
                if self._done:
                    await self.store.write(StoreChange(done_intents=self._done))
                    self._done = []
                await self.index.aclose()
            finally:
                await self.store.aclose()

    # ----------------------------------------------------------------- writes
    async def upsert(
        self,
        ids: Any,
        vectors: Any,
        payloads: Any = None,
        *,
        tenant: str | None = None,
        max_points: int | None = None,
    ) -> None:
        """Insert or overwrite points; durable when it returns. A tenant's new points are
        granted to it; ``max_points``: how many points the tenant may read at most after."""
        point_ids = check_point_ids(ids)
        rows = check_payloads(payloads, len(point_ids))
        tenant = check_tenant(tenant)
        if not point_ids:
            return
        matrix = check_vectors(self.config, vectors, len(point_ids))
        async with self._write_lock:
            visible = self.index.count(tenant_label(tenant)) if tenant is not None else 0
            plan = writes.plan_upsert(
                self.store, point_ids, matrix, rows, tenant, visible, max_points
            )
            await self._commit(plan)

    async def delete(self, ids: Any, *, tenant: str | None = None) -> int:
        """Delete points (a tenant: those it owns; its grants on others are revoked); returns
        how many the caller saw go."""
        point_ids = check_point_ids(ids, unique=False)
        tenant = check_tenant(tenant)
        async with self._write_lock:
            plan = writes.plan_delete(self.store, point_ids, tenant)
            await self._commit(plan)
        return plan.affected

    async def delete_where(self, filt: Filter, *, tenant: str | None = None) -> int:
        tenant = check_tenant(tenant)
        async with self._write_lock:
            found = await asyncio.to_thread(matching_keys, self.store, filt, tenant)
            records = self.store.records([i for _, i in found])
            plan = writes.plan_delete_records(found, records, tenant)
            await self._commit(plan)
        return plan.affected

    async def grant(self, ids: Any, tenant: str) -> int:
        """Let ``tenant`` read the points (admin); returns how many it could not before."""
        return await self._access(ids, tenant, grant=True)

    async def revoke(self, ids: Any, tenant: str) -> int:
        return await self._access(ids, tenant, grant=False)

    async def _access(self, ids: Any, tenant: str, grant: bool) -> int:
        point_ids = check_point_ids(ids, unique=False)
        name = check_tenant(tenant)
        if name is None:
            raise InvalidPointError("grant and revoke need a tenant name")
        async with self._write_lock:
            plan = writes.plan_access(self.store, point_ids, name, grant)
            await self._commit(plan)
        return plan.affected

    async def create_payload_index(self, field: str) -> None:
        """Index a keyword field: a filter's ``must`` match on it searches only its points."""
        if not isinstance(field, str) or not field or "." in field or len(field) > 256:
            raise InvalidPointError(f"a payload index field is a top-level key, got {field!r}")
        async with self._write_lock:
            if field in self.payload_indexes:
                return
            grants = await asyncio.to_thread(keyword_grants, self.store, field)
            fields = [*self.payload_indexes, field]
            change = StoreChange(meta={b"indexes": orjson.dumps(fields)})
            ops = [["grant", label, ids] for label, ids in grants.items()]
            await self._commit(writes.Plan(change, ops))
            self.payload_indexes = fields

    async def _commit(self, plan: writes.Plan) -> None:
        plan.change.intent = plan.ops
        plan.change.done_intents, self._done = self._done, []
        seq = await self.store.write(plan.change)
        await apply_intent(self.index, self.store, plan.ops, self.payload_indexes, plan.records)
        assert seq is not None
        self._done.append(seq)

    # ----------------------------------------------------------------- reads
    async def retrieve(
        self,
        ids: Any,
        *,
        tenant: str | None = None,
        with_payload: bool = True,
        with_vector: bool = False,
    ) -> list[Point]:
        """The points the caller may read, in the order asked (missing ones left out)."""
        point_ids = check_point_ids(ids, unique=False)
        tenant = check_tenant(tenant)
        internal = self.store.lookup([point_key(p) for p in point_ids])
        present = [i for i in internal if i is not None]
        records = dict(zip(present, self.store.records(present), strict=True))
        out = []
        for internal_id in internal:
            record = records.get(internal_id) if internal_id is not None else None
            if internal_id is None or record is None:
                continue
            if not self._may_read(internal_id, record.tenants, tenant):
                continue
            vector = record.vector.tolist() if with_vector else None
            out.append(Point(record.point_id, record.payload if with_payload else None, vector))
        return out

    async def count(self, filt: Filter | None = None, *, tenant: str | None = None) -> int:
        tenant = check_tenant(tenant)
        if filt is None:
            if tenant is None:
                return self.store.count()
            return self.index.count(tenant_label(tenant))
        return len(await asyncio.to_thread(matching_keys, self.store, filt, tenant))

    async def scroll(
        self,
        *,
        limit: int = 10,
        offset: Any = None,
        filter: Filter | None = None,
        tenant: str | None = None,
        with_payload: bool = True,
        with_vector: bool = False,
    ) -> tuple[list[Point], PointId | None]:
        """A page of the points the caller may read and ``filter`` matches, in id order
        (integers ascending, then UUIDs), from id ``offset`` on; and the id that starts the
        next page (None: this was the last)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidPointError(f"limit must be an integer >= 1, got {limit!r}")
        start = None if offset is None else point_key(check_point_ids([offset])[0])
        tenant = check_tenant(tenant)
        found = await asyncio.to_thread(page, self.store, start, limit + 1, filter, tenant)
        points = [
            Point(
                r.point_id,
                r.payload if with_payload else None,
                r.vector.tolist() if with_vector else None,
            )
            for r in found[:limit]
        ]
        return points, (found[limit].point_id if len(found) > limit else None)

    async def query(
        self,
        vectors: Any,
        *,
        limit: int = 10,
        offset: int = 0,
        filter: Filter | None = None,
        tenant: str | None = None,
        with_payload: bool = True,
        with_vector: bool = False,
        score_threshold: float | None = None,
        exact: bool = False,
        params: SearchParams | None = None,
    ) -> list[list[ScoredPoint]]:
        """Each query row's nearest points the caller may read and ``filter`` matches.
        ``params``: the index's search settings (``max_postings``: the recall knob)."""
        matrix = check_vectors(self.config, vectors, None)
        for name, value in (("limit", limit), ("offset", offset)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidPointError(f"{name} must be an integer >= 0, got {value!r}")
        tenant = check_tenant(tenant)
        need_records = with_payload or with_vector
        rows = await run_query(
            self,
            matrix,
            limit + offset,
            filter,
            tenant,
            self._score_ok(score_threshold),
            need_records,
            exact,
            params or self._default_params(),
        )
        return [[self._scored(h, with_payload, with_vector) for h in r[offset:]] for r in rows]

    # ----------------------------------------------------------------- helpers
    def _default_params(self) -> SearchParams:
        """Twice the index's default lists per query: a collection grows by upserts, whose
        lists are longer and fewer than a bulk build's. Measured on debian-minilm upserted in
        batches of 1,000 (2,044 lists): recall@10 of single queries 0.876 at the index's
        default (8 lists), 0.91-0.93 at 16."""
        return SearchParams(max_postings=2 * default_postings(self.index.navigator.n_heads))

    def info(self) -> dict[str, Any]:
        return {
            "points_count": self.store.count(),
            "config": self.config.to_dict(),
            "payload_indexes": list(self.payload_indexes),
            "status": "green",
        }

    def stats(self) -> dict[str, float]:
        return {
            k: float(v)
            for k, v in self.index.stats().items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }

    def to_scores(self, index_scores: np.ndarray) -> list[float]:
        """The index's scores as reported: Euclidean distance for Euclid (the index ranks by
        its square), similarities as they are."""
        if self.config.distance == "Euclid":
            return np.sqrt(np.maximum(index_scores, 0.0)).tolist()
        return index_scores.tolist()

    def _score_ok(self, threshold: float | None) -> Any:
        if threshold is None:
            return lambda score: True
        if self.config.distance == "Euclid":
            return lambda score: score <= threshold
        return lambda score: score >= threshold

    def _scored(self, hit: Hit, with_payload: bool, with_vector: bool) -> ScoredPoint:
        record = hit.record
        payload = record.payload if with_payload and record is not None else None
        vector = record.vector.tolist() if with_vector and record is not None else None
        return ScoredPoint(point_from_key(hit.key), hit.score, payload, vector)

    def _may_read(self, internal_id: int, tenants: list[str], tenant: str | None) -> bool:
        """The record's tenants and the index's access table must both allow it."""
        if tenant is None:
            return True
        return tenant in tenants and tenant_label(tenant) in self.index.tenants_of(internal_id)
