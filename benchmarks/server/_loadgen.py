"""The closed-loop load every system gets, and the /proc readings beside it.

``run_cell`` keeps ``concurrency`` callers busy: each sends one single-vector query (or, in the
90/10 mix, every tenth operation overall is an upsert of one new point) and sends the next as
soon as the answer is back. Queries go round-robin over the query set. The warm-up lasts
``warmup_s`` and until every caller has had an answer (a slow system at concurrency 64 needs
that long to reach its steady state; at most ``MAX_EXTRA_WARMUP_S`` more); then a window of
``duration_s`` opens: what completes inside it is counted (QPS, latency percentiles,
errors); CPU seconds of the watched processes (the server and this process, from
/proc/<pid>/stat) are read at both edges, and the memory of the first watched process
(``MEMORY_FIELDS`` of /proc/<pid>/status) is sampled every ``rss_every_s`` when asked (the
soak). When the window closes the callers finish the request in hand and stop; those last
answers are not counted.

``Ops`` hides the system: HTTP calls, our index in-process, or a peer's Python API (blocking
calls run on a thread pool of ``concurrency`` threads).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from benchmarks.server._dataset import recall

_TICKS = os.sysconf("SC_CLK_TCK")
UPSERT_EVERY = 10  # the mix: one upsert in ten operations
MAX_EXTRA_WARMUP_S = 60.0


class Ops(Protocol):
    async def query(self, slot: int, row: int) -> np.ndarray: ...  # ids of the top 10

    async def upsert(self, slot: int, point_id: int, row: int) -> None: ...


@dataclass(frozen=True)
class Cell:
    mix: str  # "query" (query-only) or "mix" (90/10 query/upsert)
    concurrency: int

    @property
    def key(self) -> str:
        return f"{self.mix}_c{self.concurrency}"

    @classmethod
    def parse(cls, text: str) -> list[Cell]:
        """``"query:1,query:8,mix:8"`` -> cells."""
        cells = []
        for item in filter(None, text.split(",")):
            mix, _, conc = item.partition(":")
            if mix not in ("query", "mix"):
                raise ValueError(f"unknown mix {mix!r}")
            cells.append(cls(mix, int(conc)))
        return cells


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads) so far."""
    with open(f"/proc/{pid}/stat", "rb") as stream:
        fields = stream.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)


# /proc/<pid>/status lines sampled in the soak, in the order of a sample's columns after its time
MEMORY_FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


def proc_memory_bytes(pid: int) -> tuple[int, ...]:
    """VmRSS, RssAnon, RssFile, RssShmem of ``pid`` in bytes (0 where the kernel lacks one).
    VmRSS alone cannot tell a leak (anonymous pages) from mapped file pages the process touched
    (LMDB's map), which the kernel reclaims under pressure."""
    found = dict.fromkeys(MEMORY_FIELDS, 0)
    with open(f"/proc/{pid}/status", "rb") as stream:
        for line in stream.read().decode().splitlines():
            name, _, value = line.partition(":")
            if name in found:
                found[name] = int(value.split()[0]) * 1024  # the kernel writes kB
    return tuple(found[name] for name in MEMORY_FIELDS)


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (a server may fork workers)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stream:
                ppid = int(stream.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(parents.get(current, []))
    return found


def tree_cpu_s(pid: int) -> float:
    total = 0.0
    for each in descendants(pid):
        try:
            total += proc_cpu_s(each)
        except OSError:
            continue  # gone in between
    return total


@dataclass
class _Tally:
    window: tuple[float, float] = (float("inf"), float("inf"))
    stop: bool = False
    ops: int = 0
    query_ms: list[float] = field(default_factory=list)
    upserts: int = 0
    upsert_ms: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    found: dict[int, np.ndarray] = field(default_factory=dict)
    answered: set[int] = field(default_factory=set)  # callers with an answer (or error) back


async def _caller(ops: Ops, slot: int, cell: Cell, tally: _Tally, n_q: int, ids: Any) -> None:
    n_up = ids["rows"]
    while not tally.stop:
        n = tally.ops
        tally.ops += 1
        is_upsert = cell.mix == "mix" and n % UPSERT_EVERY == UPSERT_EVERY - 1
        began = time.perf_counter()
        try:
            if is_upsert:
                # "wrap" > 0: ids cycle through the existing points (a steady-state store)
                point = ids["next"] % ids["wrap"] if ids.get("wrap") else ids["next"]
                ids["next"] += 1
                await ops.upsert(slot, point, point % n_up)
            else:
                found = await ops.query(slot, n % n_q)
        except Exception as exc:  # an error is a figure, not the end of the run
            ended = time.perf_counter()
            if tally.window[0] <= ended <= tally.window[1]:
                tally.errors += 1
                tally.first_error = tally.first_error or f"{type(exc).__name__}: {exc}"[:300]
            tally.answered.add(slot)
            await asyncio.sleep(0.001)  # a refusing server must not become a busy loop
            continue
        ended = time.perf_counter()
        tally.answered.add(slot)
        if not tally.window[0] <= ended <= tally.window[1]:
            continue
        if is_upsert:
            tally.upserts += 1
            tally.upsert_ms.append((ended - began) * 1e3)
        else:
            tally.query_ms.append((ended - began) * 1e3)
            tally.found.setdefault(n % n_q, found)


async def run_cell(
    ops: Ops,
    cell: Cell,
    gt: np.ndarray,
    warmup_s: float,
    duration_s: float,
    watch: dict[str, int],
    upsert_ids: dict[str, int],
    rss_every_s: float = 0.0,
) -> dict[str, Any]:
    """One measured cell; ``watch`` names the pids whose CPU (process tree) is read.
    ``upsert_ids``: ``{"next": first new id, "rows": upsert vectors, "wrap": 0 or the ids to
    cycle through (overwrites)}``, advanced in place."""
    tally = _Tally()
    rss: list[tuple[float, ...]] = []  # (seconds, *MEMORY_FIELDS)
    callers = [
        asyncio.create_task(_caller(ops, slot, cell, tally, len(gt), upsert_ids))
        for slot in range(cell.concurrency)
    ]
    started = time.perf_counter()
    first = next(iter(watch.values()))

    def sample_rss() -> None:  # every rss_every_s, through the warm-up too
        now = time.perf_counter() - started
        if rss_every_s and (not rss or now - rss[-1][0] >= rss_every_s):
            rss.append((now, *proc_memory_bytes(first)))

    try:
        limit = started + warmup_s + MAX_EXTRA_WARMUP_S
        while time.perf_counter() < started + warmup_s or (
            len(tally.answered) < cell.concurrency and time.perf_counter() < limit
        ):
            sample_rss()
            await _sleep_or_raise(callers, 0.05)
        cpu0 = {name: tree_cpu_s(pid) for name, pid in watch.items()}
        opened = time.perf_counter()
        tally.window = (opened, opened + duration_s)
        while time.perf_counter() < opened + duration_s:
            sample_rss()
            left = opened + duration_s - time.perf_counter()
            await _sleep_or_raise(callers, max(0.0, min(0.5, left)))
        closed = time.perf_counter()
        cpu1 = {name: tree_cpu_s(pid) for name, pid in watch.items()}
    finally:
        tally.stop = True
        await asyncio.gather(*callers, return_exceptions=True)
    elapsed = closed - opened
    lat = np.asarray(tally.query_ms)
    out: dict[str, Any] = {
        "cell": cell.key,
        "warmup_s": round(opened - started, 2),
        "window_s": round(elapsed, 3),
        "qps": len(lat) / elapsed,
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
        "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
        "queries": len(lat),
        "upserts": tally.upserts,
        "upserts_per_s": tally.upserts / elapsed,
        "upsert_p99_ms": float(np.percentile(tally.upsert_ms, 99)) if tally.upsert_ms else None,
        "errors": tally.errors,
        "first_error": tally.first_error or None,
        "recall_at_10": recall(tally.found, gt),
        "cpu_s": {name: round(cpu1[name] - cpu0[name], 2) for name in watch},
    }
    if rss_every_s:
        out["rss"] = [(round(row[0], 1), *row[1:]) for row in rss]
    return out


async def _sleep_or_raise(callers: list[asyncio.Task[None]], seconds: float) -> None:
    """Sleep, but a caller that died (a bug in the harness, not a counted error) ends the run."""
    done, _ = await asyncio.wait(callers, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        task.result()
    if done:
        raise RuntimeError("a load caller stopped before the window closed")


def rss_growth_pct(samples: list[tuple[float, int]], warmup_s: float) -> float | None:
    """Median of the last minute vs the first sample after the warm-up, in percent
    (``samples``: (seconds, bytes) of one of the MEMORY_FIELDS)."""
    after = [b for t, b in samples if t >= warmup_s]
    if len(after) < 2 or not after[0]:  # RssShmem is 0 here: no growth to speak of
        return None
    end_t = samples[-1][0]
    last = [b for t, b in samples if t >= end_t - 60.0] or after[-1:]
    return (float(np.median(last)) - after[0]) / after[0] * 100.0
