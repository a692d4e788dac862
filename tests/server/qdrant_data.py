"""The qdrant-client tests' data, and our Python API's answers on it.

One seeded data set (500 x 32, payloads with a keyword, an integer and a float field), the
filters both sides run (in Qdrant's JSON form), numpy's exact answers, and ``python_answers``:
everything the server is compared with, from a ``vectordb.collections`` collection of its own
folder filled in the same chunks and order as the server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_client import models as qm

from vectordb.collections import Catalog, CollectionConfig, parse_filter

N, DIM, N_QUERIES, LIMIT = 500, 32, 12, 10
COLORS = ["red", "green", "blue", "amber", "violet"]
SCORE_TOL = 1e-4

# The filters both sides run, in Qdrant's JSON form (the client's models serialise to these).
COLOR_FILTER = {"must": [{"key": "color", "match": {"value": "blue"}}]}
RANGE_FILTER = {"must": [{"key": "rank", "range": {"gte": 100, "lt": 300}}]}
MIXED_FILTER = {
    "should": [
        {"key": "color", "match": {"value": "red"}},
        {"key": "score", "range": {"gt": 0.8}},
    ],
    "must_not": [{"key": "rank", "range": {"lt": 50}}],
}
DELETE_IDS = list(range(0, 60, 3))
DELETE_FILTER = {"must": [{"key": "color", "match": {"value": "green"}}]}


def data() -> tuple[list[int], np.ndarray, list[dict[str, Any]], np.ndarray]:
    rng = np.random.default_rng(20261126)
    vectors = rng.standard_normal((N, DIM)).astype(np.float32)
    ids = [int(i) for i in rng.permutation(10 * N)[:N]]
    payloads = [
        {
            "color": COLORS[int(rng.integers(len(COLORS)))],
            "rank": i,
            "score": float(np.round(rng.random(), 4)),
        }
        for i in range(N)
    ]
    queries = rng.standard_normal((N_QUERIES, DIM)).astype(np.float32)
    return ids, vectors, payloads, queries


IDS, VECTORS, PAYLOADS, QUERIES = data()
ROW = {point_id: row for row, point_id in enumerate(IDS)}
HALF = N // 2
# Chunks in order: the first half as a points list, the second as a column batch.
CHUNKS = [(0, HALF), (HALF, N)]


def to_qm_filter(value: dict[str, Any]) -> qm.Filter:
    """The client's model of a JSON filter (what an application would build)."""
    return qm.Filter.model_validate(value)


# -- the Python API, in its own folder ------------------------------------------------------


def python_answers(folder: Path) -> dict[str, Any]:
    """Everything the server is compared with, from the Python API on the same data."""

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        catalog = await Catalog.open(str(folder))
        try:
            c = await catalog.create("docs", CollectionConfig(DIM, distance="Cosine"))
            for lo, hi in CHUNKS:
                await c.upsert(IDS[lo:hi], VECTORS[lo:hi], PAYLOADS[lo:hi])

            async def queries(name: str, flt: dict[str, Any] | None) -> None:
                for exact in (True, False):
                    hits = await c.query(
                        QUERIES, limit=LIMIT, filter=parse_filter(flt), exact=exact
                    )
                    out[name, exact] = [[(h.id, h.score) for h in row] for row in hits]

            await queries("plain", None)
            await queries("color", COLOR_FILTER)
            await queries("range", RANGE_FILTER)
            await queries("mixed", MIXED_FILTER)
            out["count_all"] = await c.count(None)
            out["count_color"] = await c.count(parse_filter(COLOR_FILTER))
            out["count_range"] = await c.count(parse_filter(RANGE_FILTER))
            await c.create_payload_index("color")
            await queries("indexed_color", COLOR_FILTER)
            await c.delete([IDS[i] for i in DELETE_IDS])
            flt = parse_filter(DELETE_FILTER)
            assert flt is not None
            await c.delete_where(flt)
            out["count_after_delete"] = await c.count(None)
            await queries("after_delete", None)
        finally:
            await catalog.aclose()
        return out

    return asyncio.run(run())


def exact_cosine(point_id: int, query: np.ndarray) -> float:
    v = VECTORS[ROW[point_id]].astype(np.float64)
    q = query.astype(np.float64)
    return float(v @ q / (np.linalg.norm(v) * np.linalg.norm(q)))


def matches(flt: dict[str, Any] | None, index: int) -> bool:
    f = parse_filter(flt)
    return f is None or f.matches(IDS[index], PAYLOADS[index])


def truth(flt: dict[str, Any] | None) -> list[list[int]]:
    """numpy's exact top ``LIMIT`` ids per query among the points ``flt`` matches."""
    rows = [i for i in range(N) if matches(flt, i)]
    v = VECTORS[rows].astype(np.float64)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    q = QUERIES.astype(np.float64)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    order = np.argsort(-(q @ v.T), axis=1)[:, :LIMIT]
    return [[IDS[rows[j]] for j in row] for row in order]


def overlap(got: list[list[tuple[Any, float]]], want: list[list[int]]) -> float:
    found = sum(len({i for i, _ in g} & set(w)) for g, w in zip(got, want, strict=True))
    return found / sum(len(w) for w in want)
