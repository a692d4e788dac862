"""The tenancy benchmark's scoring, tables and headline keys.

Every worker's ids are scored here, against the ground truth (recall@10: |found ∩ exact top-10
among the tenant's documents| / min(10, the tenant's documents)) and against the access model
(a leak: a result the row's tenant may not read). QPS: rows / wall seconds of the class's one
batch call (``batch``), or rows / summed latencies of one-query calls (``single``). "small"
joins the two classes under 1%; "all" every class (rows / summed walls). QPS at recall 0.9 as
in the spann benchmark (_common.qps_at_recall: log-QPS interpolated along the knob's curve).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.vectordb._common import Point, fmt_bytes, qps_at_recall
from benchmarks.vectordb._tenancy_data import CLASSES, TenantSet, count_leaks, tenant_recalls

GROUPS = {**{name: (i,) for i, name in enumerate(CLASSES)}, "small": (0, 1), "all": (0, 1, 2)}
TARGETS = {  # key: (comparison, bound), from issue 15
    "tenant_recall_at_10": (">=", 0.9),
    "tenant_recall_at_10_min_class": (">=", 0.85),
    "tenant_qps_vs_filtered_ivf_small": (">=", 5.0),
    "tenant_qps_vs_per_tenant": (">=", 0.8),
    "tenant_resident_vs_shared": ("<=", 1.3),
    "grant_us": ("<=", 50.0),
    "revoke_us": ("<=", 50.0),
    "leaks": ("==", 0),
}


@dataclass
class Scored:
    """One system's passes, scored: (mode, value) -> class -> figures."""

    system: str
    knob: str
    figures: dict[str, Any]
    peak_rss_bytes: int
    cells: dict[tuple[str, str], dict[int, dict[str, float]]] = field(default_factory=dict)
    leaks: int = 0
    failed: str = ""

    def values(self, mode: str) -> list[str]:
        return [value for (m, value) in self.cells if m == mode]

    def group(self, mode: str, value: str, group: str) -> dict[str, float] | None:
        """Recall, QPS, rows of ``value``'s passes over the classes of ``group``."""
        cells = self.cells.get((mode, value), {})
        parts = [cells[c] for c in GROUPS[group] if c in cells and cells[c]["rows"]]
        if not parts:
            return None
        rows = sum(p["rows"] for p in parts)
        wall = sum(p["wall_s"] for p in parts)
        recall = sum(p["recall"] * p["rows"] for p in parts) / rows
        return {"rows": rows, "wall_s": wall, "recall": recall, "qps": rows / wall if wall else 0}

    def qps_at(self, mode: str, group: str, target: float = 0.9) -> float | None:
        points = []
        for value in self.values(mode):
            if value == "default":
                continue  # not on the knob's scale
            figures = self.group(mode, value, group)
            if figures is None:
                continue
            number = float(value)
            point = Point(
                self.system,
                self.knob,
                number if number else float("inf"),
                0.0,
                int(figures["rows"]),
            )
            point.add_round(figures["wall_s"], figures["recall"], {})
            points.append(point)
        return qps_at_recall(points, target) if points else None


def score(
    reply: dict[str, Any], found: dict[str, np.ndarray], ts: TenantSet, keys: np.ndarray
) -> Scored:
    out = Scored(
        reply.get("system", "?"),
        reply.get("knob", "?"),
        reply.get("figures", {}),
        int(reply.get("peak_rss_bytes", 0)),
    )
    n_tenants = ts.n_tenants
    for done in reply.get("passes", []):
        key = f"{done['mode']}|{done['value']}|{done['cls']}"
        ids, rows = found[key], found[key + "|rows"]
        leaks = count_leaks(ids, ts.row_tenant[rows], keys, n_tenants)
        if done["mode"].startswith("read_bound"):
            leaks = 0  # the batch pass's ids again: counted there
        out.leaks += leaks
        recalls = tenant_recalls(ids, ts.gt[rows])
        cell = {
            "rows": float(len(rows)),
            "wall_s": float(done["wall_s"]),
            "recall": float(recalls.mean()) if len(rows) else float("nan"),
            "leaks": float(leaks),
            "cut": float(done.get("cut", 0)),
        }
        if done.get("p50_ms") is not None:
            cell["p50_ms"] = float(done["p50_ms"])
        cell["qps"] = cell["rows"] / cell["wall_s"] if cell["wall_s"] else 0.0
        out.cells.setdefault((done["mode"], str(done["value"])), {})[int(done["cls"])] = cell
    return out


def _num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or value != value else f"{value:.{digits}f}"


def _qps(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"{value:,.0f}"


def passes_table(name: str, systems: list[Scored], mode: str) -> str:
    head = "| system | knob | " + " | ".join(f"recall {c} | QPS {c}" for c in CLASSES)
    head += " | recall all | QPS all | leaks | cut |"
    lines = [
        f"#### {name}: {mode} passes (cold cache per pass; k = 10)\n",
        head,
        "|" + "---|" * (2 + 2 * len(CLASSES) + 4),
    ]
    for system in systems:
        for value in system.values(mode):
            cells = system.cells[(mode, value)]
            row = [system.system, f"{system.knob}={value}"]
            for c in range(len(CLASSES)):
                cell = cells.get(c)
                row += [_num(cell["recall"]), _qps(cell["qps"])] if cell else ["-", "-"]
            total = system.group(mode, value, "all")
            row += [_num(total["recall"]) if total else "-", _qps(total["qps"]) if total else "-"]
            row.append(str(int(sum(c["leaks"] for c in cells.values()))))
            row.append(str(int(sum(c["cut"] for c in cells.values()))))
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def qps_table(name: str, systems: list[Scored]) -> str:
    groups = [*CLASSES, "small", "all"]
    lines = [
        f"#### {name}: QPS at recall@10 >= 0.9 (batch; single = one query per call; "
        "concurrent = the single sample, every query its own call, all awaited at once)\n",
        "| system | " + " | ".join(groups) + " | single all | concurrent all |",
        "|" + "---|" * (len(groups) + 3),
    ]
    for system in systems:
        row = [system.system] + [_qps(system.qps_at("batch", g)) for g in groups]
        row.append(_qps(system.qps_at("single", "all")))
        row.append(_qps(system.qps_at("concurrent", "all")))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def memory_table(name: str, systems: list[Scored], builds: dict[str, float]) -> str:
    lines = [
        f"#### {name}: memory and disk\n",
        "| system | resident | disk | worker peak RSS | build s |",
        "|---|---|---|---|---|",
    ]
    for system in systems:
        fig = system.figures
        build = builds.get(system.system)
        lines.append(
            f"| {system.system} | {fmt_bytes(float(fig.get('resident_bytes', 'nan')))} | "
            f"{fmt_bytes(float(fig.get('disk_bytes', 'nan')))} | "
            f"{fmt_bytes(float(system.peak_rss_bytes))} | {_num(build, 1)} |"
        )
    return "\n".join(lines)


def updates_table(name: str, updates: dict[str, Any]) -> str:
    rows = [
        ("grant, a batch of ids a call (per pair)", "grant_batch_us"),
        ("grant, one id a call", "grant_single_us"),
        ("revoke, a batch of ids a call (per pair)", "revoke_batch_us"),
        ("revoke, one id a call", "revoke_single_us"),
        ("insert with 2 tenants, a batch a call (per vector)", "insert_batch_us"),
        ("insert with a tenant, one a call", "insert_single_us"),
        ("insert without tenancy, a batch a call (per vector)", "plain_insert_batch_us"),
        ("insert without tenancy, one a call", "plain_insert_single_us"),
        ("delete_tenant of the new tenant (all its pairs)", "delete_tenant_us"),
        ("grant, batches: mean of the calls (per pair)", "grant_batch_mean_us"),
        ("tenant search, grants pending (20 queries a call)", "search_with_pending_us"),
        ("checkpoint after the grants (copies them into the tenant's runs)",
         "checkpoint_after_grants_us"),
        ("checkpoint with nothing to settle (after the grants)", "checkpoint_idle_after_grants_us"),
        ("grant: settling at the checkpoint, per pair", "grant_settle_us"),
        ("grant: amortized (batch mean + settling), per pair", "grant_amortized_us"),
        ("checkpoint after the revokes (settles their shortlists)", "checkpoint_after_revokes_us"),
        ("checkpoint with nothing to settle", "checkpoint_idle_us"),
        ("revoke: settling at the checkpoint, per pair", "revoke_settle_us"),
        ("revoke: amortized (batch mean + settling), per pair", "revoke_amortized_us"),
    ]  # fmt: skip
    batch = updates.get("batch")
    lines = [
        f"#### {name}: updates on a copy of the tenancy build (median µs; batches of {batch})\n",
        "| operation | µs |",
        "|---|---|",
    ]
    lines += [f"| {label} | {_num(updates.get(key), 1)} |" for label, key in rows]
    lines.append(
        f"\nleaks after updates: {updates.get('leaks')}, count() mismatches: "
        f"{updates.get('count_errors')}"
    )
    return "\n".join(lines)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def headline(
    systems: dict[str, Scored], updates: dict[str, Any] | None, notes: list[str], name: str
) -> dict[str, Any]:
    """The dataset's keys (issue 15's names)."""
    out: dict[str, Any] = {}
    ours = systems.get("ours")
    default = ours.group("batch", "default", "all") if ours else None
    out["tenant_recall_at_10"] = round(default["recall"], 4) if default else None
    by_class = {}
    for i, cls in enumerate(CLASSES):
        cell = ours.cells.get(("batch", "default"), {}).get(i) if ours else None
        by_class[cls] = round(cell["recall"], 4) if cell else None
    out["tenant_recall_at_10_by_class"] = by_class
    present = [v for v in by_class.values() if v is not None]
    out["tenant_recall_at_10_min_class"] = min(present) if present else None
    out["tenant_qps_default"] = round(default["qps"], 1) if default else None
    ivf = systems.get("faiss_ivf_filter")
    ours_small = ours.qps_at("batch", "small") if ours else None
    ivf_small = ivf.qps_at("batch", "small") if ivf else None
    out["tenant_qps_vs_filtered_ivf_small"] = _ratio(ours_small, ivf_small)
    # the floor under ours: the same recall, only the cold read of what its search read (no
    # CPU at all): the compact twins (as it reads them), and the full float runs instead
    for mode in ("read_bound", "read_bound_f32"):
        bound = ours.qps_at(mode, "small") if ours else None
        out[f"small_{mode}_qps"] = _round(bound)
        out[f"tenant_qps_vs_filtered_ivf_small_{mode}"] = _ratio(bound, ivf_small)
    out["ours_small_qps"], out["filtered_ivf_small_qps"] = _round(ours_small), _round(ivf_small)
    if ivf and ivf_small is None:
        best = max(
            (ivf.group("batch", v, "small") or {"recall": 0.0})["recall"]
            for v in ivf.values("batch")
        )
        notes.append(
            f"{name}: faiss filtered IVF never reached recall 0.9 on tenants under 1% "
            f"(best {best:.3f}); its ratio is n/a"
        )
    peer = systems.get("per_tenant_disk") or systems.get("per_tenant_ram")
    out["per_tenant_peer"] = peer.system if peer else None
    for mode, suffix in (("batch", ""), ("single", "_single")):
        mine = ours.qps_at(mode, "all") if ours else None
        theirs = peer.qps_at(mode, "all") if peer else None
        out[f"tenant_qps_vs_per_tenant{suffix}"] = _ratio(mine, theirs)
    ram = systems.get("per_tenant_ram")
    if ours and ram:
        out["tenant_qps_vs_per_tenant_ram"] = _ratio(
            ours.qps_at("batch", "all"), ram.qps_at("batch", "all")
        )
    plain = systems.get("shared_filter")
    plain_resident = plain.figures.get("index_resident_bytes") if plain else None
    ours_resident = ours.figures.get("resident_bytes") if ours else None
    out["tenant_resident_vs_shared"] = _ratio(ours_resident, plain_resident)
    out["resident_bytes"] = {s.system: s.figures.get("resident_bytes") for s in systems.values()}
    if plain_resident is not None:
        out["resident_bytes"]["ours_without_tenancy"] = plain_resident
    out["disk_bytes"] = {s.system: s.figures.get("disk_bytes") for s in systems.values()}
    if ours:
        for key in ("tenant_resident_bytes", "tenant_disk_bytes", "shortlists"):
            out[key] = ours.figures.get(key)
    out["tenant_disk_vs_shared"] = _ratio(
        ours.figures.get("disk_bytes") if ours else None,
        plain.figures.get("disk_bytes") if plain else None,
    )
    upd = updates or {}
    out["grant_us"] = upd.get("grant_batch_us")
    out["revoke_us"] = upd.get("revoke_batch_us")
    out["insert_us"] = upd.get("insert_batch_us")
    for key in (
        "grant_single_us",
        "revoke_single_us",
        "insert_single_us",
        "delete_tenant_us",
        "checkpoint_after_revokes_us",
        "checkpoint_idle_us",
        "checkpoint_after_grants_us",
        "checkpoint_idle_after_grants_us",
        "search_with_pending_us",
        "pending_after_grants",
        "grant_batch_mean_us",
        "grant_settle_us",
        "grant_amortized_us",
        "revoke_batch_mean_us",
        "revoke_settle_us",
        "revoke_amortized_us",
        "plain_insert_batch_us",
        "plain_insert_single_us",
    ):
        out[key] = upd.get(key)
    out["leaks"] = (ours.leaks + int(upd.get("leaks", 0))) if ours else None
    out["leaks_by_system"] = {s.system: s.leaks for s in systems.values()}
    out["qps_at_recall_0_9"] = {
        s.system: {g: _round(s.qps_at("batch", g)) for g in (*CLASSES, "small", "all")}
        | {"single_all": _round(s.qps_at("single", "all"))}
        | {"concurrent_all": _round(s.qps_at("concurrent", "all"))}
        for s in systems.values()
    }
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def verdicts(keys: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, (how, bound) in TARGETS.items():
        value = keys.get(key)
        if value is None:
            out[key] = "n/a"
            continue
        ok = {">=": value >= bound, "<=": value <= bound, "==": value == bound}[how]
        out[key] = "PASS" if ok else "MISS"
    return out


def verdict_lines(name: str, keys: dict[str, Any], verdict: dict[str, str]) -> str:
    lines = [f"#### {name}: targets (issue 15)\n"]
    for key, (how, bound) in TARGETS.items():
        line = f"* {key} = {keys.get(key)} (target {how} {bound}): {verdict[key]}"
        if key == "tenant_qps_vs_filtered_ivf_small":
            line += (
                f"; the cold read alone of what ours read at the same recall (compact "
                f"twins): {keys.get(key + '_read_bound')}x; of the full runs instead: "
                f"{keys.get(key + '_read_bound_f32')}x"
            )
        if key in ("grant_us", "revoke_us"):
            kind = key.split("_")[0]
            line += (
                f"; with the settling its next checkpoint does: "
                f"{keys.get(kind + '_amortized_us')} a pair (settling "
                f"{keys.get(kind + '_settle_us')})"
            )
        lines.append(line)
    return "\n".join(lines)
