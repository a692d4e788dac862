r"""Load benchmark of the REST vector search service (issue 16) against its in-process peers.

Systems, each in a process of its own, one after another (_peers.py):

* ``http``: ``python -m tierkit serve`` on a loopback port (its own process), loaded by a
  closed-loop async HTTP/1.1 client in another process (_worker.py, _loadgen.py, _http.py);
* ``inprocess``: our collection (``vectordb.collections``) called in-process, on a copy of the
  service's own data folder: the ceiling, without HTTP;
* ``index_bulk``: ``vectordb.SpannIndex`` bulk-built and called in-process (a reference: the
  REST API has no bulk build; its points arrive as upserts);
* ``milvus_lite``: pymilvus ``MilvusClient`` on a milvus-lite file (its default index);
* ``qdrant_local``: qdrant-client local mode (``QdrantClient(path=...)``).

Cells: concurrency 1, 8 and 64 (callers each with one single-vector query in flight; threads
for the blocking peers, asyncio tasks in-process, keep-alive connections over HTTP), query-only
(``query_cN``) and 90/10 query/upsert (``mix_cN``: one new point per upsert, ``wait=true``).
Each cell: a warm-up, then a fixed window; QPS, p50, p99, recall@10 of the answers against the
exact top-10, errors (non-200 or exceptions), and the CPU cores each process used.

Every system opens its own files: a build (cached under benchmarks/out/server/builds/, redone
when the code it depends on changes) is copied to a scratch folder, dropped from the page cache,
and opened by the measuring process; each round starts again from a fresh copy. Rounds
interleave the systems; the table gives medians and the min-max spread. The full mode ends with
a soak: 10 minutes of the 90/10 mix at concurrency 8 over HTTP, the server's memory sampled
every 5 s from /proc/<pid>/status. Each growth is the median of the last minute vs the first
sample after the warm-up, in percent:

* ``rss_growth_pct``: VmRSS, all the server's resident pages (the issue's key);
* ``rss_anon_growth_pct``: RssAnon, its anonymous pages (heap, arrays, Python objects): where
  a leak or an unbounded cache shows;
* ``rss_file_growth_pct``: RssFile, pages of mapped files it touched: its libraries (~130 MiB
  of torch, llvmlite and others, constant) and LMDB's maps, the point store's growing with the
  points (new records, and reads of them); clean pages the kernel drops under pressure.

Each also from the soak's half-way sample (``*_growth_second_half_pct``): growth that levels off
after a warm-up (a cache filling: LMDB's pages, the C heap reaching its working size) shows
much less there than over the whole window; a steady leak shows about half of it.

``points_upserted`` is how many new points the soak's window added (``points_growth_pct`` of
the ``points_before``): part of any growth is the data growing, not a leak. With
``--soak-overwrite`` the soak's upserts overwrite existing points instead (ids cycling through
the base set), so the store keeps its size and what grows is not the data.

Data: debian-minilm from ../shared (62,440 x 384, 500 queries); without it a generated 20k x
128 clustered set, said so in ``dataset``. Tables go to stdout, progress to stderr; the last line
is one JSON object (the issue's keys, ``systems``, ``machine``, ``mode``, ``dataset``).

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.server.load --quick   # ~3 min
    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.server.load           # ~45 min

``--smoke`` (the test suite's): a tiny generated set, a fraction of a second per cell.
``--skip milvus_lite,qdrant_local`` drops systems.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common.paths import OUT_DIR, REPO_ROOT
from benchmarks.common.scratch import remove_at_exit
from benchmarks.server import _report as report
from benchmarks.server._builds import cached_build, fresh_copy
from benchmarks.server._dataset import load as load_data
from benchmarks.server._dataset import write_manifest
from benchmarks.server._service import Server, env, serve_available

SYSTEMS = ("http", "inprocess", "index_bulk", "milvus_lite", "qdrant_local")
PAIRED = ("http", "inprocess")
_ALL = "query:1,query:8,query:64,mix:1,mix:8,mix:64"


@dataclass(frozen=True)
class Plan:
    cells: dict[str, str]  # per system
    warmup_s: float
    duration_s: float
    rounds: int
    soak_s: float  # 0: no soak
    # the service and its in-process ceiling get at least this many rounds, which of them goes
    # first alternating (A B B A), so the c64 ratio's two sides see like load
    paired_rounds: int = 0

    def rounds_of(self, system: str, rounds: int) -> int:
        return max(rounds, self.paired_rounds) if system in PAIRED else rounds

    @property
    def soak_warmup_s(self) -> float:
        return min(30.0, 0.1 * self.soak_s)


QUICK = Plan(
    {
        "http": _ALL,
        "inprocess": _ALL,
        "index_bulk": "query:1,query:8,query:64",
        "milvus_lite": "query:1,query:8,query:64,mix:8",
        "qdrant_local": "query:1,query:8,query:64,mix:8",
    },
    1.5,
    4.0,
    1,
    0.0,
    paired_rounds=2,
)
FULL = Plan({s: _ALL for s in SYSTEMS}, 3.0, 15.0, 3, 600.0)
SMOKE = Plan(
    {
        "http": "query:8,query:64,mix:8",
        "inprocess": "query:64",
        "index_bulk": "",  # not in the smoke run
        "milvus_lite": "query:8",
        "qdrant_local": "query:8",
    },
    0.2,
    0.5,
    1,
    0.0,
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_worker(args: list[str], timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.server._worker", *args]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env(), stdout=subprocess.PIPE, text=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": f"worker killed after {timeout_s:.0f} s"}
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": f"worker exit status {proc.returncode}, no result line"}
    reply: dict[str, Any] = json.loads(lines[-1])
    return reply


def _cell_budget_s(plan: Plan, cells: str) -> float:
    return 180.0 + len(cells.split(",")) * (plan.warmup_s + plan.duration_s + 10.0)


def measure(
    system: str,
    source: Path,
    scratch: Path,
    manifest: Path,
    plan: Plan,
    cells: str,
    n_base: int,
    log_level: str | None,
    rss_every_s: float = 0.0,
    warmup_s: float | None = None,
    duration_s: float | None = None,
    id_wrap: int = 0,
) -> dict[str, Any]:
    """One round of ``system`` from a fresh copy of its build (``id_wrap`` > 0: its upserts
    overwrite existing points instead of adding new ones)."""
    where = fresh_copy(source, scratch / system)
    args = ["--system", system, "--manifest", str(manifest), "--cells", cells]
    args += ["--warmup-s", str(warmup_s or plan.warmup_s)]
    args += ["--duration-s", str(duration_s or plan.duration_s), "--id-start", str(n_base)]
    args += ["--rss-every-s", str(rss_every_s), "--id-wrap", str(id_wrap)]
    budget = _cell_budget_s(plan, cells) + (duration_s or 0.0) + (warmup_s or 0.0)
    if system != "http":
        return run_worker([*args, "--dir", str(where)], budget)
    server = Server(where / "data", log_level)
    try:
        reply = run_worker(
            [*args, "--port", str(server.port), "--server-pid", str(server.pid)], budget
        )
    finally:
        status = server.stop()
    reply["server"] = {"ready_s": round(server.ready_s, 2), "exit_status": status}
    if any(cell["errors"] for cell in reply.get("results", [])):
        reply["server"]["log_tail"] = server.log_tail(1500)  # the scratch folder goes
    if "error" in reply:
        reply["error"] += f"; server log: {server.log_tail(300)}"
    return reply


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load1 = os.getloadavg()[0]
    return (
        f"{platform.system()} {platform.release()}, nproc={os.cpu_count()}, {model}, "
        f"load1 at start {load1:.2f}, Python {platform.python_version()}"
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="REST service load benchmark (issue 16)")
    parser.add_argument("--quick", action="store_true", help="one round, short cells, no soak")
    parser.add_argument("--smoke", action="store_true", help="tiny generated set (tests)")
    parser.add_argument("--skip", default="", help=f"comma-separated: {', '.join(SYSTEMS)}")
    parser.add_argument("--rounds", type=int, help="override the mode's rounds")
    parser.add_argument("--soak-s", type=float, help="override the soak's seconds (0: none)")
    parser.add_argument(
        "--soak-overwrite",
        action="store_true",
        help="the soak's upserts overwrite existing points (the store stays the same size)",
    )
    parser.add_argument("--server-log-level", help="TIERKIT_LOG_LEVEL for the server")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument(
        "--reuse-stale-builds",
        action="store_true",
        help="reuse the last build even when the code it depends on changed (said in notes)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    if args.soak_s is not None:
        plan = dataclasses.replace(plan, soak_s=args.soak_s)
    rounds = args.rounds or plan.rounds
    skip = set(filter(None, args.skip.split(",")))
    systems = [s for s in SYSTEMS if s not in skip and plan.cells[s]]
    started = time.time()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "vectordb", "tiers", "server"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    data = load_data(mode)
    log(f"dataset {data.name}: {data.note}")
    root = args.out / "server"
    manifest = write_manifest(data, root / "work" / data.name, upserts=20_000)
    scratch = remove_at_exit(root / "scratch")
    notes: list[str] = []
    results: dict[str, Any] = {}
    sources: dict[str, Path] = {}
    build_s: dict[str, Any] = {}
    for system in systems:
        why = serve_available() if system == "http" else None
        if system == "inprocess" and "http" in sources:
            sources[system], build_s[system] = sources["http"], "shared with http"
            continue  # the same folder the service opens, copied
        if why is None:
            try:
                sources[system], build_s[system], note = cached_build(
                    system,
                    data,
                    manifest,
                    root / "builds",
                    args.server_log_level,
                    args.reuse_stale_builds,
                )
                notes += [note] if note else []
                continue
            except Exception as exc:  # a peer that cannot run here: said so, not a crash
                why = f"build failed: {type(exc).__name__}: {exc}"[:400]
        log(f"{system}: unavailable: {why}")
        results[system] = {"error": why}
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sources}
    total_rounds = max(plan.rounds_of(s, rounds) for s in runs) if runs else 0
    for round_index in range(total_rounds):
        order = list(runs) if round_index % 2 == 0 else list(reversed(runs))
        for system in order:
            if system not in runs or round_index >= plan.rounds_of(system, rounds):
                continue  # dropped after an error, or its rounds are done
            log(f"=== round {round_index + 1}/{total_rounds}: {system}")
            reply = measure(
                system,
                sources[system],
                scratch,
                manifest,
                plan,
                plan.cells[system],
                len(data.base),
                args.server_log_level,
            )
            if "error" in reply:
                log(f"{system}: failed: {reply['error']}")
                results[system] = {"error": reply["error"]}
                del runs[system]
                continue
            runs[system].append(reply)
    for system, replies in runs.items():
        results[system] = {
            "cells": report.summarise(replies),
            "open_s": [round(r["open_s"], 2) for r in replies],
            "build_s": build_s[system],
            "facts": replies[0]["facts"],
            "load1": [r["load1"] for r in replies],
            **({"server": [r["server"] for r in replies]} if system == "http" else {}),
        }
    soak = None
    if plan.soak_s and "http" in runs:
        log(f"=== soak: mix_c8 over HTTP for {plan.soak_s:.0f} s")
        reply = measure(
            "http",
            sources["http"],
            scratch,
            manifest,
            plan,
            "mix:8",
            len(data.base),
            args.server_log_level,
            rss_every_s=5.0,
            warmup_s=plan.soak_warmup_s,
            duration_s=plan.soak_s,
            id_wrap=len(data.base) if args.soak_overwrite else 0,
        )
        if "error" in reply:
            soak = {"error": reply["error"]}
        else:
            soak = report.soak_figures(reply["results"][0], plan.soak_s, len(data.base))
            if args.soak_overwrite:  # the upserts replaced points: the store kept its size
                soak.update(upserts="overwrite", points_upserted=0, points_growth_pct=0.0)
    keys = report.headline(results, soak)
    notes += [
        "each system opens a fresh copy of its build, dropped from the page cache first "
        "(posix_fadvise DONTNEED); the warm-up then runs before the window",
        f"client and server share {os.cpu_count()} vCPUs: cpu_cores says what each used",
    ]
    print(f"## REST service load benchmark ({mode}, {data.name})\n")
    print(report.table_markdown(results) + "\n")
    out = {
        **keys,
        "targets": report.verdicts(keys),
        "systems": results,
        "soak": soak,
        "machine": machine(),
        "mode": mode,
        "rounds": rounds,
        "paired_rounds": max(rounds, plan.paired_rounds),
        "window_s": plan.duration_s,
        "warmup_s": plan.warmup_s,
        "dataset": data.describe(),
        "code": head,
        "uncommitted": [line[3:] for line in dirty if line.strip()],  # measured code beside HEAD
        "notes": notes,
        "wall_s": round(time.time() - started, 1),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if scratch.exists():
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    main()
