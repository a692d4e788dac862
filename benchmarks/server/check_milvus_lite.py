"""Cross-check of the load benchmark's milvus-lite figures, with none of its code.

Plain pymilvus as its docs show it: ``MilvusClient("file.db")``, ``create_collection`` with its
defaults (AUTOINDEX), insert, flush, close; then a new client on the same file waits until the
index holds every row and searches one vector per call, sequentially; then a fresh process
opens the file and does the same from 1 and 8 threads, for a fixed time each. Both, because
they differ: in the process that inserted, searches scanned the rows (recall 1.000, ~10x
slower) although the index said every row was indexed; a fresh process used the index (as the
load benchmark's measuring process does). Prints QPS, p50 / p99 and recall@10 against the exact
top-10, and one JSON line.

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.server.check_milvus_lite

Data: ../shared/data/debian-minilm; without it, 20k x 128 random unit vectors (exact top-10 by
brute force here). Files go to a temporary folder, removed at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.server._checks import data, run


def measure(path: str, threads: tuple[int, ...]) -> dict[str, Any]:
    """Open the file (wait for its background index) and search it from 1..N threads."""
    from pymilvus import MilvusClient

    _, queries, gt, _ = data()
    client = MilvusClient(path)
    client.load_collection("c")
    began = time.perf_counter()  # the index is built in the background after the flush
    while client.describe_index("c", "vector").get("pending_index_rows"):
        if time.perf_counter() - began > 600:
            break
        time.sleep(1.0)
    index_wait_s = time.perf_counter() - began
    index = client.describe_index("c", "vector")
    vectors = [q.tolist() for q in queries]

    def search(vector: list[float]) -> list[int]:
        found = client.search("c", data=[vector], limit=10, output_fields=["id"])
        return [hit["id"] for hit in found[0]]

    for vector in vectors[:20]:
        search(vector)  # warm-up
    runs = [run(search, vectors, gt, t) for t in threads]
    client.close()
    return {"index_wait_s": index_wait_s, "index": index, "runs": runs}


def main() -> None:
    from pymilvus import MilvusClient

    if len(sys.argv) == 3 and sys.argv[1] == "--measure":  # the fresh process
        print(json.dumps(measure(sys.argv[2], (1, 8))))
        return
    base, _, _, name = data()
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "check.db")
        client = MilvusClient(path)
        client.create_collection("c", dimension=base.shape[1], metric_type="COSINE")
        began = time.perf_counter()
        for start in range(0, len(base), 5000):
            rows = [
                {"id": start + i, "vector": v.tolist()}
                for i, v in enumerate(base[start : start + 5000])
            ]
            client.insert("c", rows)
        client.flush("c")
        build_s = time.perf_counter() - began
        client.close()
        same = measure(path, (1,))  # the process that inserted: reopened, same process
        cmd = [sys.executable, "-m", "benchmarks.server.check_milvus_lite", "--measure", path]
        root = Path(__file__).resolve().parents[2]  # the repository: -m finds benchmarks
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True)
        fresh = json.loads(done.stdout.strip().splitlines()[-1])
    out = {"system": "milvus_lite", "dataset": name, "build_s": build_s}
    out |= {"same_process": same, "fresh_process": fresh}
    for label in ("same_process", "fresh_process"):
        for row in out[label]["runs"]:
            print(
                f"milvus-lite {name} {label} threads={row['threads']}: {row['qps']:.0f} QPS, "
                f"p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms, "
                f"recall@10 {row['recall_at_10']:.3f}",
                file=sys.stderr,
            )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
