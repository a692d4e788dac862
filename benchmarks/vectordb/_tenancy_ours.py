"""Our index in the tenancy benchmark: its builds, two searched systems and the update timings.

* builds (made by the parent, cached under benchmarks/out/vectordb/tenancy/spann/<set>[-tenancy]-
  <code>/ like _ours.py's: a change to vectordb/*.py rebuilds, a ``BUILT`` stamp marks a whole
  build): ``SpannIndex.create(dir, IndexConfig(dim, metric="cosine", tenancy=True))`` then
  ``build(None, vectors, tenants=(indptr, tenant ids))``; and the same index without tenancy.
* ``ours``: the tenancy index, ``search(queries, 10, SearchParams(tenant_candidates=c),
  tenant=[one tenant per query])``, knob c (None: the index's default; 0: every shortlist of the
  tenant, exact). Cold: every file of the index dropped from the page cache before a timed pass.
* ``shared_filter``: the index without tenancy with the filter applied to what it returns,
  probes grown until k results: a query is searched for k' = 100 results reading
  ``max_postings`` = knob x the default lists; its results are filtered by the tenant's access
  list; a query left with fewer than k allowed results is searched again with 4x k' and 4x the
  lists (no pruning), until it has k or has seen the whole index. A batch does the rounds for
  all its unfinished queries at once. Resident bytes: the index plus the access lists it filters
  with (8 bytes a pair).
* ``ours_updates``: the update timings (_tenancy_updates.py).

Only ``tenancy_supported()`` commits have the API (issue 15); before it lands the parent skips
ours and says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

import vectordb
from benchmarks.vectordb._common import drop_page_cache, log
from benchmarks.vectordb._ours import _remove_stale_builds
from benchmarks.vectordb._ours import code_hash as _flat_code_hash
from benchmarks.vectordb._tenancy_peers import Context, K
from tiers.io import aligned_empty
from vectordb import IndexConfig, SearchParams, SpannIndex, default_postings
from vectordb.metric import prepare
from vectordb.posting_format import PAGE_BYTES, pages_for
from vectordb.tenancy.tenant_search import runs_read

_FIRST_KPRIME = 100
_GROWTH = 4
_MAX_RESULT_CELLS = 16_000_000  # rows x k' of one filtered round (ids + scores: ~200 MB)


@functools.cache
def code_hash() -> str:
    """_ours.code_hash (which imports every vectordb module first) over vectordb/**/*.py: the
    tenancy code lives in a subpackage, which _ours.code_hash does not read."""
    _flat_code_hash()
    digest = hashlib.sha256()
    root = Path(vectordb.__file__).resolve().parent
    for source in sorted(root.rglob("*.py")):
        digest.update(str(source.relative_to(root)).encode() + source.read_bytes())
    return digest.hexdigest()[:10]


def tenancy_supported() -> bool:
    fields = {f.name for f in dataclasses.fields(IndexConfig)}
    return "tenancy" in fields and hasattr(SpannIndex, "grant")


def index_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def index_files(directory: Path) -> list[str]:
    return [str(f) for f in directory.rglob("*") if f.is_file()]


async def _build(directory: Path, base: np.ndarray, tenants: Any, config: IndexConfig) -> float:
    start = time.perf_counter()
    index = await SpannIndex.create(directory, config)
    try:
        if tenants is None:
            await index.build(None, base, progress=True)
        else:
            await index.build(None, base, tenants=tenants, progress=True)
    finally:
        await index.aclose()
    build_s = time.perf_counter() - start
    (directory / "BUILT").write_text(f"{build_s:.3f}\n")
    return build_s


def cached_build(
    runner: asyncio.Runner,
    cache_dir: Path,
    name: str,
    base: np.ndarray,
    tenants: tuple[np.ndarray, np.ndarray] | None,
) -> tuple[Path, float]:
    """(directory, build seconds) of our index of ``base``, with tenancy when ``tenants``."""
    tag = f"{name}{'-tenancy' if tenants is not None else ''}"
    directory = cache_dir / f"{tag}-{code_hash()}"
    stamp = directory / "BUILT"
    if stamp.exists():
        log(f"ours: reusing the build in {directory}")
        return directory, float(stamp.read_text())
    options: dict[str, Any] = {"tenancy": True} if tenants is not None else {}
    config = IndexConfig(dim=base.shape[1], metric="cosine", **options)
    log(f"ours: building {len(base):,} vectors into {directory}")
    _remove_stale_builds(directory)
    shutil.rmtree(directory, ignore_errors=True)
    build_s = runner.run(_build(directory, np.ascontiguousarray(base), tenants, config))
    log(f"ours: built in {build_s:.1f} s")
    return directory, build_s


class Ours:
    """The tenancy index; knob ``tenant_candidates``."""

    name, knob = "ours", "tenant_candidates"

    def __init__(self, ctx: Context, directory: str) -> None:
        self.ctx, self.directory = ctx, Path(directory)
        self.runner = asyncio.Runner()
        self.index = self.runner.run(SpannIndex.open(directory))

    def values(self, requested: list[str]) -> list[Any]:
        return [None if v == "default" else int(v) for v in requested]

    def _params(self, value: Any) -> SearchParams:
        if value is None:
            return SearchParams()
        return SearchParams(tenant_candidates=value)

    def _search(self, queries: np.ndarray, tenants: list[Any], value: Any) -> np.ndarray:
        search = self.index.search(queries, K, self._params(value), tenant=tenants)
        return np.asarray(self.runner.run(search)[0])

    def batch(self, rows: np.ndarray, value: Any, deadline: float) -> tuple[np.ndarray, int]:
        return self._search(self.ctx.queries[rows], self.ctx.row_tenant[rows].tolist(), value), 0

    def single(self, row: int, value: Any) -> np.ndarray:
        tenant = int(self.ctx.row_tenant[row])
        return self._search(self.ctx.queries[row : row + 1], [tenant], value)[0]

    def concurrent(self, rows: np.ndarray, value: Any) -> np.ndarray:
        """Every row its own awaited one-query call, all at once (a service's callers)."""
        params = self._params(value)

        async def one(row: int) -> np.ndarray:
            tenant = int(self.ctx.row_tenant[row])
            query = self.ctx.queries[row : row + 1]
            return np.asarray((await self.index.search(query, K, params, tenant=tenant))[0][0])

        async def every() -> list[np.ndarray]:
            return await asyncio.gather(*(one(int(r)) for r in rows))

        return np.stack(self.runner.run(every())) if len(rows) else np.zeros((0, K), np.int64)

    def cold(self, rows: np.ndarray) -> None:
        drop_page_cache(index_files(self.directory))

    def read_bound(self, rows: np.ndarray, value: Any, runs: bool) -> float:
        """Seconds to read, cold, in one submission, just what a batch search of ``rows`` at
        ``value`` reads (tenant_search.runs_read: each shortlist's compact twin where it is
        whole, else its run): no tree walk, access check or scoring. ``runs``: the full
        runs instead (float records, what a search read before the twins)."""
        tenancy = self.index.tenancy
        assert tenancy is not None
        prepared = prepare(self.index.metric, self.ctx.queries[rows])
        tenants = tenancy.names.numbers(self.ctx.row_tenant[rows].tolist())
        chosen = runs_read(tenancy, prepared, tenants, value)
        pids = np.unique(np.concatenate([np.zeros(0, np.int64), *map(np.asarray, chosen)]))
        store = tenancy.store
        twin = np.zeros(len(pids), bool) if runs or value == 0 else store.twins(pids)
        lists, codes = store.lists, store.codes
        pages = pages_for(lists.count[pids].astype(np.int64), lists.rec_bytes)
        first = lists.start[pids].astype(np.int64)
        if twin.any():
            held = pids[twin]
            pages[twin] = pages_for(codes.count[held].astype(np.int64), codes.rec_bytes)
            first[twin] = codes.start[held]
        starts = np.concatenate([[0], np.cumsum(pages)])
        buffer = aligned_empty(max(1, int(starts[-1])) * PAGE_BYTES)
        offsets = first.astype(np.int64) * PAGE_BYTES
        self.cold(rows)
        start = time.perf_counter()
        read = lists.engine.read_batch(
            lists.file, buffer, offsets, pages * PAGE_BYTES, starts[:-1] * PAGE_BYTES
        )
        self.runner.run(read)
        return time.perf_counter() - start

    def figures(self) -> dict[str, Any]:
        stats = self.index.stats()
        keep = ("resident_bytes", "tenant_resident_bytes", "tenant_disk_bytes", "tenants")
        out = {key: stats[key] for key in (*keep, "access_pairs", "shortlists") if key in stats}
        out["disk_bytes"] = index_bytes(self.directory)
        out["n_heads"] = stats["n_heads"]
        return out

    def close(self) -> None:
        self.runner.run(self.index.aclose())
        self.runner.close()


class SharedFilter:
    """The index without tenancy, its results filtered, probes grown until k results."""

    name, knob = "shared_filter", "postings_x_default"

    def __init__(self, ctx: Context, directory: str) -> None:
        self.ctx, self.directory = ctx, Path(directory)
        self.runner = asyncio.Runner()
        self.index = self.runner.run(SpannIndex.open(directory))
        stats = self.index.stats()
        self.heads, self.live = int(stats["n_heads"]), int(stats["n_vectors"])
        self.default = default_postings(self.heads)

    def values(self, requested: list[str]) -> list[Any]:
        return [float(v) for v in requested]

    def _round(
        self, queries: np.ndarray, kprime: int, postings: int, first: bool, deadline: float
    ) -> np.ndarray:
        """Results of the first queries of a round (every query in the first round; in later
        ones, those whose chunk started before ``deadline``)."""
        params = SearchParams(max_postings=postings)  # later rounds: no pruning either
        if not first:
            params = SearchParams(max_postings=postings, prune_ratio=float("inf"))
        chunk = max(1, _MAX_RESULT_CELLS // kprime)
        parts = [np.zeros((0, kprime), np.int64)]
        for start in range(0, len(queries), chunk):
            if not first and time.perf_counter() > deadline:
                break
            found = self.runner.run(
                self.index.search(queries[start : start + chunk], kprime, params)
            )
            parts.append(np.asarray(found[0]))
        return np.concatenate(parts)

    def _filtered(self, rows: np.ndarray, value: float, deadline: float) -> tuple[np.ndarray, int]:
        out = np.full((len(rows), K), -1, np.int64)
        todo = np.arange(len(rows))
        kprime, postings, first = _FIRST_KPRIME, max(1, round(value * self.default)), True
        while len(todo):
            found = self._round(self.ctx.queries[rows[todo]], kprime, postings, first, deadline)
            left = list(todo[len(found) :])  # cut short by the deadline: what earlier rounds found
            for where, ids in zip(todo, found, strict=False):
                docs = self.ctx.docs_of(int(self.ctx.row_tenant[rows[where]]))
                ids = ids[ids >= 0]
                slot = np.minimum(np.searchsorted(docs, ids), max(len(docs) - 1, 0))
                allowed = ids[docs[slot] == ids] if len(docs) else ids[:0]
                out[where, : min(K, len(allowed))] = allowed[:K]
                if len(allowed) < K and len(allowed) < len(docs):
                    left.append(where)
            exhausted = kprime >= self.live and postings >= self.heads and len(found) == len(todo)
            if exhausted or time.perf_counter() > deadline:
                return out, 0 if exhausted else len(left)
            todo = np.array(left, np.int64)
            kprime = min(self.live, kprime * _GROWTH)
            postings = min(self.heads, postings * _GROWTH)
            first = False
        return out, 0

    def batch(self, rows: np.ndarray, value: Any, deadline: float) -> tuple[np.ndarray, int]:
        return self._filtered(rows, value, deadline)

    def single(self, row: int, value: Any) -> np.ndarray:
        return self._filtered(np.array([row]), value, float("inf"))[0][0]

    def cold(self, rows: np.ndarray) -> None:
        drop_page_cache(index_files(self.directory))

    def figures(self) -> dict[str, Any]:
        stats = self.index.stats()
        pairs = int(self.ctx.t_indptr[-1])
        return {
            "resident_bytes": int(stats["resident_bytes"]) + 8 * pairs,
            "index_resident_bytes": int(stats["resident_bytes"]),
            "disk_bytes": index_bytes(self.directory),
            "default_max_postings": self.default,
            "n_heads": self.heads,
        }

    def close(self) -> None:
        self.runner.run(self.index.aclose())
        self.runner.close()
