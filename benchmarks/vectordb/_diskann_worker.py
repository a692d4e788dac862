"""DiskANN worker: runs under benchmarks/out/venv-diskann's Python (diskannpy 0.7.0 + numpy 1.25).

diskannpy 0.7.0 pins numpy==1.25, which the project's venv (numpy 2) cannot hold, so the driver
(``_diskann.py``) starts this module with the other interpreter, as
``python -m benchmarks.vectordb._diskann_worker MODE ...`` with the repository root on
PYTHONPATH. It imports nothing from the repository (the packages above it hold only docstrings).
Two modes:

    build BASE.npy DIR METRIC PQ_BUDGET_GB THREADS
        build_disk_index into DIR; prints one JSON line {build_s, pq_chunks, pq_bytes, ...}.
    serve DIR METRIC DIM CACHE_NODES THREADS QUERIES.npy
        load StaticDiskIndex once, print {"ready": ..., "rss_growth_bytes": ...}; then per stdin
        line {"L": int, "k": int, "beam": int, "out": path} run one batch_search over all
        queries, save the ids to ``out`` and print {"wall_s": ...}. EOF ends it.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

PREFIX = "ann"
# DiskANN's C++ code prints progress on file descriptor 1; keep the pipe to the driver for our
# JSON lines only by moving that descriptor to stderr.
REPLY = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _pq_shape(directory: str) -> tuple[int, int]:
    """(points, chunks) from the header of DiskANN's PQ code file (two int32)."""
    with open(os.path.join(directory, f"{PREFIX}_pq_compressed.bin"), "rb") as stream:
        points, chunks = np.frombuffer(stream.read(8), np.int32)
    return int(points), int(chunks)


def build(base_path: str, directory: str, metric: str, pq_gb: float, threads: int) -> None:
    import diskannpy

    base = np.load(base_path, mmap_mode="r")
    os.makedirs(directory, exist_ok=True)
    start = time.perf_counter()
    diskannpy.build_disk_index(
        data=np.ascontiguousarray(base, dtype=np.float32),
        distance_metric=metric,
        index_directory=directory,
        complexity=64,
        graph_degree=32,
        search_memory_maximum=pq_gb,
        build_memory_maximum=4.0,
        num_threads=threads,
        index_prefix=PREFIX,
    )
    points, chunks = _pq_shape(directory)
    files = {name: os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory)}
    print(
        json.dumps(
            {
                "build_s": time.perf_counter() - start,
                "points": points,
                "pq_chunks": chunks,
                "files": files,
            }
        ),
        file=REPLY,
        flush=True,
    )


def serve(
    directory: str, metric: str, dim: int, cache_nodes: int, threads: int, qpath: str
) -> None:
    import diskannpy

    queries = np.ascontiguousarray(np.load(qpath), dtype=np.float32)
    before = _rss_bytes()
    index = diskannpy.StaticDiskIndex(
        index_directory=directory,
        num_threads=threads,
        num_nodes_to_cache=cache_nodes,
        distance_metric=metric,
        vector_dtype=np.float32,
        dimensions=dim,
        index_prefix=PREFIX,
    )
    reply = {"ready": True, "rss_growth_bytes": _rss_bytes() - before}
    print(json.dumps(reply), file=REPLY, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        start = time.perf_counter()
        found = index.batch_search(
            queries, request["k"], request["L"], threads, beam_width=request["beam"]
        )
        wall_s = time.perf_counter() - start
        np.save(request["out"], found.identifiers.astype(np.int64))
        print(json.dumps({"wall_s": wall_s}), file=REPLY, flush=True)


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "build":
        build(args[0], args[1], args[2], float(args[3]), int(args[4]))
    else:
        serve(args[0], args[1], int(args[2]), int(args[3]), int(args[4]), args[5])
