r"""A plain check on the harness's faiss OnDisk figure: only ``read_index`` + ``search``.

    .venv/bin/python -m benchmarks.vectordb.faiss_plain \
        --index benchmarks/out/vectordb/faiss/debian-minilm-ondisk1024.index \
        --queries Q.npy --gt GT.npy --nprobe 16 [--single-queries 200]

Nothing from the harness is imported (no wrappers, no worker protocol): the file's pages are
dropped (``posix_fadvise(DONTNEED)`` on the ``.ivfdata``; no index is open, so nothing maps it),
the index is read with ``IO_FLAG_ONDISK_SAME_DIR``, and the queries are searched once as one
batch, then -- after another drop and read -- one query per call. 2 OpenMP threads, like the
harness. The budget part (_budget.py) runs it at the ample limit (joining its cgroup once faiss
is imported, as the workers do) and records its figures beside the harness's faiss_ondisk
figures at the same nprobe. Prints one line per run and
then a JSON line: batch_qps, batch_recall, single_qps, single_recall, single_p50_ms.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import faiss
import numpy as np

K = 10


def _drop(index_path: str) -> None:
    """Drop the lists' file (the ``.ivfdata`` beside the ``.index``) from the page cache."""
    data_path = index_path.removesuffix(".index") + ".ivfdata"
    fd = os.open(data_path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _open(index_path: str, nprobe: int) -> faiss.Index:
    _drop(index_path)
    index = faiss.read_index(index_path, faiss.IO_FLAG_ONDISK_SAME_DIR)
    index.nprobe = nprobe
    return index


def recall(ids: np.ndarray, gt: np.ndarray) -> float:
    hits = sum(len(np.intersect1d(row, truth)) for row, truth in zip(ids, gt[:, :K], strict=True))
    return hits / (K * len(ids))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="faiss OnDisk: read_index + search, cold")
    parser.add_argument("--index", required=True)
    parser.add_argument("--queries", required=True)
    parser.add_argument("--gt", required=True)
    parser.add_argument("--nprobe", type=int, default=16)
    parser.add_argument("--single-queries", type=int, default=200)
    parser.add_argument("--cgroup", help="a memory cgroup to join once faiss is imported")
    parser.add_argument("--join", action="store_true", help="join --cgroup (else: ignored)")
    args = parser.parse_args(argv)
    reply = os.fdopen(os.dup(1), "w")  # faiss prints the SAME_DIR rewrite with printf
    os.dup2(2, 1)
    faiss.omp_set_num_threads(2)
    queries, gt = np.load(args.queries), np.load(args.gt)
    if args.cgroup and args.join:  # what the search takes from here on is charged there
        with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))

    index = _open(args.index, args.nprobe)
    start = time.perf_counter()
    _, ids = index.search(queries, K)
    batch_s = time.perf_counter() - start
    del index  # unmaps the lists' file, so the next drop takes effect

    index = _open(args.index, args.nprobe)
    rows = queries[: args.single_queries]
    latencies, found = [], []
    for row in range(len(rows)):
        start = time.perf_counter()
        found.append(index.search(rows[row : row + 1], K)[1][0])
        latencies.append(time.perf_counter() - start)
    del index
    out = {
        "nprobe": args.nprobe,
        "batch_qps": round(len(queries) / batch_s, 1),
        "batch_recall": round(recall(ids, gt), 4),
        "single_qps": round(len(rows) / sum(latencies), 1),
        "single_recall": round(recall(np.array(found), gt[: len(rows)]), 4),
        "single_p50_ms": round(float(np.median(latencies)) * 1000, 3),
    }
    print(f"batch: {out['batch_qps']:,.0f} QPS, recall@10 {out['batch_recall']:.4f}", file=reply)
    single = f"{out['single_qps']:,.0f} QPS, p50 {out['single_p50_ms']:.2f} ms"
    print(f"single: {single}, recall@10 {out['single_recall']:.4f}", file=reply)
    print(json.dumps(out), file=reply, flush=True)


if __name__ == "__main__":
    main()
