r"""Benchmark the disk-resident SPANN index (vectordb, issue 4) against faiss and DiskANN.

For each dataset (debian-minilm; fashion-mnist; a 2M-vector Gaussian mixture fitted to
debian-minilm -- see _data.py) and each system, a sweep of the system's recall knob:

* ``ours``: ``vectordb.SpannIndex``, knob ``SearchParams.max_postings``; page cache dropped
  (``posix_fadvise(DONTNEED)`` on ``index.data_files()``) before every timed search;
* ``faiss_ondisk``: IVF-Flat with ``OnDiskInvertedLists`` (knob nprobe), closed, fadvised and
  reopened before every timed search (cold cache; see _faiss.py);
* ``faiss_ivf`` / ``faiss_hnsw``: IVF-Flat (nprobe) and HNSWFlat M=32 (efSearch) in RAM;
* ``diskann``: diskannpy 0.7.0's disk index in its own venv (knob L, beam width 4), its PQ codes
  + node cache sized to our index's resident bytes (equal memory; _diskann.py).

Per setting: recall@10 (|returned ∩ exact top-10| / 10), QPS (the whole query batch in one call,
2 threads, median single-batch wall time over rounds after one untimed warm-up pass, min-max
shown), resident bytes, and bytes / 4 KiB pages read per query (ours: the index's counters;
faiss OnDisk: computed from the probed lists' sizes; in-RAM systems: 0; DiskANN: n/a). Rounds
run every system and setting back to back.
Headline: QPS at recall@10 >= 0.90 (log-QPS interpolated along each curve), ours / faiss OnDisk
and ours / DiskANN. Then the update phase on debian-minilm (_update.py): insert the
held-out 10%, delete 10%, recall@10 against the exact live top-10 after every step.

Tables and PASS/MISS verdicts go to stdout, the last line being one JSON object; progress to
stderr. Plots: benchmarks/out/vectordb_spann_<dataset>.png (git-ignored, like all of out/).
Datasets, ground truth and all builds are cached under benchmarks/out/vectordb/ (a rerun reuses
them; ours rebuilds when vectordb/*.py changes, and a new build removes its stale versions).

Quick check (debian-minilm only, 2 rounds, DiskANN only if a cached build exists; about 2
minutes here with cached builds, plus ~1 minute of builds the first time)::

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.vectordb.spann --quick

Full mode (3 datasets, 3 rounds; DiskANN built on the small sets, ~7-10 min each the first
time; the 2M set takes ~26 min with ``--skip diskann,update,fp16,hnsw``: our build 505 s, faiss
OnDisk 410 s). The recorded runs passed ``--datasets`` one set at a time (RESULTS.md)::

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.vectordb.spann

``--datasets debian-minilm,gmm-500000`` picks datasets, ``--skip diskann,update`` drops parts.

Memory budgets (issue 14; _budget.py), on the headline set after the update phase: every system
in a process of its own (``-m benchmarks.vectordb._budget_worker``) inside a memory cgroup (v1
``memory.limit_in_bytes``, which counts page cache; v2 ``memory.max``), made as a child of the
cgroup this process is in and removed after. Limits, the same for every system: tight = 15% of
the raw vectors + baseline, ample = 2x raw + baseline, where baseline is what a worker is
charged after importing numpy/faiss/vectordb/torch (largest of one probe per system). Ours opens
with ``memory_budget_bytes`` = limit - baseline. Systems: ours and faiss IVF OnDisk at both
budgets, faiss IVF-Flat and HNSW32 in RAM at ample. Modes: one batch, one query per call, 8
and 64 concurrent callers; every pass cold (index reopened, page cache dropped; opening
untimed). Figures: QPS at recall@10 0.9 / 0.95, p50/p99 latency, peak RSS and cgroup peak.
faiss_plain.py (read_index + search only) runs at the tight limit as a check on the harness.
Without writable cgroups it runs uncapped and says so; ``--smoke`` always runs uncapped.
``--skip budget`` drops it; ``--budget-only`` runs nothing else (quick: ~2-3 minutes)::

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.vectordb.spann \
        --quick --budget-only

On a 2M set (``--datasets gmm-2000000 --budget-only``, ~15-20 min) the budget part has knobs of
its own and no faiss HNSW, and ours opens once per worker (its cold start empties its list
cache instead: _budget.BIG). Build its indexes first, outside the lock (~10-20 min niced), and
pass ``--reuse-build`` so that an edit to vectordb/ meanwhile does not start a rebuild inside
the timed hold (the run names the build it searched when it is by other code).
"""

from __future__ import annotations

from benchmarks.vectordb._spann_run import run


def main(argv: list[str] | None = None) -> None:
    run(argv)


if __name__ == "__main__":
    main()
