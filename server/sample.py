"""The sample collection ``--sample`` loads: 2,000 generated points to try the API on, built in
a few seconds without any data set.

``sample``: 64 dimensions, Cosine; 16 clusters of 125 points around random centres; ids 0..1999;
payload ``{"group": "g<cluster>", "n": <id>}`` with a keyword index on ``group``. Generated
from a fixed seed, so the README's examples always see the same points. Left as it is when it
exists already.

Thread-safety: event loop only (awaits the collection layer).
"""

from __future__ import annotations

import logging

import numpy as np

from vectordb.collections import Catalog, CollectionConfig

__all__ = ["SAMPLE_NAME", "ensure_sample", "sample_vectors"]

log = logging.getLogger("tierkit.server")
SAMPLE_NAME = "sample"
SAMPLE_DIM = 64
SAMPLE_POINTS = 2000
SAMPLE_GROUPS = 16
_BATCH = 500


def sample_vectors(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(vectors float32 [2000, 64], group of each point): clustered, so queries have
    meaningful neighbours."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((SAMPLE_GROUPS, SAMPLE_DIM)).astype(np.float32)
    groups = np.arange(SAMPLE_POINTS) % SAMPLE_GROUPS
    noise = 0.35 * rng.standard_normal((SAMPLE_POINTS, SAMPLE_DIM)).astype(np.float32)
    return centres[groups] + noise, groups


async def ensure_sample(catalog: Catalog) -> bool:
    """Create and fill the sample collection unless it exists; True when it was created."""
    if SAMPLE_NAME in catalog.names():
        return False
    log.info("creating the sample collection (%d points)...", SAMPLE_POINTS)
    collection = await catalog.create(SAMPLE_NAME, CollectionConfig(SAMPLE_DIM, "Cosine"))
    await collection.create_payload_index("group")
    vectors, groups = sample_vectors()
    for start in range(0, SAMPLE_POINTS, _BATCH):
        ids = list(range(start, min(start + _BATCH, SAMPLE_POINTS)))
        payloads = [{"group": f"g{groups[i]}", "n": i} for i in ids]
        await collection.upsert(ids, vectors[ids], payloads)
    return True
