"""The tenancy benchmark's datasets: vectors, who may read each one, and (query, tenant) rows.

A ``TenantSet`` holds the base vectors (L2-normalised, cosine), the access model as CSR
(``doc_indptr``/``doc_tenants``: the tenants of document i are
``doc_tenants[doc_indptr[i]:doc_indptr[i + 1]]``), and the query rows: one row per (query vector,
tenant), with the exact top-100 among that tenant's documents (padded -1).

* ``debian-minilm``: ../shared/data/debian-minilm with its real tenants (``doc_tenants.npz``,
  ``tenant_queries.npz``: 1,149 rows). Skipped, with the reason, without ../shared.
* ``tgen-<n>-<tenants>``: generated, made here and cached. ``n`` 384-d unit vectors from a
  two-level mixture: ``max(16, n // 500)`` clusters whose centres scatter around 1 in 32 of as
  many super-centres (cosine ~0.8 to theirs); a point is its centre plus noise in a 24-dimension
  subspace of its own cluster plus a little isotropic noise (neighbours are meaningful inside a
  cluster, as in real embeddings). Cluster sizes are log-normal. Tenant sizes are Zipf, s_r ~
  r^-alpha (at least 1), alpha solved so the largest tenant holds ``MAX_SHARE`` of the vectors and
  all tenants together ``SHARE_DEGREE`` x n access pairs. Tenants follow clusters, as real ones do
  (research/curator-multitenant.md §4: uniformly scattered tenants make a poor benchmark): a
  tenant picks a seed cluster (by size), takes the clusters nearest it until they hold ``_POOL``
  (8) x its local share and at least ``POOL_SHARE`` (3%) of all vectors, and draws
  ``LOCAL_SHARE`` (0.8) of its documents from them, the rest uniformly from the whole set; a
  document nobody drew goes to a tenant seeded in its cluster (share degree ~2.15). Query rows:
  tenants sampled per selectivity class (< 0.1%, 0.1-1%, > 1% of n), ``rows_per_class`` each
  where the class has tenants; a row's query is a new point of the cluster of a random document
  of its tenant (like debian-minilm's held-out packages: mostly in the tenant's home clusters, a
  fifth of the time where only a stray document of it lies). Ground truth by brute force over
  each tenant's own vectors. ``locality`` measures how much a set's tenants crowd their
  queries. debian-minilm's medians are 0.037 / 0.022 / 0.046 by class; version 3 of the
  generator gives 0.038 / 0.044 / 0.13 at 200k and 0.043 / 0.039 / 0.15 at 1M, with a heavier
  tail. Version 1 (every query in a home cluster, pool 2x) was ten times more local and version
  2 (pool 8x, no floor) thirty times at 1M (0.0013 for the smallest tenants): a small tenant
  then filled the clusters around its queries and a filtered shared index found its answers in
  the first lists it probed.
* ``tsmoke-<n>``: the same generator at 64 dimensions, not cached: the test suite's smoke run.

Files go under benchmarks/out/vectordb/tenancy/data/ (.npy, memory-mapped when read back).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.paths import SHARED_DATA
from benchmarks.vectordb._common import log

MINILM_DIR = SHARED_DATA / "debian-minilm"
GT_K = 100
CLASSES = ("<0.1%", "0.1-1%", ">1%")  # tenant size / indexed vectors
CLASS_BOUNDS = (0.001, 0.01)
SHARE_DEGREE = 2.0
MAX_SHARE = 0.04
LOCAL_SHARE = 0.8
_POOL = 8  # a tenant's home clusters hold this many times its local documents
POOL_SHARE = 0.03  # and at least this share of all vectors
_GEN_VERSION = 3  # in the cached files' names: a change to the generator makes new files
_SUBSPACE = 24
_CHUNK = 100_000


@dataclass
class TenantSet:
    name: str
    base: np.ndarray  # float32 [n, d], unit rows, possibly memory-mapped
    doc_indptr: np.ndarray  # int64 [n + 1]
    doc_tenants: np.ndarray  # int64 [pairs]: tenant ids of each document, CSR
    queries: np.ndarray  # float32 [rows, d]: the query vector of each row
    row_tenant: np.ndarray  # int64 [rows]
    gt: np.ndarray  # int64 [rows, GT_K]: exact top among the row tenant's documents, -1 padded
    base_path: Path | None = None  # the .npy behind ``base`` (workers memory-map it)
    version: str = ""  # the generator's, for generated sets: in every cached build's name

    @property
    def base_tag(self) -> str:
        """Names builds of the vectors alone (faiss IVF, ours without tenancy)."""
        return self.name + self.version

    @property
    def access_tag(self) -> str:
        """Names builds of the vectors and the access model (ours, per-tenant files)."""
        digest = hashlib.sha256(self.doc_indptr.tobytes() + self.doc_tenants.tobytes())
        return f"{self.base_tag}-a{digest.hexdigest()[:8]}"

    @property
    def n(self) -> int:
        return int(self.base.shape[0])

    @property
    def dim(self) -> int:
        return int(self.base.shape[1])

    @property
    def n_tenants(self) -> int:
        return int(self.doc_tenants.max()) + 1 if len(self.doc_tenants) else 0

    def tenant_sizes(self) -> np.ndarray:
        return np.bincount(self.doc_tenants, minlength=self.n_tenants)

    def row_class(self) -> np.ndarray:
        """Selectivity class (index into CLASSES) of every row's tenant."""
        return selectivity_class(self.tenant_sizes()[self.row_tenant], self.n)

    def describe(self) -> dict[str, Any]:
        sizes = self.tenant_sizes()
        per_doc = np.diff(self.doc_indptr)
        classes = np.bincount(self.row_class(), minlength=len(CLASSES))
        tenant_classes = np.bincount(selectivity_class(sizes, self.n), minlength=len(CLASSES))
        return {
            "vectors": self.n,
            "dim": self.dim,
            "tenants": int((sizes > 0).sum()),
            "access_pairs": len(self.doc_tenants),
            "share_degree": round(float(per_doc.mean()), 3),
            "shared_docs": round(float((per_doc >= 2).mean()), 3),
            "docs_without_tenant": int((per_doc == 0).sum()),
            "largest_tenant": int(sizes.max()),
            "tenants_by_class": dict(zip(CLASSES, map(int, tenant_classes), strict=True)),
            "rows_by_class": dict(zip(CLASSES, map(int, classes), strict=True)),
        }


def selectivity_class(sizes: np.ndarray, n: int) -> np.ndarray:
    share = np.asarray(sizes, np.float64) / max(n, 1)
    return np.searchsorted(np.array(CLASS_BOUNDS), share, side="right").astype(np.int64)


def tenant_csr(doc_indptr: np.ndarray, doc_tenants: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The access model transposed: (indptr over tenants, document ids sorted per tenant)."""
    docs = np.repeat(np.arange(len(doc_indptr) - 1, dtype=np.int64), np.diff(doc_indptr))
    order = np.lexsort((docs, doc_tenants))
    counts = np.bincount(doc_tenants, minlength=int(doc_tenants.max()) + 1 if len(docs) else 0)
    indptr = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr, docs[order]


def pair_keys(doc_indptr: np.ndarray, doc_tenants: np.ndarray, n_tenants: int) -> np.ndarray:
    """Sorted doc * n_tenants + tenant of every access pair (the leak check's lookup)."""
    docs = np.repeat(np.arange(len(doc_indptr) - 1, dtype=np.int64), np.diff(doc_indptr))
    return np.sort(docs * n_tenants + doc_tenants)


def count_leaks(found: np.ndarray, tenants: np.ndarray, keys: np.ndarray, n_tenants: int) -> int:
    """Results (ids >= 0) whose row's tenant may not read them under the access model."""
    rows, cols = np.nonzero(found >= 0)
    if not len(rows):
        return 0
    wanted = found[rows, cols].astype(np.int64) * n_tenants + tenants[rows]
    where = np.searchsorted(keys, wanted)
    where[where >= len(keys)] = 0
    return int((keys[where] != wanted).sum()) if len(keys) else len(wanted)


def tenant_recalls(found: np.ndarray, gt: np.ndarray, k: int = 10) -> np.ndarray:
    """Per row |found[:k] ∩ gt[:k]| / min(k, the tenant's documents): a tenant with fewer than
    k documents is answered fully by returning all of them."""
    out = np.zeros(len(gt))
    for i, (row, truth) in enumerate(zip(found[:, :k], gt[:, :k], strict=True)):
        truth = truth[truth >= 0]
        if len(truth):
            out[i] = len(np.intersect1d(row[row >= 0], truth)) / len(truth)
        else:
            out[i] = 1.0  # a tenant without documents: nothing to find
    return out


def load(name: str, data_dir: Path, rows_per_class: int) -> TenantSet | None:
    if name == "debian-minilm":
        return _minilm()
    if name.startswith("tgen-"):
        n, tenants = (int(part) for part in name.removeprefix("tgen-").split("-"))
        return _generated(name, n, tenants, 384, rows_per_class, data_dir)
    if name.startswith("tsmoke-"):
        n = int(name.removeprefix("tsmoke-"))
        return _generated(name, n, max(8, n // 2), 64, rows_per_class, None)
    raise ValueError(f"unknown dataset {name!r}")


def _minilm() -> TenantSet | None:
    if not (MINILM_DIR / "tenant_queries.npz").exists():
        log(f"debian-minilm: {MINILM_DIR} is absent (no ../shared checkout); skipped")
        return None
    access = np.load(MINILM_DIR / "doc_tenants.npz")
    rows = np.load(MINILM_DIR / "tenant_queries.npz")
    queries = np.load(MINILM_DIR / "queries.npy")[rows["query"]]
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return TenantSet(
        "debian-minilm",
        np.load(MINILM_DIR / "embeddings.npy", mmap_mode="r"),
        access["indptr"].astype(np.int64),
        access["indices"].astype(np.int64),
        np.ascontiguousarray(queries, np.float32),
        rows["tenant"].astype(np.int64),
        rows["gt_ids"].astype(np.int64),
        MINILM_DIR / "embeddings.npy",
    )


# ----------------------------------------------------------------------------- generated


@dataclass
class _Mixture:
    centres: np.ndarray  # [clusters, d]
    bases: np.ndarray  # [clusters, _SUBSPACE, d]
    weights: np.ndarray  # [clusters]
    spread: float
    noise: float


def _mixture(n: int, dim: int, seed: int) -> _Mixture:
    rng = np.random.default_rng(seed)
    clusters = max(16, n // 500)
    supers = _unit(rng.standard_normal((max(2, clusters // 32), dim)))
    centres = supers[rng.integers(len(supers), size=clusters)]
    centres = _unit(centres + 0.75 * _unit(rng.standard_normal((clusters, dim))))
    bases = rng.standard_normal((clusters, _SUBSPACE, dim)).astype(np.float32)
    bases /= np.float32(math.sqrt(dim))
    weights = rng.lognormal(0.0, 0.5, clusters)
    return _Mixture(centres, bases, weights / weights.sum(), 0.6, 0.2)


def _unit(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _sample(mix: _Mixture, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    dim = mix.centres.shape[1]
    out = mix.centres[labels].copy()
    z = rng.standard_normal((len(labels), _SUBSPACE)).astype(np.float32)
    z *= np.float32(mix.spread / math.sqrt(_SUBSPACE))  # basis rows have norm ~1
    order = np.argsort(labels, kind="stable")
    cuts = np.flatnonzero(np.diff(labels[order])) + 1
    for group in np.split(order, cuts):
        if len(group):
            out[group] += z[group] @ mix.bases[labels[group[0]]]
    iso = rng.standard_normal(out.shape).astype(np.float32)
    out += iso * np.float32(mix.noise / math.sqrt(dim))
    return _unit(out)


def _zipf_sizes(n: int, tenants: int, rng: np.random.Generator) -> np.ndarray:
    """Zipf sizes: largest MAX_SHARE * n, together SHARE_DEGREE * n (alpha by bisection)."""
    top = max(1.0, MAX_SHARE * n)
    ranks = np.arange(1, tenants + 1, dtype=np.float64)
    target = SHARE_DEGREE * n
    low, high = 0.0, 4.0
    for _ in range(60):
        alpha = (low + high) / 2
        total = np.maximum(1, np.round(top * ranks**-alpha)).sum()
        low, high = (alpha, high) if total > target else (low, alpha)
    sizes = np.maximum(1, np.round(top * ranks ** -((low + high) / 2))).astype(np.int64)
    return rng.permutation(np.minimum(sizes, n))


def _assign(
    labels: np.ndarray, mix: _Mixture, sizes: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """Each tenant's documents (sorted)."""
    n, clusters = len(labels), len(mix.centres)
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=clusters)
    starts = np.concatenate([[0], np.cumsum(counts)])
    near = np.argsort(-(mix.centres @ mix.centres.T), axis=1)  # each cluster's nearest first
    seed_p = counts / counts.sum()
    docs, homes = [], []
    for size in sizes:
        local = round(LOCAL_SHARE * float(size))
        seed = rng.choice(clusters, p=seed_p)
        held = np.cumsum(counts[near[seed]])
        m = int(np.searchsorted(held, max(_POOL * local, POOL_SHARE * n))) + 1
        home = near[seed][: min(m, clusters)]
        pool = np.concatenate([order[starts[c] : starts[c + 1]] for c in home])
        mine = rng.choice(pool, size=min(local, len(pool)), replace=False)
        chosen = np.unique(mine)
        while len(chosen) < size:  # the uniform part (a draw may hit a document twice)
            extra = rng.integers(0, n, size=int(size) - len(chosen))
            chosen = np.unique(np.concatenate([chosen, extra]))
        docs.append(chosen.astype(np.int64))
        homes.append(home)
    # a document nobody chose is read by a tenant whose nearest home is its cluster (every
    # document has a reader, as in debian-minilm); that adds ~0.15 to the share degree
    seen = np.zeros(n, bool)
    for mine in docs:
        seen[mine] = True
    orphans = np.flatnonzero(~seen)
    by_seed: dict[int, list[int]] = {}
    for tenant, home in enumerate(homes):
        by_seed.setdefault(int(home[0]), []).append(tenant)
    adopted: dict[int, list[int]] = {}
    for doc in orphans:
        readers = by_seed.get(int(labels[doc]))
        tenant = int(rng.choice(readers)) if readers else int(rng.integers(len(docs)))
        adopted.setdefault(tenant, []).append(int(doc))
    for tenant, more in adopted.items():
        docs[tenant] = np.union1d(docs[tenant], np.array(more, np.int64))
    return docs


def _doc_csr(docs: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    all_docs = np.concatenate(docs)
    all_tenants = np.repeat(np.arange(len(docs), dtype=np.int64), [len(d) for d in docs])
    order = np.lexsort((all_tenants, all_docs))
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(all_docs, minlength=n), out=indptr[1:])
    return indptr, all_tenants[order]


def _rows(
    mix: _Mixture,
    labels: np.ndarray,
    docs: list[np.ndarray],
    per_class: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """(query vectors, tenant) of ``per_class`` rows per selectivity class that has tenants."""
    classes = selectivity_class(np.array([len(d) for d in docs]), len(labels))
    tenants = []
    for cls in range(len(CLASSES)):
        members = np.flatnonzero(classes == cls)
        if len(members):
            tenants.append(rng.choice(members, size=per_class, replace=True))
    row_tenant = np.concatenate(tenants) if tenants else np.zeros(0, np.int64)
    # a row's query is a new point of the cluster of one of its tenant's documents (as a
    # debian-minilm query is a held-out package of its maintainer): mostly the tenant's home
    # clusters, sometimes where only a stray document of it lies (the hard rows)
    query_labels = np.array([labels[rng.choice(docs[t])] for t in row_tenant], np.int64)
    return _sample(mix, query_labels, rng), row_tenant.astype(np.int64)


def exact_tenant_gt(
    base: np.ndarray,
    t_indptr: np.ndarray,
    t_docs: np.ndarray,
    queries: np.ndarray,
    row_tenant: np.ndarray,
    k: int = GT_K,
) -> np.ndarray:
    """Exact top-k by inner product among each row tenant's documents (brute force)."""
    gt = np.full((len(queries), k), -1, np.int64)
    for tenant in np.unique(row_tenant):
        rows = np.flatnonzero(row_tenant == tenant)
        docs = t_docs[t_indptr[tenant] : t_indptr[tenant + 1]]
        if not len(docs):
            continue
        scores = queries[rows] @ np.asarray(base[docs], np.float32).T
        top = min(k, len(docs))
        part = np.argpartition(-scores, top - 1, axis=1)[:, :top]
        best = np.take_along_axis(scores, part, axis=1)
        part = np.take_along_axis(part, np.argsort(-best, axis=1, kind="stable"), axis=1)
        gt[rows, :top] = docs[part]
    return gt


def _generated(
    name: str, n: int, tenants: int, dim: int, per_class: int, data_dir: Path | None
) -> TenantSet:
    stem = f"{name}-v{_GEN_VERSION}"
    if data_dir is not None and (data_dir / f"{stem}_rows{per_class}.npz").exists():
        return _read_generated(name, stem, per_class, data_dir)
    log(f"{name}: generating {n:,} x {dim} vectors, {tenants:,} tenants")
    mix = _mixture(n, dim, seed=7)
    rng = np.random.default_rng(11)
    labels = rng.choice(len(mix.weights), size=n, p=mix.weights)
    base_path = None if data_dir is None else data_dir / f"{stem}_base.npy"
    if base_path is not None and base_path.exists():
        base = np.load(base_path, mmap_mode="r")
    elif base_path is not None:
        data_dir.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
        partial = base_path.with_suffix(".partial.npy")
        array = np.lib.format.open_memmap(partial, "w+", np.float32, (n, dim))
        for i, start in enumerate(range(0, n, _CHUNK)):
            array[start : start + _CHUNK] = _sample(
                mix, labels[start : start + _CHUNK], np.random.default_rng(1000 + i)
            )
        array.flush()
        del array
        partial.rename(base_path)
        base = np.load(base_path, mmap_mode="r")
    else:
        base = _sample(mix, labels, np.random.default_rng(1000))
    sizes = _zipf_sizes(n, tenants, rng)
    docs = _assign(labels, mix, sizes, rng)
    doc_indptr, doc_tenants = _doc_csr(docs, n)
    queries, row_tenant = _rows(mix, labels, docs, per_class, rng)
    log(f"{name}: exact ground truth of {len(row_tenant)} rows")
    t_indptr = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    gt = exact_tenant_gt(base, t_indptr, np.concatenate(docs), queries, row_tenant)
    out = TenantSet(
        name, base, doc_indptr, doc_tenants, queries, row_tenant, gt, base_path, f"-v{_GEN_VERSION}"
    )
    if data_dir is not None:
        np.savez(data_dir / f"{stem}_access.partial.npz", indptr=doc_indptr, indices=doc_tenants)
        (data_dir / f"{stem}_access.partial.npz").rename(data_dir / f"{stem}_access.npz")
        rows = data_dir / f"{stem}_rows{per_class}.partial.npz"
        np.savez(rows, queries=queries, tenant=row_tenant, gt_ids=gt)
        rows.rename(data_dir / f"{stem}_rows{per_class}.npz")
        (data_dir / f"{stem}.json").write_text(json.dumps(out.describe(), indent=1) + "\n")
    return out


def _read_generated(name: str, stem: str, per_class: int, data_dir: Path) -> TenantSet:
    access = np.load(data_dir / f"{stem}_access.npz")
    rows = np.load(data_dir / f"{stem}_rows{per_class}.npz")
    base_path = data_dir / f"{stem}_base.npy"
    return TenantSet(
        name,
        np.load(base_path, mmap_mode="r"),
        access["indptr"],
        access["indices"],
        rows["queries"],
        rows["tenant"],
        rows["gt_ids"],
        base_path,
        f"-v{_GEN_VERSION}",
    )


def locality(ts: TenantSet, sample: int = 300, k: int = 10) -> dict[str, dict[str, float]]:
    """How clustered each class's tenants are around their queries: per row, (vectors nearer
    the query than the tenant's k-th nearest + 1) x the tenant's selectivity / k -- about 1
    where a tenant's vectors are scattered at random, far below 1 where they crowd the query
    (then a shared index's nearest results hold the tenant's answers). Median and 90th
    percentile per class, over a sample of rows with at least k ground-truth ids."""
    rng = np.random.default_rng(0)
    rows = rng.choice(len(ts.row_tenant), min(sample, len(ts.row_tenant)), replace=False)
    rows = rows[(ts.gt[rows, k - 1] >= 0)]
    queries = ts.queries[rows]
    kth = np.einsum("ij,ij->i", queries, np.asarray(ts.base[ts.gt[rows, k - 1]], np.float32))
    nearer = np.zeros(len(rows), np.int64)
    for start in range(0, ts.n, _CHUNK):
        chunk = np.asarray(ts.base[start : start + _CHUNK], np.float32)
        nearer += (queries @ chunk.T > kth[:, None]).sum(axis=1)
    factor = (nearer + 1) * ts.tenant_sizes()[ts.row_tenant[rows]]
    factor = factor / (ts.n * k)
    classes = ts.row_class()[rows]
    out = {}
    for cls, name in enumerate(CLASSES):
        mine = factor[classes == cls]
        if len(mine):
            out[name] = {
                "median": round(float(np.median(mine)), 4),
                "p90": round(float(np.quantile(mine, 0.9)), 3),
            }
    return out
