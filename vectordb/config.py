"""IndexConfig (fixed when an index is created) and SearchParams (per query batch).

Defaults follow SPANN/SPFresh (research/spann-diskann.md), measured here where they differ:
heads 8% of the vectors (SPANN ~10-16%; fewer heads measured faster at recall 0.9), replicas
per vector chosen by the RNG rule from the nearest heads, posting lists capped at about 120
vectors (the nearest kept), merge at <= 10 live vectors. SPANN allows 8 replicas and bounds
them by its closure rule (a head within (1 + eps1) x the nearest head's distance); the
defaults here, 4 replicas and a closure of 1.5 on squared distance (eps1 ~ 0.22), measured
fastest at recall@10 0.9 on debian-minilm among 2/4/8 replicas and closures 1.25/1.5/2/none
(benchmarks/vectordb/placement.py): a batch of queries reads the union of its lists, and a
replica of a vector deep inside its own list costs bytes for no recall. One knob trades recall for
speed at search time: ``SearchParams.max_postings`` (how many posting lists a query may read;
by default the index's own measure, ``SpannIndex.default_max_postings``: the fewest lists that
find 97% of its own vectors' neighbours (vectordb/probe_rule.py; 43 on debian-minilm, 179 on a
diffuse 2M mixture), never under ``default_postings(heads)``, the sqrt rule: 8 for up to 5,000
heads and more for bigger indexes).

Every field is checked for type and range when a config is made (tiers.storage.config_checks:
an int is an int, never a bool, a float or a string; a boolean is a bool; NaN is refused), and
normalised (numpy integers become ints, so a config always serialises). A mistake is an
IndexConfigError, a ConfigError and InvalidArgumentError too, whose ``where`` and message name the
field (``IndexConfig.dim: expected an integer >= 1, got 0``).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiers.storage import Check, boolean, choice, integer, number, optional
from vectordb.errors import IndexConfigError
from vectordb.metric import Metric

__all__ = ["DTYPES", "IndexConfig", "SearchParams"]

DTYPES = ("float32", "float16", "uint8")  # how vectors are stored in posting lists
_FINITE = sys.float_info.max


def _metric(value: Any, where: str, error: type[IndexConfigError] = IndexConfigError) -> Metric:
    if isinstance(value, str) and value in {m.value for m in Metric}:
        return Metric(value)
    raise error(f"unknown {value!r}; choose from {[m.value for m in Metric]}", where)


_INDEX_FIELDS: dict[str, Check] = {
    "dim": integer(1),
    "metric": _metric,
    "dtype": choice(DTYPES),
    "head_fraction": number(0.0, 1.0, above_minimum=True),
    "replica_count": integer(1),
    "rng_factor": number(0.0, _FINITE, above_minimum=True),
    "closure": number(1.0),  # inf: no closure rule
    "candidate_heads": integer(1),
    "posting_limit": integer(1),
    "append_reserve": number(0.0, 4.0),
    "merge_threshold": integer(0),
    "reassign_neighbours": integer(1),
    "navigator": choice(("auto", "flat", "hnsw")),
    "checkpoint_wal_bytes": integer(1),
    "seed": integer(0),  # numpy's generators take no negative seed
    "tenancy": boolean,
    "shortlist_limit": integer(1),
    "tenant_tree_branching": integer(2, 256),
    "tenant_leaf_size": integer(1),
}
_SEARCH_FIELDS: dict[str, Check] = {
    "max_postings": optional(integer(1)),
    "prune_ratio": number(1.0),  # inf: no pruning
    "shared_postings": optional(integer(0)),
    "strict": boolean,
    "tenant_candidates": optional(integer(0)),
    "tenant_route": choice(("auto", "tree", "filter")),
}


@dataclass(frozen=True)
class IndexConfig:
    """How an index is built and updated. Stored with the index; fixed for its life."""

    dim: int
    metric: Metric | str = Metric.L2
    dtype: str = "float32"
    # share of vectors chosen as in-memory heads: 0.08 measured fastest at recall 0.9 on
    # debian-minilm (0.06 / 0.08 / 0.12: the head scan is most of a batch's CPU)
    head_fraction: float = 0.08
    replica_count: int = 4  # posting lists a vector may be stored in (SPANN: up to 8)
    rng_factor: float = 1.0  # RNG rule: skip head h if rng_factor * d(h, chosen) < d(x, h)
    closure: float = 1.5  # SPANN's closure: a replica only in a list whose head is within this
    # x the nearest head's squared distance (inf: the RNG rule alone decides)
    candidate_heads: int = 64  # heads considered when placing a vector
    posting_limit: int = 120  # vectors per posting list; longer ones split (or, at build, trim)
    # room for appends a list gets at build, as a share of its records (0: none beyond its last
    # page; a list that grows then moves once, with headroom). 0 keeps a batch's lists back to
    # back on disk (fewer, larger reads); a reserve makes the first inserts cheaper
    append_reserve: float = 0.0
    merge_threshold: int = 10  # a list with this many live vectors or fewer merges away
    reassign_neighbours: int = 32  # neighbouring lists checked for reassignment after a split
    navigator: str = "auto"  # "flat", "hnsw" or "auto" (hnsw above 20k heads)
    checkpoint_wal_bytes: int = 64 << 20  # checkpoint once the write-ahead log is this long
    seed: int = 0
    # multi-tenant access (vectordb.tenancy): every vector carries the tenants that may read it,
    # each tenant's vectors are also kept in Curator-style shortlists of at most
    # ``shortlist_limit`` vectors (tau; Curator's experiments: 256) under a frozen tree of
    # ``tenant_tree_branching`` children per node whose leaves hold about ``tenant_leaf_size``
    # vectors at training
    tenancy: bool = False
    shortlist_limit: int = 256
    tenant_tree_branching: int = 16
    tenant_leaf_size: int = 256

    def __post_init__(self) -> None:
        _check_fields(self, _INDEX_FIELDS)
        where = "IndexConfig."
        if self.dtype == "uint8" and self.metric is Metric.COSINE:
            raise IndexConfigError(
                "cosine normalises vectors: store them as float32 or float16", where + "dtype"
            )
        if self.replica_count > self.candidate_heads:
            raise IndexConfigError(
                f"{self.replica_count} exceeds candidate_heads ({self.candidate_heads})",
                where + "replica_count",
            )
        if not self.merge_threshold < self.posting_limit // 2:
            raise IndexConfigError(
                f"{self.merge_threshold} is not below half the posting_limit "
                f"({self.posting_limit})",
                where + "merge_threshold",
            )

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        return np.dtype(self.dtype)

    @property
    def raw_bytes_per_vector(self) -> int:
        """A vector at its input precision (float32 for float indexes, even when the lists
        keep float16 copies): the base that resident memory is compared to."""
        return self.dim * (1 if self.dtype == "uint8" else 4)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["metric"] = Metric(self.metric).value
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> IndexConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise IndexConfigError(
                f"unknown keys {sorted(map(str, unknown))}; known: {sorted(known)}", "IndexConfig"
            )
        # an index created before the closure rule existed keeps placing without it
        return cls(**{"closure": float("inf"), **values})


@dataclass(frozen=True)
class SearchParams:
    """Per-search settings. ``max_postings`` is the recall/latency knob."""

    # posting lists read per query, nearest heads first; None: the index's measured default
    # (SpannIndex.default_max_postings, never under default_postings(heads)), a quarter more
    # for a batch of up to 16 queries (search.SMALL_BATCH_QUERIES)
    max_postings: int | None = None
    prune_ratio: float = 4.0  # skip a list whose head is this many times farther (squared L2)
    # lists after the first max_postings a query also scores when its batch reads them anyway
    # (for other queries: no extra I/O); None: as many as max_postings
    shared_postings: int | None = None
    # a posting list that fails its check: False answers from the lists that verify (the
    # result says which were skipped: SearchResult); True raises CorruptionError
    strict: bool = False
    # tenant searches (vectordb.tenancy): candidate vectors a query scores, its tenant's
    # nearest shortlists first; None: the default (tenancy.tenant_search); 0: every shortlist
    # of the tenant (an exact search)
    tenant_candidates: int | None = None
    # "tree": the tenant's shortlists; "filter": the shared lists, scoring only what the
    # tenant may read; "auto": "filter" for tenants holding at least
    # tenancy.logged.FILTER_ROUTE_SHARE of the index
    tenant_route: str = "auto"

    def __post_init__(self) -> None:
        _check_fields(self, _SEARCH_FIELDS)


def default_postings(n_heads: int) -> int:
    """The floor of the default ``max_postings`` for an index of ``n_heads`` lists (the index
    measures its own default on its vectors, probe_rule.py, and never goes under this): 8 up
    to 5,000 heads, then growing as sqrt(heads), since a query's neighbours spread over more,
    smaller cells as the index grows. Measured (benchmarks/RESULTS.md's history in git): 8
    lists reach recall@10 0.92 at 5k heads on debian-minilm (0.94 on fashion-mnist); at 160k
    heads (2M generated vectors) 8 lists reach only 0.62 and 48 reach 0.92 (this gives 45)."""
    return max(8, round(8 * math.sqrt(max(n_heads, 0) / 5000)))


def _check_fields(config: object, checks: dict[str, Check]) -> None:
    """Check every field of a frozen ``config`` and store its normalised value."""
    for field, check in checks.items():
        where = f"{type(config).__name__}.{field}"
        value = check(getattr(config, field), where, IndexConfigError)
        object.__setattr__(config, field, value)
