"""Why the index places vectors as it does by default: QPS at recall@10 0.9 for several
``replica_count`` / ``closure`` pairs (IndexConfig).

On debian-minilm (../shared/data/debian-minilm), one index per pair (everything else at its
default) is built under benchmarks/out/vectordb/spann/ (reused while
``vectordb/*.py`` is unchanged), then every build is searched with the whole 500-query batch
at several ``max_postings``, cold cache (``posix_fadvise(DONTNEED)``; the index reads with
O_DIRECT), one untimed warm-up pass, then ``--rounds`` rounds with every build and setting
back to back. Printed: a table (recall, median QPS with min-max, KiB read per query, disk
bytes of the lists) and, last, one JSON line ``{"qps_at_recall_0_9": {"r4-c1.5": qps, ...}}``.

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.vectordb.placement [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from benchmarks.common.paths import OUT_DIR
from benchmarks.vectordb._common import Point, log, qps_at_recall, recall_at
from benchmarks.vectordb._data import SMOKE_SET, Dataset, load
from benchmarks.vectordb._ours import OursSystem


class _Placement(OursSystem):
    """OursSystem over an index built with ``replica_count`` and ``closure``."""

    def __init__(
        self, runner: asyncio.Runner, ds: Dataset, replicas: int, closure: float, cache: Path
    ) -> None:
        self.tag = f"r{replicas}-c{closure:g}"
        overrides = {"replica_count": replicas, "closure": closure}
        super().__init__(runner, ds, cache, overrides=overrides)
        self.name = self.tag


def _list_mib(stats: dict) -> str:  # type: ignore[type-arg]
    used_pages = stats["file_pages"] - stats["free_pages"]
    return f"{used_pages * 4096 / 2**20:.0f} MiB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 placements, 2 rounds")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # tests only
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    out = args.out / "vectordb"
    # smoke (the test suite's): two placements of a tiny generated set, one round
    ds = load(SMOKE_SET if args.smoke else "debian-minilm", out / "data")
    if ds is None:
        print("debian-minilm is absent (../shared/data/debian-minilm): nothing to measure")
        return
    inf = float("inf")
    pairs = [(4, 1.5), (2, inf)] if args.smoke else [(4, inf), (4, 1.5), (2, inf)]
    if not (args.quick or args.smoke):
        pairs += [(8, inf), (4, 1.25), (4, 2.0), (8, 1.5)]
    settings = [4, 8] if args.smoke else [4, 5, 6, 8, 10, 12, 16]
    rounds = args.rounds or (1 if args.smoke else 2 if args.quick else 5)
    points: dict[tuple[int, int], Point] = {}
    with asyncio.Runner() as runner:
        systems = [_Placement(runner, ds, r, c, out / "spann") for r, c in pairs]
        try:
            for system in systems:  # warm-up
                for value in settings:
                    system.run(value, ds.queries, 10)
            for r in range(rounds):
                for system in systems:
                    for value in settings:
                        ids, wall_s, io = system.run(value, ds.queries, 10)
                        key = (system.tag, value)
                        point = points.setdefault(
                            key, Point(system.name, "max_postings", value, 0.0, len(ds.queries))
                        )
                        point.add_round(wall_s, recall_at(ids, ds.gt, 10), io)
                        log(f"round {r + 1}: {system.name} max_postings={value} done")
            disk = {s.tag: _list_mib(s.stats) for s in systems}
        finally:
            for system in systems:
                system.close()
    print("| placement | max_postings | recall@10 | QPS median (min-max) | KiB read/query |")
    print("|---|---|---|---|---|")
    for (tag, value), p in sorted(points.items()):
        low, high = p.qps_range
        kib = p.io.get("bytes", float("nan")) / 1024
        print(f"| {tag} | {value} | {p.recall:.4f} | {p.qps:,.0f} ({low:,.0f}-{high:,.0f}) | "
              f"{kib:.0f} |")  # fmt: skip
    headline = {}
    for system in systems:
        mine = [p for (tag, _), p in points.items() if tag == system.tag]
        found = qps_at_recall(mine)
        headline[system.tag] = None if found is None else round(found, 1)
    print(f"\nQPS at recall@10 >= 0.9 (r: replicas, c: closure): {headline}")
    print(f"list pages in use: {disk}")
    print(json.dumps({"qps_at_recall_0_9": headline}))


if __name__ == "__main__":
    main()
