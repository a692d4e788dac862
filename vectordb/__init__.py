"""vectordb: a disk-resident SPANN index with SPFresh-style in-place updates.

Heads (about 8% of the vectors at build: IndexConfig.head_fraction; splits add more) live in
memory behind a navigator; every head owns a posting list of nearby vectors on disk
(page-aligned, one contiguous read per list, read for a whole query batch in one I/O-core
submission). Inserts append to lists and split them when they grow too long; deletes are
tombstones; every acknowledged update is in a write-ahead log first.

    index = await SpannIndex.create(directory, IndexConfig(dim=384, metric="cosine"))
    await index.build(ids, vectors)
    ids, scores = await index.search(queries, k=10)  # a SearchResult: .degraded, .skipped_lists
    await index.insert(new_ids, new_vectors); await index.delete(old_ids)
    # multi-tenant (IndexConfig(..., tenancy=True); vectordb.tenancy): access in the engine
    await index.insert(ids, vectors, tenants=[["acme"], ["acme", 7]])
    await index.grant(ids, "globex"); await index.revoke(ids, 7); index.count("acme")
    ids, scores = await index.search(queries, k=10, tenant="acme")  # or one tenant per query
    await index.aclose()
"""

from vectordb.config import IndexConfig, SearchParams, default_postings
from vectordb.errors import (
    DuplicateIdError,
    IndexClosedError,
    IndexConfigError,
    InvalidTenantError,
    InvalidVectorsError,
)
from vectordb.index import SpannIndex
from vectordb.metric import Metric
from vectordb.scrub_report import RepairReport, ScrubReport
from vectordb.search_result import SearchResult

__all__ = [
    "DuplicateIdError",
    "IndexClosedError",
    "IndexConfig",
    "IndexConfigError",
    "InvalidTenantError",
    "InvalidVectorsError",
    "Metric",
    "RepairReport",
    "ScrubReport",
    "SearchParams",
    "SearchResult",
    "SpannIndex",
    "default_postings",
]
