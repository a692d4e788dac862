"""Markdown tables, the recall-vs-QPS plot and the verdicts of the vectordb benchmark."""

from __future__ import annotations

from pathlib import Path

from benchmarks.vectordb._common import RECALL_TARGET, Point, fmt_bytes, qps_at_recall
from benchmarks.vectordb._update import UpdateResult

LABELS = {
    "ours": "ours (SPANN, cold cache)",
    "ours_fp16": "ours, float16 lists (cold cache)",
    "ours_uint8": "ours, uint8 lists (exact for 0..255 pixels; cold cache)",
    "ours_cfg": "ours, --variant settings (cold cache)",  # set by the run
    "ours_cfg_uint8": "ours, --variant settings, uint8 lists (cold cache)",
    "faiss_ondisk": "faiss IVF OnDisk (cold cache)",
    "faiss_ondisk_u8": "faiss IVF OnDisk, 8-bit direct codes (cold cache)",
    "faiss_ivf": "faiss IVF-Flat (RAM)",
    "faiss_hnsw": "faiss HNSW32 (RAM)",
    "diskann": "DiskANN disk index (equal memory)",
}


def _num(value: float, fmt: str = ",.0f") -> str:
    return "n/a" if value != value else f"{value:{fmt}}"


def _io(io: dict[str, float], key: str) -> str:
    value = io.get(key, float("nan"))
    return _num(value / 1024 if key.startswith("bytes") else value, ".1f")


def curve_table(name: str, raw_bytes: int, points: list[Point]) -> str:
    lines = [
        f"### {name}: recall@10 vs QPS",
        "",
        "| system | knob | recall@10 | QPS median (min-max) | resident (% raw) "
        "| KiB/query batch | pages/query batch | KiB/query alone | pages/query alone |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        low, high = p.qps_range
        io = p.io
        lines.append(
            f"| {p.system} | {p.knob}={p.value:g} | {p.recall:.4f} | {_num(p.qps)} "
            f"({_num(low)}-{_num(high)}) | {fmt_bytes(p.resident_bytes)} "
            f"({p.resident_bytes / raw_bytes:.1%}) | {_io(io, 'bytes')} | {_io(io, 'pages')} "
            f"| {_io(io, 'bytes_alone')} | {_io(io, 'pages_alone')} |"
        )
    return "\n".join(lines)


def summary(points: list[Point]) -> dict[str, float | None]:
    """QPS at recall@10 >= target per system."""
    systems = dict.fromkeys(p.system for p in points)
    return {s: qps_at_recall([p for p in points if p.system == s]) for s in systems}


def summary_table(name: str, points: list[Point], builds: dict[str, float]) -> str:
    at = summary(points)
    lines = [
        f"### {name}: QPS at recall@10 >= {RECALL_TARGET}",
        "",
        "| system | QPS at recall >= 0.9 | best recall@10 | resident | build s |",
        "|---|---|---|---|---|",
    ]
    for system, qps in at.items():
        mine = [p for p in points if p.system == system]
        lines.append(
            f"| {LABELS.get(system, system)} | {_num(qps) if qps else 'never reached'} "
            f"| {max(p.recall for p in mine):.4f} | {fmt_bytes(mine[0].resident_bytes)} "
            f"| {_num(builds.get(system, float('nan')), '.1f')} |"
        )
    return "\n".join(lines)


def plot(name: str, points: list[Point], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=80)
    for system in dict.fromkeys(p.system for p in points):
        mine = sorted((p for p in points if p.system == system), key=lambda p: p.value)
        ax.plot([p.recall for p in mine], [p.qps for p in mine], "o-", ms=4,
                label=LABELS.get(system, system))  # fmt: skip
    ax.axvline(RECALL_TARGET, color="grey", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("recall@10")
    ax.set_ylabel("QPS (whole batch, 2 threads; log)")
    ax.set_title(f"{name}: recall@10 vs QPS")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def update_table(result: UpdateResult) -> str:
    fraction = result.final_stats.get("resident_fraction", float("nan"))
    lines = [
        "### debian-minilm: update phase (insert 10% held out, delete 10%)",
        "",
        "| step | live vectors | insert vec/s | delete vec/s | recall@10 | splits | merges |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in result.steps:
        lines.append(
            f"| {s['step']} | {s['live']:,} | {_num(s.get('insert_per_s', float('nan')))} "
            f"| {_num(s.get('delete_per_s', float('nan')))} | {s['recall']:.4f} "
            f"| {s.get('splits', '-')} | {s.get('merges', '-')} |"
        )
    lines += [
        "",
        f"Inserted {result.inserted:,} at {result.insert_rate:,.0f} vectors/s, deleted "
        f"{result.deleted:,} at {result.delete_rate:,.0f}/s; "
        f"checkpoint {result.checkpoint_s:.2f} s; recall@10 after close + reopen "
        f"{result.recall_after_reopen:.4f}; resident fraction after updates {fraction:.3f}.",
    ]
    return "\n".join(lines)


def verdicts(
    at: dict[str, float | None], resident_fraction: float, upd: UpdateResult | None
) -> list[str]:
    def ratio(other: str) -> float | None:
        ours, peer = at.get("ours"), at.get(other)
        return ours / peer if ours and peer else None

    def line(label: str, ok: bool | None, detail: str) -> str:
        word = "n/a" if ok is None else ("PASS" if ok else "MISS")
        return f"| {label} | {detail} | {word} |"

    r_od, r_da = ratio("faiss_ondisk"), ratio("diskann")
    out = [
        "| target | measured | verdict |",
        "|---|---|---|",
        line(
            "QPS >= 2x faiss OnDisk at recall@10 >= 0.9",
            None if r_od is None else r_od >= 2,
            "never reached" if r_od is None else f"{r_od:.2f}x",
        ),
        line(
            "QPS >= DiskANN at equal memory, recall@10 >= 0.9",
            None if r_da is None else r_da >= 1,
            "not run / not reached" if r_da is None else f"{r_da:.2f}x",
        ),
        line(
            "resident <= 15% of raw vector bytes",
            resident_fraction <= 0.15,
            f"{resident_fraction:.1%}",
        ),
    ]
    for variant in ("ours_fp16", "ours_uint8", "ours_cfg", "ours_cfg_uint8"):
        mine, peer = at.get(variant), at.get("faiss_ondisk")  # not the default index
        if mine and peer:
            detail = f"{mine / peer:.2f}x"
            out.append(line(f"same, {LABELS[variant]}", mine / peer >= 2, detail))
    for variant in ("ours_uint8", "ours_cfg_uint8"):
        mine, peer = at.get(variant), at.get("faiss_ondisk_u8")
        if mine and peer:  # both at one byte per dimension
            detail = f"{mine / peer:.2f}x"
            label = f"QPS >= 2x {LABELS['faiss_ondisk_u8']}, {LABELS[variant]}"
            out.append(line(label, mine / peer >= 2, detail))
    if upd is not None:
        low = min(upd.min_recall, upd.recall_after_reopen)
        out.append(line("recall@10 >= 0.9 through the updates", low >= 0.9, f"min {low:.4f}"))
    return out
