"""Benchmark the storage tiers and the TieredStore against the hardware's own limits (issue 3).

Three parts, all in one process, every reference measured in the same run:

1. **Per tier, per size** (4 KiB, 64 KiB, 1 MiB, 16 MiB), back to back in every round: DRAM, HBM
   (a torch arena on device ``cpu``: no GPU here), CXL (*emulated* when the machine has no CPU-less
   NUMA node: ordinary memory plus the modelled +130 ns and 25 GB/s cap) against ``np.copyto``
   between two preallocated arrays of the same size; NvmeTier (O_DIRECT, io_uring) gets at queue
   depth 16 against ``fio --ioengine=io_uring --direct=1 --rw=randread --iodepth=16`` at the same
   block size over a file of the same total size, and NvmeTier puts against fio sequential writes
   with ``--fdatasync=1`` (each write durable, as a put is). Put and get GB/s and p50/p99 latency;
   gets into a caller buffer (``into=``), and for DRAM also without. See _tiers_memory.py and
   _tiers_nvme.py.
2. **DRAM hit bookkeeping**: microseconds per 64-byte ``DramTier.get`` and per ``TieredStore.get``
   hit in DRAM (per policy), minus a bare 64-byte ``np.copyto``.
3. **Zipf**: a working set 4x the DRAM tier, mixed sizes, Zipf(1.0) popularity; hit rate and
   throughput of the store per policy against a plain LRU cache and against everything on NVMe.
   See _tiers_zipf.py.

Quick check (about 70 s here)::

    .venv/bin/python benchmarks/tiers.py --quick

Full mode (about 6 minutes here)::

    .venv/bin/python benchmarks/tiers.py

Markdown tables and PASS/MISS verdicts go to stdout, the last line being one JSON object;
progress goes to stderr. Files live under benchmarks/out/ and are removed when the run ends,
however it ends (``--keep-data`` keeps the fio data file for the next run).
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)


def _package_first() -> None:
    """Put the repository root first on ``sys.path``.

    This file shares its name with the ``tiers`` package, and a script's own directory leads
    ``sys.path``: without this, ``import tiers`` in any script of benchmarks/ would find this file.
    """
    sys.path[:] = [_ROOT, *(p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT)]


if __name__ == "tiers":
    # Imported as ``tiers`` by a sibling script (io_engine.py via _common.py): load the package
    # in this module's place; the import system hands the importer what sys.modules then holds.
    import importlib

    _package_first()
    del sys.modules["tiers"]
    importlib.import_module("tiers")


def main(argv: list[str] | None = None) -> None:
    _package_first()
    from _tiers_run import run

    run(argv)


if __name__ == "__main__":
    main()
