"""The systems under load, each behind ``_loadgen.Ops``, and how each builds its data.

* ``http``: our service over loopback HTTP, one keep-alive connection per caller (_http.py).
* ``inprocess``: our collection called in-process, the ceiling: ``vectordb.collections``
  ``Catalog`` opened on a copy of the service's own data folder (the same points, built the
  same way, by upserts), each caller an asyncio task awaiting ``Collection.query`` of one
  vector (concurrent calls are gathered into index batches) or ``Collection.upsert`` of one.
* ``index_bulk``: ``SpannIndex`` bulk-built with ``build`` (what the REST API cannot do) and
  searched the same way: what a bulk build gives, for reference.
* ``milvus_lite``: pymilvus ``MilvusClient`` on a milvus-lite file, its default index
  (AUTOINDEX), one ``search`` of one vector per call from ``concurrency`` threads.
* ``qdrant_local``: qdrant-client local mode (``QdrantClient(path=...)``), ``query_points``
  of one vector per call from ``concurrency`` threads.

A build writes a system's data and closes it; the measuring process opens it again (every
system starts from its own files).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks.server._dataset import K
from benchmarks.server._http import HttpConn, HttpError, query_body
from benchmarks.server._service import ADMIN_KEY, COLLECTION

PEERS = ("inprocess", "index_bulk", "milvus_lite", "qdrant_local")
_MILVUS_FILE = "milvus.db"


class _Threaded:
    """Blocking calls on a pool of ``concurrency`` threads (set per cell)."""

    pool: concurrent.futures.ThreadPoolExecutor | None = None

    def prepare(self, concurrency: int) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        self.pool = concurrent.futures.ThreadPoolExecutor(concurrency)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


class HttpOps:
    def __init__(self, port: int, queries: np.ndarray, upserts: np.ndarray) -> None:
        self.port, self.upserts = port, upserts
        self.bodies = [query_body(q.tolist(), K) for q in queries]
        self.conns: list[HttpConn] = []
        self.query_path = f"/collections/{COLLECTION}/points/query"
        self.upsert_path = f"/collections/{COLLECTION}/points?wait=true"

    def prepare(self, concurrency: int) -> None:
        self.close()
        headers = {"api-key": ADMIN_KEY}
        self.conns = [HttpConn("127.0.0.1", self.port, headers) for _ in range(concurrency)]

    async def query(self, slot: int, row: int) -> np.ndarray:
        status, payload = await self.conns[slot].request("POST", self.query_path, self.bodies[row])
        if status != 200:
            raise HttpError(status, payload)
        points = orjson.loads(payload)["result"]["points"]
        return np.fromiter((p["id"] for p in points), np.int64, len(points))

    async def upsert(self, slot: int, point_id: int, row: int) -> None:
        point = {"id": point_id, "vector": self.upserts[row]}
        body = orjson.dumps({"points": [point]}, option=orjson.OPT_SERIALIZE_NUMPY)
        status, payload = await self.conns[slot].request("PUT", self.upsert_path, body)
        if status != 200:
            raise HttpError(status, payload)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


class CollectionOps:
    def __init__(self, collection: Any, queries: np.ndarray, upserts: np.ndarray) -> None:
        self.collection, self.queries, self.upserts = collection, queries, upserts

    def prepare(self, concurrency: int) -> None:
        pass

    async def query(self, slot: int, row: int) -> np.ndarray:
        hits = await self.collection.query(self.queries[row : row + 1], limit=K, with_payload=False)
        return np.fromiter((h.id for h in hits[0]), np.int64, len(hits[0]))

    async def upsert(self, slot: int, point_id: int, row: int) -> None:
        await self.collection.upsert([point_id], self.upserts[row : row + 1])

    def close(self) -> None:
        pass


class IndexOps:
    def __init__(self, index: Any, queries: np.ndarray, upserts: np.ndarray) -> None:
        self.index, self.queries, self.upserts = index, queries, upserts

    def prepare(self, concurrency: int) -> None:
        pass

    async def query(self, slot: int, row: int) -> np.ndarray:
        ids, _ = await self.index.search(self.queries[row : row + 1], k=K)
        return np.asarray(ids[0])

    async def upsert(self, slot: int, point_id: int, row: int) -> None:
        await self.index.insert([point_id], self.upserts[row : row + 1])

    def close(self) -> None:
        pass


class MilvusOps(_Threaded):
    def __init__(self, client: Any, queries: np.ndarray, upserts: np.ndarray) -> None:
        self.client, self.upserts = client, upserts
        self.queries = [q.tolist() for q in queries]

    def _search(self, row: int) -> np.ndarray:
        hits = self.client.search(
            COLLECTION, data=[self.queries[row]], limit=K, output_fields=["id"]
        )
        return np.fromiter((h["id"] for h in hits[0]), np.int64, len(hits[0]))

    async def query(self, slot: int, row: int) -> np.ndarray:
        found: np.ndarray = await self._run(self._search, row)
        return found

    async def upsert(self, slot: int, point_id: int, row: int) -> None:
        point = {"id": point_id, "vector": self.upserts[row].tolist()}
        await self._run(self.client.upsert, COLLECTION, [point])


class QdrantOps(_Threaded):
    """Local mode is not thread-safe: concurrent upserts fail ("cannot start a transaction
    within a transaction") and a query beside an upsert can fail ("operands could not be
    broadcast together"), so every call holds one lock, as a threaded user's code must."""

    def __init__(self, client: Any, queries: np.ndarray, upserts: np.ndarray) -> None:
        self.client, self.queries, self.upserts = client, queries, upserts
        self.lock = threading.Lock()

    def _search(self, row: int) -> np.ndarray:
        with self.lock:
            points = self.client.query_points(
                COLLECTION, query=self.queries[row], limit=K, with_payload=False
            ).points
        return np.fromiter((p.id for p in points), np.int64, len(points))

    async def query(self, slot: int, row: int) -> np.ndarray:
        found: np.ndarray = await self._run(self._search, row)
        return found

    def _upsert(self, point_id: int, row: int) -> None:
        from qdrant_client import models

        point = models.PointStruct(id=point_id, vector=self.upserts[row].tolist())
        with self.lock:
            self.client.upsert(COLLECTION, [point], wait=True)

    async def upsert(self, slot: int, point_id: int, row: int) -> None:
        await self._run(self._upsert, point_id, row)


# ---------------------------------------------------------------------- builds
def build(system: str, directory: Path, base: np.ndarray) -> float:
    """Write ``system``'s data for ``base`` (ids 0..n-1) into ``directory``; seconds."""
    directory.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if system == "index_bulk":
        asyncio.run(_build_ours(directory / "index", np.ascontiguousarray(base, np.float32)))
    elif system == "inprocess":
        asyncio.run(_build_collection(directory / "data", base))
    elif system == "milvus_lite":
        from pymilvus import MilvusClient

        client = MilvusClient(str(directory / _MILVUS_FILE))
        client.create_collection(COLLECTION, dimension=base.shape[1], metric_type="COSINE")
        for start in range(0, len(base), 5000):
            rows = np.asarray(base[start : start + 5000], np.float32)
            client.insert(
                COLLECTION, [{"id": start + i, "vector": r.tolist()} for i, r in enumerate(rows)]
            )
        client.flush(COLLECTION)
        _wait_indexed(client)
        client.close()
    elif system == "qdrant_local":
        from qdrant_client import QdrantClient, models

        client = QdrantClient(path=str(directory / "qdrant"))
        params = models.VectorParams(size=base.shape[1], distance=models.Distance.COSINE)
        client.create_collection(COLLECTION, vectors_config=params)
        client.upload_collection(
            COLLECTION, vectors=np.asarray(base, np.float32), ids=range(len(base)), batch_size=1000
        )
        client.close()
    else:
        raise ValueError(f"no build for {system!r}")
    return time.perf_counter() - started


def _wait_indexed(client: Any, timeout_s: float = 600.0) -> dict[str, Any]:
    """milvus-lite indexes sealed segments in the background: until it has, searches scan
    rows (exact, slower). Wait for ``pending_index_rows == 0``; returns the index state."""
    deadline = time.monotonic() + timeout_s
    while True:
        state: dict[str, Any] = client.describe_index(COLLECTION, "vector")
        if not state.get("pending_index_rows") or time.monotonic() > deadline:
            return state
        time.sleep(1.0)


async def _build_ours(directory: Path, base: np.ndarray) -> None:
    from vectordb import IndexConfig, SpannIndex

    index = await SpannIndex.create(directory, IndexConfig(dim=base.shape[1], metric="cosine"))
    try:
        await index.build(np.arange(len(base), dtype=np.int64), base)
    finally:
        await index.aclose()


async def _build_collection(directory: Path, base: np.ndarray) -> None:
    """The service's own write path, without HTTP: create, upsert in chunks of 1,000."""
    from vectordb.collections import Catalog, CollectionConfig

    catalog = await Catalog.open(directory)
    try:
        collection = await catalog.create(
            COLLECTION, CollectionConfig(dim=base.shape[1], distance="Cosine")
        )
        for start in range(0, len(base), 1000):
            rows = np.ascontiguousarray(base[start : start + 1000], np.float32)
            await collection.upsert(list(range(start, start + len(rows))), rows)
    finally:
        await catalog.aclose()


async def open_system(
    system: str, directory: Path, queries: np.ndarray, upserts: np.ndarray
) -> tuple[Any, dict[str, Any], Any]:
    """(ops, facts, closer) of a built system, opened from its files in this process."""
    if system == "inprocess":
        from vectordb.collections import Catalog

        catalog = await Catalog.open(directory / "data")
        facts = {"api": "vectordb.collections Collection.query, one vector per call, N tasks"}
        ops = CollectionOps(catalog.get(COLLECTION), queries, upserts)
        return ops, facts, catalog.aclose
    if system == "index_bulk":
        from vectordb import SpannIndex

        index = await SpannIndex.open(directory / "index")
        facts = {"api": "vectordb.SpannIndex.search, one query per call, N asyncio tasks"}
        return IndexOps(index, queries, upserts), facts, index.aclose
    if system == "milvus_lite":
        from pymilvus import MilvusClient

        client = MilvusClient(str(directory / _MILVUS_FILE))
        client.load_collection(COLLECTION)
        index = _wait_indexed(client)
        facts = {
            "api": "pymilvus MilvusClient.search, one vector per call, N threads",
            "index": {
                k: index.get(k)
                for k in ("index_type", "metric_type", "indexed_rows", "pending_index_rows")
            },
            "pymilvus": version("pymilvus"),
            "milvus_lite": version("milvus-lite"),
        }
        return MilvusOps(client, queries, upserts), facts, _closer(client.close)
    if system == "qdrant_local":
        from qdrant_client import QdrantClient

        client = QdrantClient(path=str(directory / "qdrant"))
        facts = {
            "api": "qdrant-client local mode query_points, one vector per call, N threads",
            "qdrant_client": version("qdrant-client"),
            "calls": "all under one lock: local mode is not thread-safe",
        }
        return QdrantOps(client, queries, upserts), facts, _closer(client.close)
    raise ValueError(f"unknown system {system!r}")


def _closer(fn: Any) -> Any:
    async def close() -> None:
        fn()

    return close
