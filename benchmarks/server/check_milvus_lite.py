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


def build(path: str) -> dict[str, Any]:
    """Create, insert, flush, close; then search from this same process."""
    from pymilvus import MilvusClient

    base = data()[0]
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
    return {"build_s": build_s, **measure(path, (1,))}


def _child(*args: str) -> dict[str, Any]:
    """This script in a process of its own (milvus-lite holds its file until its process
    ends: a second process cannot open it before)."""
    cmd = [sys.executable, "-m", "benchmarks.server.check_milvus_lite", *args]
    root = Path(__file__).resolve().parents[2]  # the repository: -m finds benchmarks
    done = subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, text=True, check=True)
    reply: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return reply


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] in ("--build", "--measure"):
        path = sys.argv[2]
        print(json.dumps(build(path) if sys.argv[1] == "--build" else measure(path, (1, 8))))
        return
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "check.db")
        same = _child("--build", path)  # builds, then searches in the process that inserted
        fresh = _child("--measure", path)
    out = {"system": "milvus_lite", "dataset": data()[3], "build_s": same.pop("build_s")}
    out |= {"same_process": same, "fresh_process": fresh}
    for label in ("same_process", "fresh_process"):
        for row in out[label]["runs"]:
            print(
                f"milvus-lite {out['dataset']} {label} threads={row['threads']}: "
                f"{row['qps']:.0f} QPS, p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms, "
                f"recall@10 {row['recall_at_10']:.3f}",
                file=sys.stderr,
            )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
