"""Benchmark the storage tiers and the TieredStore against the hardware's own limits (issue 3).

Three parts, all in one process, every reference measured in the same run:

1. **Per tier, per size** (4 KiB, 64 KiB, 1 MiB, 16 MiB), back to back in every round: DRAM, HBM
   (a torch arena on device ``cpu``: no GPU here), CXL (*emulated* when the machine has no CPU-less
   NUMA node: ordinary memory plus the modelled +130 ns and 25 GB/s cap) against ``np.copyto``
   between two preallocated arrays of the same size; NvmeTier (O_DIRECT, io_uring) gets at queue
   depth 16 against ``fio --ioengine=io_uring --direct=1 --rw=randread --iodepth=16`` at the same
   block size over a file of the same total size, and NvmeTier puts against fio sequential writes
   with ``--fdatasync=1`` (each write durable, as a put is). Put and get GB/s and p50/p99 latency;
   gets into a caller buffer (``into=``), and for DRAM also without. See _store_memory.py and
   _store_nvme.py.
2. **DRAM hit bookkeeping**: microseconds per 4 KiB ``DramTier.get`` and per ``TieredStore.get``
   hit in DRAM (per policy), minus a bare 4 KiB ``np.copyto``.
4. **Batches** (_store_batch.py): ``get_many`` of 32 keys vs fio randread QD32 at 4 and 64 KiB;
   4 KiB ``put_many`` and 64 concurrent ``put``s (group commit) vs fio randwrite
   ``--fdatasync=1`` at iodepth 1.
5. **LRU peer** (_store_lru_peer.py): Zipf(0.99) over 10,000 64 KiB objects, DRAM 10%: the
   store's best policy vs a dict + OrderedDict LRU over O_DIRECT ``os.preadv``.
3. **Zipf**: a working set 4x the DRAM tier, mixed sizes, Zipf(1.0) popularity; hit rate and
   throughput of the store per policy against a plain LRU cache and against everything on NVMe.
   See _store_zipf.py.

Quick check (about 70 s here)::

    .venv/bin/python -m benchmarks.tiers.store --quick

Full mode (about 6 minutes here)::

    .venv/bin/python -m benchmarks.tiers.store

Markdown tables and PASS/MISS verdicts go to stdout, the last line being one JSON object;
progress goes to stderr. The headline keys are built in ``_store_report.headline`` (add new
figures there, one block per part) and the run's plan (sizes, rounds, durations) in
``_store_run``; ``--smoke`` shrinks every part to seconds for the test suite. Files live under
benchmarks/out/ and are removed when the run ends, however it ends (``--keep-data`` keeps the
fio data file for the next run).
"""

from __future__ import annotations

from benchmarks.tiers._store_run import run


def main(argv: list[str] | None = None) -> None:
    run(argv)


if __name__ == "__main__":
    main()
