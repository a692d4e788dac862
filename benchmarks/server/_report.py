"""Tables and headline keys of the load benchmark, from the workers' per-cell results.

Each (system, cell) has one result per round; the table shows the median QPS with its
min-max spread, the median p50 / p99, the lowest recall@10, the errors summed, and the CPU
cores each process used in the window (CPU seconds / window seconds: on 2 vCPUs the HTTP
client and the server share the cores, which caps them both).
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.server._loadgen import MEMORY_FIELDS, rss_growth_pct

TARGETS = {
    "http_vs_inprocess_c64": (">=", 0.7),
    "http_qps_vs_milvus_lite_c8": (">=", 5.0),
    "recall_at_10": (">=", 0.9),
    "errors": ("<=", 0),
    "rss_growth_pct": ("<=", 10.0),
}
SYSTEM_ORDER = ("http", "inprocess", "milvus_lite", "qdrant_local")


def _median(values: list[float]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's cells over its rounds: ``{cell: figures}``."""
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for result in run["results"]:
            by_cell.setdefault(result["cell"], []).append(result)
    table: dict[str, Any] = {}
    for cell, results in by_cell.items():
        qps = [r["qps"] for r in results]
        recalls = [r["recall_at_10"] for r in results if r["recall_at_10"] is not None]
        cores: dict[str, float | None] = {}
        for name in results[0]["cpu_s"]:
            cores[name] = _median([r["cpu_s"][name] / r["window_s"] for r in results])
        row: dict[str, Any] = {
            "qps": _median(qps),
            "qps_range": [min(qps), max(qps)],
            "p50_ms": _median([r["p50_ms"] for r in results]),
            "p99_ms": _median([r["p99_ms"] for r in results]),
            "recall_at_10": min(recalls) if recalls else None,
            "errors": sum(r["errors"] for r in results),
            "cpu_cores": {k: round(v, 2) if v is not None else None for k, v in cores.items()},
            "rounds": len(results),
        }
        if cell.startswith("mix"):
            row["upserts_per_s"] = _median([r["upserts_per_s"] for r in results])
            row["upsert_p99_ms"] = _median([r["upsert_p99_ms"] for r in results])
        errors = [r["first_error"] for r in results if r["first_error"]]
        if errors:
            row["first_error"] = errors[0]
        table[cell] = row
    return table


def _get(table: dict[str, Any], system: str, cell: str, key: str) -> Any:
    return table.get(system, {}).get("cells", {}).get(cell, {}).get(key)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def headline(systems: dict[str, Any], soak: dict[str, Any] | None) -> dict[str, Any]:
    http = systems.get("http", {}).get("cells", {})
    recalls = [row["recall_at_10"] for cell, row in http.items() if cell.startswith("query")]
    recalls = [r for r in recalls if r is not None]
    errors = sum(row["errors"] for row in http.values()) if http else None
    if soak is not None and errors is not None:
        errors += soak.get("errors", 0)
    qps64 = _get(systems, "http", "query_c64", "qps")
    qps8 = _get(systems, "http", "query_c8", "qps")
    return {
        "http_qps_c64": qps64,
        "http_vs_inprocess_c64": _ratio(qps64, _get(systems, "inprocess", "query_c64", "qps")),
        "http_p99_ms_c8": _get(systems, "http", "query_c8", "p99_ms"),
        "http_qps_vs_milvus_lite_c8": _ratio(qps8, _get(systems, "milvus_lite", "query_c8", "qps")),
        "http_qps_vs_qdrant_local_c8": _ratio(
            qps8, _get(systems, "qdrant_local", "query_c8", "qps")
        ),
        "recall_at_10": min(recalls) if recalls else None,
        "errors": errors,
        "rss_growth_pct": soak.get("rss_growth_pct") if soak else None,
        # beside the key: which part grew (anonymous: a leak would show there)
        "rss_anon_growth_pct": soak.get("rss_anon_growth_pct") if soak else None,
        "rss_file_growth_pct": soak.get("rss_file_growth_pct") if soak else None,
        # from the soak's half-way sample: whether the growth levels off after a warm-up
        "rss_growth_second_half_pct": soak.get("rss_growth_second_half_pct") if soak else None,
        "rss_anon_growth_second_half_pct": (
            soak.get("rss_anon_growth_second_half_pct") if soak else None
        ),
    }


def soak_figures(cell: dict[str, Any], seconds: float, points_before: int) -> dict[str, Any]:
    """The soak's JSON from its one cell: load figures, the memory series in MiB per
    MEMORY_FIELDS column, each one's growth, and the points the window added."""
    soak = {k: cell[k] for k in ("qps", "p50_ms", "p99_ms", "errors", "upserts_per_s")}
    soak["seconds"], soak["warmup_s"] = seconds, cell["warmup_s"]
    # the growth is measured from the first sample after the warm-up: the window's upserts
    soak["points_before"], soak["points_upserted"] = points_before, cell["upserts"]
    soak["points_growth_pct"] = round(cell["upserts"] / max(points_before, 1) * 100.0, 1)
    rows = cell["rss"]
    for column, name in enumerate(MEMORY_FIELDS, 1):
        key = _SOAK_KEYS[name]
        series = [(row[0], row[column]) for row in rows]
        soak[f"{key}_mib"] = [(t, round(b / 2**20, 1)) for t, b in series]
        soak[f"{key}_growth_pct"] = rss_growth_pct(series, cell["warmup_s"])
        # the same from half-way: a leak keeps growing, a cache filling levels off
        half_s = cell["warmup_s"] + seconds / 2
        soak[f"{key}_growth_second_half_pct"] = rss_growth_pct(series, half_s)
    return soak


_SOAK_KEYS = {"VmRSS": "rss", "RssAnon": "rss_anon", "RssFile": "rss_file", "RssShmem": "rss_shmem"}


def verdicts(keys: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, (op, bound) in TARGETS.items():
        value = keys.get(key)
        if value is None:
            out[key] = "not measured"
        else:
            good = value >= bound if op == ">=" else value <= bound
            out[key] = f"{'met' if good else 'MISSED'} ({op} {bound})"
    return out


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def table_markdown(systems: dict[str, Any]) -> str:
    lines = [
        "| system | cell | QPS (median) | QPS min-max | p50 ms | p99 ms | recall@10 "
        "| errors | upserts/s | CPU cores used |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for system in SYSTEM_ORDER:
        entry = systems.get(system)
        if entry is None:
            continue
        if "error" in entry:
            lines.append(f"| {system} | unavailable: {entry['error'][:120]} |||||||||")
            continue
        for cell, row in entry["cells"].items():
            spread = f"{row['qps_range'][0]:,.0f}-{row['qps_range'][1]:,.0f}"
            cores = ", ".join(f"{k} {_fmt(v, 2)}" for k, v in row["cpu_cores"].items())
            lines.append(
                f"| {system} | {cell} | {_fmt(row['qps'], 0)} | {spread} | "
                f"{_fmt(row['p50_ms'], 2)} | {_fmt(row['p99_ms'], 2)} | "
                f"{_fmt(row['recall_at_10'], 3)} | {row['errors']} | "
                f"{_fmt(row.get('upserts_per_s'), 0) if 'upserts_per_s' in row else ''} | "
                f"{cores} |"
            )
    return "\n".join(lines)
