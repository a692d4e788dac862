"""The tiers benchmark's markdown tables, target verdicts and headline JSON.

Ratios are medians of per-round ratios (tier GB/s over its reference's GB/s in the same round:
``np.copyto`` for the memory tiers, fio randread for NVMe), so slow and fast phases of the shared
machine cancel out.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common.measure import KIB, MIB, median, spread
from benchmarks.tiers._store_memory import POLICIES, SIZES, OpSample, size_label
from benchmarks.tiers._store_nvme import QD
from benchmarks.tiers._store_zipf import POLICY_VARIANTS, VARIANTS, ZipfSample

MEMORY_ROWS = (
    ("memcpy", "copy"),
    ("dram", "put"),
    ("dram", "get"),
    ("dram", "get_new"),
    ("hbm", "put"),
    ("hbm", "get"),
    ("cxl", "put"),
    ("cxl", "get"),
)
NVME_ROWS = (("fio", "write"), ("nvme", "put"), ("fio", "randread"), ("nvme", "get"))
HIT_LIMIT_US = 2.0


def pretty_size(size: int) -> str:
    return f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"


def _of(samples: list[OpSample], tier: str, op: str, size: int) -> list[OpSample]:
    return [s for s in samples if (s.tier, s.op, s.size_bytes) == (tier, op, size)]


def reference(tier: str, op: str) -> tuple[str, str] | None:
    if tier in ("dram", "hbm", "cxl"):
        return "memcpy", "copy"
    if tier == "nvme":
        return ("fio", "write") if op == "put" else ("fio", "randread")
    return None


def ratios(samples: list[OpSample], tier: str, op: str, size: int) -> list[float]:
    """Per-round GB/s of (tier, op) over its reference's GB/s in the same round."""
    ref = reference(tier, op)
    if ref is None:
        return []
    base = {s.round_index: s.gbps for s in _of(samples, *ref, size)}
    return [
        s.gbps / base[s.round_index] for s in _of(samples, tier, op, size) if s.round_index in base
    ]


def _r(value: float, digits: int = 3) -> float | None:
    return None if value != value else round(value, digits)


def _zipf(zipf: list[ZipfSample], variant: str, field: str) -> list[float]:
    return [getattr(s, field) for s in zipf if s.variant == variant]


def _zipf_vs(zipf: list[ZipfSample], variant: str, base: str, field: str) -> list[float]:
    ref = {s.round_index: getattr(s, field) for s in zipf if s.variant == base}
    return [
        getattr(s, field) / ref[s.round_index]
        for s in zipf
        if s.variant == variant and ref.get(s.round_index)
    ]


def best_policy(zipf: list[ZipfSample]) -> str:
    return max(POLICY_VARIANTS, key=lambda p: median(_zipf(zipf, p, "hit_rate")))


def verdicts(figures: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(target, measured, threshold, PASS/MISS)."""
    rows = []
    big = {k: figures[f"dram_get_vs_memcpy_{k}"] for k in ("1mib", "16mib")}
    worst = min(big.values())
    rows.append(
        (
            "DRAM get (into=) >= 0.8x copy bandwidth, objects >= 1 MiB",
            f"1 MiB {big['1mib']:.2f}, 16 MiB {big['16mib']:.2f}",
            ">= 0.8 at both",
            "PASS" if worst >= 0.8 else "MISS",
        )
    )
    label_sizes = {size_label(size): pretty_size(size) for size in SIZES}
    for label in ("64kib", "1mib", "16mib"):
        value = figures[f"nvme_get_vs_fio_{label}"]
        rows.append(
            (
                f"NVMe get >= 0.85x fio randread, {label_sizes[label]} QD{QD}",
                f"{value:.2f}",
                ">= 0.85",
                "PASS" if value >= 0.85 else "MISS",
            )
        )
    for key, name in (
        ("dram_hit_overhead_us", "TieredStore.get DRAM hit (lru)"),
        ("dram_tier_hit_overhead_us", "DramTier.get hit"),
        ("store_hit_overhead_us_lfu", "TieredStore.get DRAM hit (lfu)"),
        ("store_hit_overhead_us_cost", "TieredStore.get DRAM hit (cost)"),
    ):
        value = figures[key]
        rows.append(
            (
                f"<= 2 us bookkeeping per hit, copy excluded: {name}",
                f"{value:.2f} us",
                "<= 2 us",
                "PASS" if value <= HIT_LIMIT_US else "MISS",
            )
        )
    best, lru = figures["zipf_hit_rate_best"], figures["zipf_hit_rate_lru"]
    rows.append(
        (
            "best policy's Zipf hit rate above LRU's",
            f"{figures['zipf_best_policy']} {best:.3f} vs lru {lru:.3f}",
            "> lru",
            "PASS" if best > lru else "MISS",
        )
    )
    return rows


def headline(
    samples: list[OpSample],
    hits: dict[str, list[float]],
    zipf: list[ZipfSample],
    sims: dict[str, float],
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for tier, op in (*MEMORY_ROWS[1:], ("nvme", "get"), ("nvme", "put")):
        ref_tier = {"get": "fio", "put": "fio_write"}[op] if tier == "nvme" else "memcpy"
        for size in SIZES:
            name = f"{tier}_{op}_vs_{ref_tier}_{size_label(size)}"
            figures[name] = _r(median(ratios(samples, tier, op, size)))
    for size in SIZES:
        for tier, op in (
            ("dram", "get"),
            ("nvme", "get"),
            ("fio", "randread"),
            ("nvme", "put"),
            ("fio", "write"),
        ):
            figures[f"{tier}_{op}_gbps_{size_label(size)}"] = _r(
                median([s.gbps for s in _of(samples, tier, op, size)])
            )
    figures["dram_hit_overhead_us"] = _r(median(hits["store_lru"]), 3)
    figures["dram_tier_hit_overhead_us"] = _r(median(hits["tier"]), 3)
    for policy in POLICIES:
        figures[f"store_hit_overhead_us_{policy}"] = _r(median(hits[f"store_{policy}"]), 3)
    figures["bare_copy_4k_us"] = _r(median(hits["copy_us"]), 3)
    best = best_policy(zipf)
    figures["zipf_hit_rate_best"] = _r(median(_zipf(zipf, best, "hit_rate")))
    figures["zipf_hit_rate_lru"] = _r(median(_zipf(zipf, "lru", "hit_rate")))
    figures["zipf_best_policy"] = best
    for variant in VARIANTS:
        slug = variant.replace("-", "_")
        figures[f"zipf_hit_rate_{slug}"] = _r(median(_zipf(zipf, variant, "hit_rate")))
        figures[f"zipf_gets_per_s_{slug}"] = _r(median(_zipf(zipf, variant, "gets_per_s")), 0)
        figures[f"zipf_throughput_vs_nvme_only_{slug}"] = _r(
            median(_zipf_vs(zipf, variant, "nvme-only", "gets_per_s"))
        )
    figures["zipf_hit_rate_lru_simulated"] = _r(sims["lru"])
    figures["zipf_hit_rate_static_oracle"] = _r(sims["oracle"])
    figures["targets"] = {name: verdict for name, _, _, verdict in verdicts(figures)}
    return figures


def _spread_or_dash(values: list[float], fmt: str) -> str:
    return spread(values, fmt) if values else "-"


def op_table(samples: list[OpSample], rows: tuple[tuple[str, str], ...]) -> list[str]:
    lines = [
        "| size | tier | op | GB/s median (min-max) | p50 us | p99 us "
        "| x reference: median (min-max) of per-round ratios |",
        "|---|---|---|---|---|---|---|",
    ]
    for size in SIZES:
        for tier, op in rows:
            runs = _of(samples, tier, op, size)
            if not runs:
                continue
            rel = ratios(samples, tier, op, size)
            lines.append(
                f"| {pretty_size(size)} | {tier} | {op} "
                f"| {spread([s.gbps for s in runs], '.2f')} "
                f"| {median([s.p50_us for s in runs]):.1f} "
                f"| {median([s.p99_us for s in runs]):.1f} "
                f"| {_spread_or_dash(rel, '.2f') if reference(tier, op) else '1'} |"
            )
    return lines


def hit_table(hits: dict[str, list[float]]) -> list[str]:
    lines = ["| path | us per hit beyond the bare copy: median (min-max) |", "|---|---|"]
    lines.append(f"| bare np.copyto, 4 KiB (absolute) | {spread(hits['copy_us'], '.3f')} |")
    lines.append(f"| DramTier.get(into=) | {spread(hits['tier'], '.3f')} |")
    for policy in POLICIES:
        values = hits[f"store_{policy}"]
        lines.append(f"| TieredStore.get(into=), DRAM hit, {policy} | {spread(values, '.3f')} |")
    return lines


def zipf_table(zipf: list[ZipfSample]) -> list[str]:
    lines = [
        "| variant | DRAM hit rate | byte hit rate | gets/s | MB/s | x nvme-only gets/s "
        "| p50 us | p99 us | drain share | NVMe reads per miss |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        z = [s for s in zipf if s.variant == variant]
        lines.append(
            f"| {variant} | {spread([s.hit_rate for s in z], '.3f')} "
            f"| {spread([s.byte_hit_rate for s in z], '.3f')} "
            f"| {spread([s.gets_per_s for s in z], ',.0f')} "
            f"| {spread([s.mb_per_s for s in z], ',.0f')} "
            f"| {spread(_zipf_vs(zipf, variant, 'nvme-only', 'gets_per_s'), '.2f')} "
            f"| {median([s.p50_us for s in z]):.0f} | {median([s.p99_us for s in z]):.0f} "
            f"| {median([s.drain_share for s in z]):.2f} "
            f"| {median([s.nvme_reads_per_miss for s in z]):.2f} |"
        )
    return lines


def target_table(figures: dict[str, Any]) -> list[str]:
    lines = ["| target | measured | threshold | result |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in verdicts(figures)]
    return lines


def extra_rows(figures: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The verdicts of the batch, group-commit and LRU-peer figures."""
    rows = []
    for label in ("4k", "64k"):
        value = figures[f"nvme_get_many_vs_fio_{label}"]
        rows.append(
            (
                f"NVMe get_many(32) >= 0.85x fio randread QD32, {label}",
                f"{value:.2f}",
                ">= 0.85",
                "PASS" if value >= 0.85 else "MISS",
            )
        )
    value = figures["nvme_put_many_vs_fio_fsync_4k"]
    rows.append(
        (
            "NVMe put_many 4 KiB objects/s >= 5x fio fdatasync'd writes/s (iodepth 1)",
            f"{value:.2f}x ({figures['nvme_put_many_objects_per_s_4k']:,.0f} vs "
            f"{figures['fio_fsync_writes_per_s_4k']:,.0f})",
            ">= 5",
            "PASS" if value >= 5 else "MISS",
        )
    )
    value = figures["zipf_gets_vs_naive_lru"]
    rows.append(
        (
            "Zipf(0.99) 64 KiB gets/s, best policy vs dict+OrderedDict LRU",
            f"{value:.2f}",
            ">= 1.0",
            "PASS" if value >= 1.0 else "MISS",
        )
    )
    return rows


def extra_verdicts(figures: dict[str, Any]) -> dict[str, str]:
    return {name: verdict for name, _, _, verdict in extra_rows(figures)}
