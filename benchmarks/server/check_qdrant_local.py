"""Cross-check of the load benchmark's qdrant-client local-mode figures, with none of its code.

Plain qdrant-client as its docs show it: ``QdrantClient(path=...)``, ``create_collection``
(cosine), ``upload_collection``, close; then a new client on the same folder calls
``query_points`` with one vector per call, first sequentially, then from 8 threads, for a fixed
time each. Prints QPS, p50 / p99 and recall@10 against the exact top-10, and one JSON line.

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.server.check_qdrant_local

Data: ../shared/data/debian-minilm; without it, 20k x 128 random unit vectors. Files go to a
temporary folder, removed at the end.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.server._checks import data, run


def main() -> None:
    from qdrant_client import QdrantClient, models

    base, queries, gt, name = data()
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "qdrant")
        client = QdrantClient(path=path)
        params = models.VectorParams(size=base.shape[1], distance=models.Distance.COSINE)
        client.create_collection("c", vectors_config=params)
        began = time.perf_counter()
        client.upload_collection("c", vectors=base, ids=range(len(base)), batch_size=1000)
        build_s = time.perf_counter() - began
        client.close()
        client = QdrantClient(path=path)

        def search(vector: list[float]) -> list[int]:
            found = client.query_points("c", query=vector, limit=10, with_payload=False)
            return [int(point.id) for point in found.points]

        vectors = [np.asarray(q, np.float32).tolist() for q in queries]
        for vector in vectors[:5]:
            search(vector)  # warm-up
        out = {
            "system": "qdrant_local",
            "dataset": name,
            "build_s": build_s,
            "runs": [run(search, vectors, gt, t) for t in (1, 8)],
        }
        client.close()
    for row in out["runs"]:
        print(
            f"qdrant local {name} threads={row['threads']}: {row['qps']:.0f} QPS, "
            f"p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms, "
            f"recall@10 {row['recall_at_10']:.3f}",
            file=sys.stderr,
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
