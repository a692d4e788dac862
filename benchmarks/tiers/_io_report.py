"""Turn benchmark samples into the markdown report, the target verdicts and the headline JSON.

Ratios are medians of per-round ratios (path IOPS / fio IOPS in the same round), so slow and
fast phases of the shared disk cancel out; at one block size the IOPS ratio is the bandwidth
ratio. CPU per I/O is compared as a ratio of medians.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.common.measure import Config, Sample, median, spread

PATH_ORDER = ("fio", "uring", "thread", "aiofiles", "uring_tasks", "thread_tasks")
PATH_ORDER += ("uring_tasks_uvloop",)

# (name, kind, config key, threshold): "ratio" = uring / fio per round, "cpu" = uring / fio
# CPU per I/O (at most), "aiofiles" = uring / aiofiles per round.
TARGETS = (
    ("UringEngine IOPS >= 0.9x fio, 4 KiB QD32", "ratio", "4k_qd32", 0.9),
    ("UringEngine bandwidth >= 0.95x fio, 128 KiB QD32", "ratio", "128k_qd32", 0.95),
    ("UringEngine CPU/IO <= 2x fio, 4 KiB QD32", "cpu", "4k_qd32", 2.0),
    ("UringEngine IOPS >= 5x aiofiles, 4 KiB QD32", "aiofiles", "4k_qd32", 5.0),
)


def _of(samples: list[Sample], config: str, path: str) -> list[Sample]:
    return sorted(
        (s for s in samples if s.config == config and s.path == path), key=lambda s: s.round_index
    )


def round_ratios(samples: list[Sample], config: str, path: str, base: str) -> list[float]:
    """Per-round ``path`` IOPS / ``base`` IOPS, for rounds where both ran."""
    base_by_round = {s.round_index: s.iops for s in _of(samples, config, base)}
    return [
        s.iops / base_by_round[s.round_index]
        for s in _of(samples, config, path)
        if base_by_round.get(s.round_index)
    ]


def cpu_median(samples: list[Sample], config: str, path: str) -> float:
    return median([s.cpu_us_per_io for s in _of(samples, config, path)])


def target_value(samples: list[Sample], kind: str, config: str) -> float:
    if kind == "ratio":
        return median(round_ratios(samples, config, "uring", "fio"))
    if kind == "aiofiles":
        return median(round_ratios(samples, config, "uring", "aiofiles"))
    return cpu_median(samples, config, "uring") / cpu_median(samples, config, "fio")


def verdicts(samples: list[Sample]) -> list[tuple[str, float, str, str]]:
    """(target, measured value, threshold text, PASS/MISS) for each target."""
    rows = []
    for name, kind, config, threshold in TARGETS:
        value = target_value(samples, kind, config)
        passed = value <= threshold if kind == "cpu" else value >= threshold
        sign = "<=" if kind == "cpu" else ">="
        rows.append((name, value, f"{sign} {threshold:g}", "PASS" if passed else "MISS"))
    return rows


def _r(value: float, digits: int = 3) -> float | None:
    return None if value != value else round(value, digits)  # NaN -> null


def headline(
    samples: list[Sample], mode: str, machine: str, drive: str = "stream"
) -> dict[str, Any]:
    """The one-line JSON summary printed last."""
    configs = list(dict.fromkeys(s.config for s in samples))
    figures: dict[str, Any] = {}
    for config in configs:
        for path in ("uring", "thread"):
            figures[f"{path}_vs_fio_{config}"] = _r(
                median(round_ratios(samples, config, path, "fio"))
            )
    for path in ("uring", "thread"):
        # the tasks drive at 4k QD32: its own rows in a quick run, the main rows with --drive tasks
        tasks_path = f"{path}_tasks" if _of(samples, "4k_qd32", f"{path}_tasks") else path
        if tasks_path != path or drive == "tasks":
            figures[f"{path}_tasks_vs_fio_4k_qd32"] = _r(
                median(round_ratios(samples, "4k_qd32", tasks_path, "fio"))
            )
    if _of(samples, "4k_qd32", "uring_tasks_uvloop"):  # the tasks drive on uvloop's loop
        figures["uring_tasks_uvloop_vs_fio_4k_qd32"] = _r(
            median(round_ratios(samples, "4k_qd32", "uring_tasks_uvloop", "fio"))
        )
    figures["uring_vs_aiofiles_4k_qd32"] = _r(
        median(round_ratios(samples, "4k_qd32", "uring", "aiofiles"))
    )
    for path in PATH_ORDER:
        if path.endswith("_tasks") and not _of(samples, "4k_qd32", path):
            continue  # the tasks rows run only in quick mode
        figures[f"{path}_cpu_us_per_io_4k"] = _r(cpu_median(samples, "4k_qd32", path), 2)
        figures[f"{path}_iops_4k_qd32"] = _r(
            median([s.iops for s in _of(samples, "4k_qd32", path)]), 0
        )
    figures["targets"] = {name: verdict for name, _, _, verdict in verdicts(samples)}
    figures["load1_median"] = _r(median([s.load1 for s in samples]), 1)
    figures["machine"] = machine
    figures["mode"] = mode
    return figures


def _table(samples: list[Sample], configs: list[Config]) -> list[str]:
    lines = [
        "| config | path | IOPS median (min-max) | MB/s median (min-max) "
        "| CPU us/IO median (min-max) | x fio: median (min-max) of per-round ratios |",
        "|---|---|---|---|---|---|",
    ]
    for cfg in configs:
        for path in PATH_ORDER:
            runs = _of(samples, cfg.key, path)
            if not runs:
                continue
            ratios = round_ratios(samples, cfg.key, path, "fio")
            lines.append(
                f"| {cfg.key} | {path} | {spread([s.iops for s in runs], ',.0f')} "
                f"| {spread([s.bandwidth_bytes_per_s / 1e6 for s in runs], ',.0f')} "
                f"| {spread([s.cpu_us_per_io for s in runs], '.1f')} "
                f"| {spread(ratios, '.2f') if path != 'fio' else '1'} |"
            )
    return lines


def _aiofiles_table(samples: list[Sample], configs: list[Config]) -> list[str]:
    lines = ["| config | uring / aiofiles | uring / thread |", "|---|---|---|"]
    for cfg in configs:
        vs_aio = round_ratios(samples, cfg.key, "uring", "aiofiles")
        vs_thread = round_ratios(samples, cfg.key, "uring", "thread")
        lines.append(f"| {cfg.key} | {spread(vs_aio, '.2f')} | {spread(vs_thread, '.2f')} |")
    return lines


def print_report(
    samples: list[Sample],
    configs: list[Config],
    figures: dict[str, Any],
    args: argparse.Namespace,
    mode: str,
) -> None:
    """Markdown tables and target verdicts on stdout."""
    loads = [s.load1 for s in samples]
    lines = [
        f"## io_engine ({mode}): {args.rounds} rounds x {args.duration_s:g} s per run "
        f"(+{args.warmup_s:g} s warm-up), {args.size_gib:g} GiB file, O_DIRECT",
        "",
        f"machine: {figures['machine']}; load1 during runs: {spread(loads, '.1f')}",
        f"engine code: {figures.get('code', '?')}",
        (
            "engines: queue_depth=QD, two tasks keep 256-request batches queued (stream drive)"
            if getattr(args, "drive", "lanes") == "stream"
            else "engines: lanes x batch = QD (1x1, 4x8, 8x16)"
        )
        + "; sequential rows at QD32; MB/s = 10^6 B/s",
        "",
        *_table(samples, configs),
        "",
        "uring vs the other Python paths (median (min-max) of per-round IOPS ratios):",
        "",
        *_aiofiles_table(samples, configs),
        "",
        "| target | measured | threshold | result |",
        "|---|---|---|---|",
    ]
    for name, value, threshold, verdict in verdicts(samples):
        lines.append(f"| {name} | {value:.2f} | {threshold} | {verdict} |")
    cpu_uring, cpu_fio = figures["uring_cpu_us_per_io_4k"], figures["fio_cpu_us_per_io_4k"]
    lines += ["", f"CPU per I/O at 4k QD32: uring {cpu_uring} us, fio {cpu_fio} us", ""]
    print("\n".join(lines), flush=True)
