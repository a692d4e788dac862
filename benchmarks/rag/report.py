"""The RAG benchmark's summaries: one row per configuration, the ratio against prefix caching
by replay length (cold misses vs steady state), and the sweep's pick of a default.

- ``row``: medians over rounds with the (min-max) spread (with one long round: the median
  of the whole replay and the spread of its quarters' medians); quality and per-request
  tokens from the first round (both deterministic: every round computes the same tokens).
- ``by_length``: chunk-cache tokens over prefix caching's, cumulative over the first 1/8,
  1/4, 1/2 and all of the replay, and per quarter (the last quarter is the steady state: by
  then most chunks asked for have been seen), and over the requests whose every chunk was
  seen before (the rule's own cost, cold misses out), beside the floor any chunk cache has
  there (the question plus each chunk at its first sight, over prefix caching's tokens).
- ``pick``: the configuration computing the fewest tokens with top-1 >= 0.98 and mean KL at
  most ``kl_share`` of pure reuse's (no recompute at all: "chunk-start" at fraction 0), so a
  default must earn its recompute in quality, not only pass a top-1 bar every configuration
  passes on this small model.

Thread-safety: free functions over finished results.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.common.measure import spread
from benchmarks.rag.runners import ReplayResult

__all__ = ["by_length", "pick", "print_table", "row"]

TOP1_TARGET = 0.98
PURE_REUSE = ("chunk", 0.0, "chunk-start")


def row(results: list[ReplayResult], blocks: int = 0) -> dict[str, Any]:
    """One configuration over its rounds; with one round and ``blocks``, the TTFT spread is
    over the medians of that many consecutive parts of the replay (the median is the whole
    replay's)."""
    tokens = [sum(r.tokens_computed) for r in results]
    ttft = [statistics.median(r.ttft_s) for r in results]
    parts = ttft
    if len(results) == 1 and blocks > 1 and len(results[0].ttft_s) >= blocks:
        times = results[0].ttft_s
        parts = [statistics.median(times[b * len(times) // blocks : (b + 1) * len(times) // blocks])
                 for b in range(blocks)]  # fmt: skip
    first = results[0]
    waits = first.load_wait_s or [0.0]
    return {
        "name": first.name,
        "tokens": statistics.median(tokens),
        "per_request": first.tokens_computed,
        "ttft_s": statistics.median(ttft),
        "ttft_spread": spread([t * 1e3 for t in ttft], ".2f")
        if parts is ttft
        else f"{statistics.median(ttft) * 1e3:.2f} ({min(parts) * 1e3:.2f}-{max(parts) * 1e3:.2f})",
        "ttft_parts_ms": [round(t * 1e3, 2) for t in parts],
        "rounds": len(results),
        "top1": statistics.fmean(first.top1) if first.top1 else float("nan"),
        "kl": statistics.fmean(first.kl) if first.kl else float("nan"),
        "compared": len(first.top1),
        "reused_requests": first.reused_requests,
        "reused_tokens": first.reused_tokens,
        "exact_tokens": first.exact_tokens,
        "load_wait_ms": statistics.median(waits) * 1e3,
        "load_wait_p90_ms": sorted(waits)[int(0.9 * (len(waits) - 1))] * 1e3,
        "requests": len(first.tokens_computed),
    }


def print_table(rows: Sequence[dict[str, Any]], total_tokens: int, prefix_tokens: float) -> None:
    print(f"{'configuration':<30} {'tokens':>10} {'/ none':>7} {'/ prefix':>8} "
          f"{'TTFT ms median (spread)':>26} {'rnds':>4} {'top-1':>7} {'KL nats':>9} "
          f"{'wait ms':>7} {'reused':>9}")  # fmt: skip
    for r in rows:
        print(
            f"{r['name']:<30} {r['tokens']:>10.0f} {r['tokens'] / total_tokens:>7.3f} "
            f"{r['tokens'] / prefix_tokens:>8.3f} {r['ttft_spread']:>26} {r['rounds']:>4} "
            f"{r['top1']:>7.4f} {r['kl']:>9.2e} {r['load_wait_ms']:>7.2f} "
            f"{r['reused_requests']:>4}/{r['requests']}"
        )


def by_length(
    chunk: Sequence[float], prefix: Sequence[float], cold: Sequence[int], warm: Sequence[bool]
) -> dict[str, dict[str, float]]:
    """Ratios (chunk cache / prefix caching, floor / prefix caching) by replay length, and
    over the ``warm`` requests alone (every chunk seen before: the rule's own cost); see the
    module docstring."""
    n = len(prefix)
    out: dict[str, dict[str, float]] = {}
    for share, label in ((8, "first 1/8"), (4, "first 1/4"), (2, "first 1/2"), (1, "all")):
        out[label] = _ratio(chunk, prefix, cold, range(max(1, n // share)))
    for quarter in range(4):
        begin, end = quarter * n // 4, max(quarter * n // 4 + 1, (quarter + 1) * n // 4)
        out[f"quarter {quarter + 1}"] = _ratio(chunk, prefix, cold, range(begin, end))
    out["warm only"] = _ratio(chunk, prefix, cold, [i for i in range(n) if warm[i]])
    return out


def _ratio(
    chunk: Sequence[float], prefix: Sequence[float], cold: Sequence[int], rows: Sequence[int]
) -> dict[str, float]:
    base = sum(prefix[i] for i in rows) or 1.0
    return {
        "requests": len(rows),
        "ratio": round(sum(chunk[i] for i in rows) / base, 4),
        "floor": round(sum(cold[i] for i in rows) / base, 4),
    }


def pick(rows: dict[tuple[str, float, str], dict[str, Any]], kl_share: float) -> Any:
    """(the picked (kind, fraction, rule), the KL bound) or (None, bound); see the module
    docstring."""
    pure = rows.get(PURE_REUSE)
    bound = kl_share * pure["kl"] if pure is not None else float("inf")
    meeting = [
        (r["tokens"], config)
        for config, r in rows.items()
        if config[0] == "chunk" and r["top1"] >= TOP1_TARGET and r["kl"] <= bound
    ]
    return (min(meeting)[1] if meeting else None), bound
