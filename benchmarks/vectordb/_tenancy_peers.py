"""The tenancy benchmark's faiss peers, each run by a worker process (_tenancy_worker.py).

* ``faiss_ivf_filter``: one shared IVF-Flat in RAM (``nlist_for(n)`` lists, the spann
  benchmark's build) searched with the tenant's ids as a filter: ``SearchParametersIVF(sel=
  IDSelectorBatch(tenant's ids), nprobe=...)``, knob nprobe -- Curator's "shared IVF + metadata
  filter" baseline. The selectors of the queried tenants are made before timing (what a
  filtering engine keeps ready); resident bytes count the index plus the access lists (8 bytes a
  pair) a filter needs.
* ``per_tenant_ram``: a faiss ``IndexIDMap(IndexFlatIP)`` per tenant in RAM, exact: the speed
  ceiling. Built for the queried tenants only (untimed); resident bytes are those of an index
  for every tenant (vectors + 8-byte ids, each shared vector once per tenant).
* ``per_tenant_disk``: the same index per tenant written to its own file (``write_index``, all
  tenants, made by the parent and cached), read per query group with ``read_index`` then searched;
  cold: the queried tenants' files are dropped from the page cache before each timed pass.
  Skipped, with the reason, above ``MAX_TENANT_FILES`` tenants.

Modes (the worker times each per selectivity class): ``batch`` hands the class's rows over at
once; faiss takes one filter per call, so rows are grouped by tenant and the groups spread over 2
Python threads (faiss releases the GIL), one OpenMP thread per call -- the machine's 2 cores,
as ours has. ``single`` is one query per call from one caller, faiss with 2 OpenMP threads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from benchmarks.vectordb._common import drop_page_cache

THREADS = 2
K = 10
MAX_TENANT_FILES = 20_000  # per-tenant on-disk indexes: more files than this are not made


@dataclass
class Context:
    """What every worker loads: the base (memory-mapped), the rows, the access model."""

    base: np.ndarray
    queries: np.ndarray
    row_tenant: np.ndarray
    t_indptr: np.ndarray
    t_docs: np.ndarray

    def docs_of(self, tenant: int) -> np.ndarray:
        return self.t_docs[self.t_indptr[tenant] : self.t_indptr[tenant + 1]]

    @property
    def dim(self) -> int:
        return int(self.base.shape[1])


def groups(ctx: Context, rows: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(tenant, positions in ``rows``) of every tenant among the rows."""
    tenants = ctx.row_tenant[rows]
    order = np.argsort(tenants, kind="stable")
    cuts = np.flatnonzero(np.diff(tenants[order])) + 1
    return [(int(tenants[part[0]]), part) for part in np.split(order, cuts) if len(part)]


def run_groups(
    ctx: Context, rows: np.ndarray, search: Callable[[int, np.ndarray], np.ndarray]
) -> np.ndarray:
    """Each tenant's rows in one call of ``search(tenant, queries)``, on 2 threads."""
    out = np.full((len(rows), K), -1, np.int64)

    def one(group: tuple[int, np.ndarray]) -> None:
        faiss.omp_set_num_threads(1)  # per calling thread: 2 threads, 2 cores
        tenant, where = group
        out[where] = search(tenant, ctx.queries[rows[where]])

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(one, groups(ctx, rows)))
    return out


def tenant_index(ctx: Context, tenant: int) -> faiss.Index:
    docs = ctx.docs_of(tenant)
    index = faiss.IndexIDMap(faiss.IndexFlatIP(ctx.dim))
    if len(docs):
        index.add_with_ids(np.ascontiguousarray(ctx.base[docs], np.float32), docs)
    return index


def _pad(ids: np.ndarray) -> np.ndarray:
    """faiss answers k columns even where fewer vectors exist (-1): keep K columns."""
    if ids.shape[1] >= K:
        return ids[:, :K]
    return np.pad(ids, ((0, 0), (0, K - ids.shape[1])), constant_values=-1)


class FilteredIvf:
    name, knob = "faiss_ivf_filter", "nprobe"

    def __init__(self, ctx: Context, index_path: str) -> None:
        faiss.omp_set_num_threads(THREADS)
        self.ctx = ctx
        self.index = faiss.read_index(index_path)
        self.index_bytes = os.path.getsize(index_path)
        self.selectors: dict[int, Any] = {}
        for tenant in np.unique(ctx.row_tenant):
            docs = ctx.docs_of(int(tenant))
            self.selectors[int(tenant)] = faiss.IDSelectorBatch(len(docs), faiss.swig_ptr(docs))

    def values(self, requested: list[str]) -> list[Any]:
        return [int(v) for v in requested]

    def _search(self, tenant: int, queries: np.ndarray, nprobe: int) -> np.ndarray:
        params = faiss.SearchParametersIVF()
        params.sel, params.nprobe = self.selectors[tenant], nprobe  # the selector stays alive
        _, ids = self.index.search(queries, K, params=params)
        return _pad(ids)

    def batch(self, rows: np.ndarray, value: Any, deadline: float) -> tuple[np.ndarray, int]:
        return run_groups(self.ctx, rows, lambda t, q: self._search(t, q, value)), 0

    def single(self, row: int, value: Any) -> np.ndarray:
        faiss.omp_set_num_threads(THREADS)
        tenant = int(self.ctx.row_tenant[row])
        return self._search(tenant, self.ctx.queries[row : row + 1], value)[0]

    def cold(self, rows: np.ndarray) -> None:
        pass  # in RAM

    def figures(self) -> dict[str, Any]:
        pairs = int(self.ctx.t_indptr[-1])
        return {
            "resident_bytes": self.index_bytes + 8 * pairs,
            "index_bytes": self.index_bytes,
            "disk_bytes": 0,
        }

    def close(self) -> None:
        del self.index


class _PerTenant:
    """What both per-tenant peers share: one exact search a tenant, the rows of a batch
    grouped by tenant (run_groups)."""

    knob = "exact"
    ctx: Context
    _search: Callable[[int, np.ndarray], np.ndarray]  # each peer's own: (tenant, queries) -> ids

    def values(self, requested: list[str]) -> list[Any]:
        return [0]

    def batch(self, rows: np.ndarray, value: Any, deadline: float) -> tuple[np.ndarray, int]:
        return run_groups(self.ctx, rows, self._search), 0

    def single(self, row: int, value: Any) -> np.ndarray:
        faiss.omp_set_num_threads(THREADS)
        return self._search(int(self.ctx.row_tenant[row]), self.ctx.queries[row : row + 1])[0]


class PerTenantRam(_PerTenant):
    name = "per_tenant_ram"

    def __init__(self, ctx: Context) -> None:
        faiss.omp_set_num_threads(THREADS)
        self.ctx = ctx
        self.indexes = {int(t): tenant_index(ctx, int(t)) for t in np.unique(ctx.row_tenant)}

    def _search(self, tenant: int, queries: np.ndarray) -> np.ndarray:
        _, ids = self.indexes[tenant].search(queries, K)
        return _pad(ids)

    def cold(self, rows: np.ndarray) -> None:
        pass

    def figures(self) -> dict[str, Any]:
        pairs = int(self.ctx.t_indptr[-1])
        return {"resident_bytes": pairs * (4 * self.ctx.dim + 8), "disk_bytes": 0}

    def close(self) -> None:
        self.indexes.clear()


def tenant_file(directory: Path, tenant: int) -> Path:
    return directory / f"t{tenant}.index"


def write_tenant_files(ctx: Context, directory: Path, log: Callable[[str], None]) -> float:
    """One faiss index file per tenant with documents; seconds taken. ``DONE`` marks a whole
    set (a killed run leaves none half-made to be reused)."""
    if (directory / "DONE").exists():
        return float("nan")
    start = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    tenants = len(ctx.t_indptr) - 1
    log(f"per_tenant_disk: writing {tenants:,} index files into {directory}")
    for tenant in range(tenants):
        if ctx.t_indptr[tenant + 1] > ctx.t_indptr[tenant]:
            faiss.write_index(tenant_index(ctx, tenant), str(tenant_file(directory, tenant)))
    (directory / "DONE").write_text("")
    return time.perf_counter() - start


class PerTenantDisk(_PerTenant):
    name = "per_tenant_disk"

    def __init__(self, ctx: Context, directory: str) -> None:
        faiss.omp_set_num_threads(THREADS)
        self.ctx = ctx
        self.directory = Path(directory)

    def _search(self, tenant: int, queries: np.ndarray) -> np.ndarray:
        path = tenant_file(self.directory, tenant)
        if not path.exists():  # a tenant without documents
            return np.full((len(queries), K), -1, np.int64)
        _, ids = faiss.read_index(str(path)).search(queries, K)
        return _pad(ids)

    def cold(self, rows: np.ndarray) -> None:
        tenants = np.unique(self.ctx.row_tenant[rows])
        drop_page_cache(str(tenant_file(self.directory, int(t))) for t in tenants)

    def figures(self) -> dict[str, Any]:
        files = [f for f in self.directory.iterdir() if f.suffix == ".index"]
        return {
            "resident_bytes": 0,
            "disk_bytes": sum(f.stat().st_size for f in files),
            "files": len(files),
        }

    def close(self) -> None:
        pass
