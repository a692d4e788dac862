"""The dataload benchmark's report: per-loader medians and spreads, ratios, targets, headline JSON.

Ratios are medians of per-round ratios (both loaders of a ratio ran back to back in the same
round), so slow and fast phases of the shared disk cancel out.
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks.common.measure import machine_string, median, spread
from benchmarks.dataload._measure import Run

TARGET_VS_TORCH = 2.0
TARGET_VS_FIO = 0.85
TARGET_CPU_FRACTION = 1 / 3
HEADLINE_LOADER = {
    "records_32k": "tierkit_direct",
    "fmnist": "tierkit",
    "parquet_text": "tierkit",
    "map_dataset": "tierkit",
    "tar_shards": "tierkit",
}
# issue 19's targets per workload (records: issue 5's)
TARGETS_VS_TORCH = {"records_32k": 2.0, "fmnist": 1.5, "parquet_text": 1.2, "map_dataset": 1.2}
TARGETS_VS_TORCH["tar_shards"] = 2.0  # against WebDataset's own loader (issue 19)
PEER_PREFIX = {"tar_shards": "wds_nw"}  # peer run names other than DataLoader's "torch_nw"


def _runs(runs: list[Run], workload: str, loader: str) -> list[Run]:
    return sorted(
        (r for r in runs if r.workload == workload and r.loader == loader),
        key=lambda r: r.round_index,
    )


def round_ratios(runs: list[Run], workload: str, mine: str, peer: str) -> list[float]:
    """Per-round samples/s of ``mine`` over ``peer``."""
    peer_by_round = {r.round_index: r.samples_per_s for r in _runs(runs, workload, peer)}
    return [
        r.samples_per_s / peer_by_round[r.round_index]
        for r in _runs(runs, workload, mine)
        if peer_by_round.get(r.round_index)
    ]


def cpu_of(runs: list[Run], workload: str, loader: str) -> float:
    return median([r.cpu_us_per_sample for r in _runs(runs, workload, loader)])


def print_report(runs: list[Run], notes: list[str], quick: bool, elapsed_s: float) -> None:
    print(f"\n## dataload benchmark ({'quick' if quick else 'full'}), {elapsed_s:.0f} s")
    print(f"machine: {machine_string()}, load1 now {os.getloadavg()[0]:.1f}")
    print("\n| workload | loader | samples/s | MB/s | CPU us/sample | first batch ms | load1 |")
    print("|---|---|---|---|---|---|---|")
    for workload in dict.fromkeys(r.workload for r in runs):
        for loader in dict.fromkeys(r.loader for r in runs if r.workload == workload):
            mine = _runs(runs, workload, loader)
            print(
                f"| {workload} | {loader} | {spread([r.samples_per_s for r in mine], ',.0f')} | "
                f"{spread([r.mb_per_s for r in mine], ',.0f')} | "
                f"{spread([r.cpu_us_per_sample for r in mine], '.1f')} | "
                f"{spread([r.first_batch_s * 1e3 for r in mine], '.0f')} | "
                f"{median([r.load1 for r in mine]):.1f} |"
            )
    print("\nratios (median of per-round ratios, min-max):")
    for workload in HEADLINE_LOADER:
        peers = sorted(
            {r.loader for r in runs if r.workload == workload and "tierkit" not in r.loader}
        )
        for peer in peers:
            mine = _mine(workload, peer) if "nw" in peer else HEADLINE_LOADER[workload]
            values = round_ratios(runs, workload, mine, peer)
            if values:
                print(f"  {workload}: {mine} / {peer} = {spread(values, '.2f')}")
    print("\ntargets:")
    for line in target_lines(runs):
        print(f"  {line}")
    for note in notes:
        print(f"note: {note}")


def torch_ratios(runs: list[Run], workload: str) -> dict[str, float]:
    """tierkit / DataLoader per worker count (records: one tierkit config against every count;
    decoded workloads: tierkit with N decode threads against N DataLoader workers)."""
    prefix = PEER_PREFIX.get(workload, "torch_nw")
    peers = sorted({r.loader for r in runs if r.workload == workload and prefix in r.loader})
    out = {}
    for peer in peers:
        mine = _mine(workload, peer)
        values = round_ratios(runs, workload, mine, peer)
        if values:
            out[peer] = median(values)
    return out


def _mine(workload: str, peer: str) -> str:
    if workload == "records_32k":
        return HEADLINE_LOADER[workload]
    return "tierkit_w" + peer.rsplit("nw", 1)[1]


def target_lines(runs: list[Run]) -> list[str]:
    lines = []
    for workload in HEADLINE_LOADER:
        target = TARGETS_VS_TORCH.get(workload, TARGET_VS_TORCH)
        for peer, ratio in torch_ratios(runs, workload).items():
            verdict = "PASS" if ratio >= target else "MISS"
            lines.append(f"{workload} vs {peer}: {ratio:.2f}x (>= {target}x) {verdict}")
    fio = median(round_ratios(runs, "records_32k", "tierkit_direct", "fio_qd128"))
    if fio == fio:
        lines.append(f"records_32k vs fio: {fio:.2f}x (>= 0.85x) " + _pass(fio >= TARGET_VS_FIO))
    for workload in HEADLINE_LOADER:
        for peer in sorted({r.loader for r in runs if r.workload == workload}):
            if PEER_PREFIX.get(workload, "torch_nw") in peer:
                mine = cpu_of(runs, workload, _mine(workload, peer))
                theirs = cpu_of(runs, workload, peer)
                ok = mine <= theirs * TARGET_CPU_FRACTION
                lines.append(
                    f"{workload} CPU/sample {mine:.1f} us vs {peer} {theirs:.1f} us "
                    f"({mine / theirs:.2f}x, <= 0.33x) {_pass(ok)}"
                )
    return lines


def _pass(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def headline(runs: list[Run], notes: list[str]) -> dict[str, Any]:
    """The last line: the figures the issue names, plus per-peer detail."""
    records = torch_ratios(runs, "records_32k")
    out: dict[str, Any] = {
        "vs_torch_dataloader_records": min(records.values()) if records else None,
        "vs_torch_dataloader_records_by_workers": {k: round(v, 3) for k, v in records.items()},
        "vs_fio_records": median(round_ratios(runs, "records_32k", "tierkit_direct", "fio_qd128")),
        "cpu_us_per_sample": cpu_of(runs, "records_32k", "tierkit_direct"),
        "torch_cpu_us_per_sample": cpu_of(runs, "records_32k", "torch_nw2"),
        "tierkit_samples_per_s_records": median(
            [r.samples_per_s for r in _runs(runs, "records_32k", "tierkit_direct")]
        ),
    }
    for workload in ("fmnist", "parquet_text", "map_dataset", "tar_shards"):
        ratios = torch_ratios(runs, workload)
        if ratios:
            out[f"vs_torch_dataloader_{workload}"] = min(ratios.values())
            out[f"vs_torch_dataloader_{workload}_by_workers"] = {
                k: round(v, 3) for k, v in ratios.items()
            }
            out[f"cpu_us_per_sample_{workload}_w2"] = cpu_of(runs, workload, "tierkit_w2")
            peer = PEER_PREFIX.get(workload, "torch_nw")
            out[f"{peer.split('_')[0]}_cpu_us_per_sample_{workload}_nw2"] = cpu_of(
                runs, workload, f"{peer}2"
            )
    out["notes"] = notes
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}
