"""What per-chunk CRC-32s cost (tiers.nvme.chunks): the check of a whole 64 MiB block as N chunk
CRCs vs one CRC over the block, and the catalog bytes a chunk table adds, per chunk size.

* check: a 64 MiB page-aligned buffer of random bytes; ``payload_crc32`` over all of it (what a
  bare record's whole get checks) vs ``chunks.check_window`` over the same bytes as chunks of
  64 KiB .. 4 MiB (``crc32_many``: one compiled call), alternating, ``--rounds`` each; medians
  and min-max in ms, and the ratio of medians (chunks / whole).
* catalog: ``--entries`` catalog values of a 64 MiB record (``tiers.nvme.catalog_entry_bytes``:
  36 bytes without a chunk table, 1,064 with 256 KiB chunks; 296 with 1 MiB chunks) under
  KV-store keys (~150 bytes), 64 per transaction as a ``put_many`` commits them, in an LMDB
  environment; ``data.mdb`` bytes per entry (B-tree pages and copy-on-write free pages
  included).

    .venv/bin/python -m benchmarks.kvstore.chunk_checks --quick   # ~30 s

The last line is one JSON object: ``chunk_check_vs_whole_crc_256k`` (target <= 1),
``catalog_bytes_per_entry_256k``, ``catalog_bytes_per_entry_base`` and every figure.
Thread-safety: a script, one thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from benchmarks.common.paths import OUT_DIR
from tiers.io import aligned_empty
from tiers.nvme import catalog_entry_bytes, payload_crc32, sum_chunks

BLOCK_BYTES = 64 << 20
LOG2S = (16, 18, 20, 22)


def _ms(samples: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(samples) * 1e3, 3),
        "min": round(min(samples) * 1e3, 3),
        "max": round(max(samples) * 1e3, 3),
    }


def check_costs(rounds: int) -> dict[str, Any]:
    block = aligned_empty(BLOCK_BYTES)
    block[:] = np.random.default_rng(1).integers(0, 256, BLOCK_BYTES, dtype=np.uint8)
    tables = {log2: sum_chunks(block, log2) for log2 in LOG2S}  # also warms the compiled loop
    whole: list[float] = []
    chunked: dict[int, list[float]] = {log2: [] for log2 in LOG2S}
    for _ in range(rounds):
        start = time.perf_counter()
        payload_crc32(block)
        whole.append(time.perf_counter() - start)
        for log2 in LOG2S:
            start = time.perf_counter()
            crcs = sum_chunks(block, log2)
            chunked[log2].append(time.perf_counter() - start)
            assert (crcs == tables[log2]).all()
    out: dict[str, Any] = {"whole_crc_ms": _ms(whole)}
    for log2, samples in chunked.items():
        name = f"{(1 << log2) >> 10}k"
        out[f"chunks_{name}_ms"] = _ms(samples)
        out[f"chunk_check_vs_whole_crc_{name}"] = round(
            statistics.median(samples) / statistics.median(whole), 3
        )
    return out


def catalog_bytes(directory: Path, entries: int, value_bytes: int) -> dict[str, Any]:
    """``data.mdb`` bytes per entry of ``entries`` values of ``value_bytes`` under KV-store keys,
    64 a transaction, in an LMDB environment opened as the tier's catalog opens its own."""
    env = lmdb.open(str(directory), map_size=1 << 34, subdir=True, max_dbs=2, readahead=False)
    objects = env.open_db(b"objects")
    rng = np.random.default_rng(0)
    for start in range(0, entries, 64):
        with env.begin(write=True) as txn:
            for _ in range(start, min(start + 64, entries)):
                key = f"kv/0123456789abcdef/{rng.bytes(32).hex()}/{rng.bytes(32).hex()}"
                txn.put(key.encode(), rng.bytes(value_bytes), db=objects)
    env.close()
    size = (directory / "data.mdb").stat().st_size
    return {"bytes_per_entry": round(size / entries), "value_bytes": value_bytes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--entries", type=int)
    args = parser.parse_args(argv)
    rounds = args.rounds or (15 if args.quick else 41)
    entries = args.entries or (10_000 if args.quick else 50_000)
    figures: dict[str, Any] = {"block_bytes": BLOCK_BYTES, "rounds": rounds, "entries": entries}
    figures.update(check_costs(rounds))
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    values = {"base": catalog_entry_bytes(4096), "256k": catalog_entry_bytes(BLOCK_BYTES)}
    values["1024k"] = 36 + 4 + 4 * (BLOCK_BYTES >> 20)  # the same table at 1 MiB chunks
    for name, value_bytes in values.items():
        with tempfile.TemporaryDirectory(dir=OUT_DIR) as scratch:
            got = catalog_bytes(Path(scratch), entries, value_bytes)
        figures[f"catalog_bytes_per_entry_{name}"] = got["bytes_per_entry"]
        figures[f"catalog_value_bytes_{name}"] = value_bytes
    for key, value in figures.items():
        print(f"{key}: {value}", file=sys.stderr)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
