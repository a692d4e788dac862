"""Turn the per-round samples into medians, spreads, RSS per parameter and the issue's ratios.

Step times of one system at one size are pooled over rounds (every timed step of every round);
the median of the pool is the figure, ``min``/``max`` its spread, and each round's own median is
kept so a drifting disk shows. Peak RSS is the largest over rounds. A ratio is None when either
side was not measured (DeepSpeed's venv absent, a system failed); ``misses`` names every target
a ratio misses and every system that failed, so the JSON states them plainly.
"""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["TARGETS", "headline", "summarize_size"]

TARGETS = {
    "dram_step_vs_inmemory": 1.15,
    "nvme_step_vs_io_floor": 1.2,
    "nvme_step_vs_deepspeed_nvme": 0.66,
}
_RATIOS = {
    "dram_step_vs_inmemory": ("ours-dram", "torch"),
    "nvme_step_vs_io_floor": ("ours-nvme", "fio-floor"),
    "nvme_step_vs_deepspeed_nvme": ("ours-nvme", "deepspeed-nvme"),
    "nvme_step_vs_deepspeed_cpu": ("ours-nvme", "deepspeed-cpu"),
    "nvme_tier_master_step_vs_deepspeed_nvme": ("ours-nvme-tier", "deepspeed-nvme"),
    "nvme_tier_master_step_vs_nvme": ("ours-nvme-tier", "ours-nvme"),
    "dram_step_vs_deepspeed_cpu": ("ours-dram", "deepspeed-cpu"),
}


def _system_summary(samples: list[dict[str, Any]], params: int) -> dict[str, Any]:
    pooled = [t for sample in samples for t in sample["step_s"]]
    peak = max(sample["peak_rss_bytes"] for sample in samples)
    model = max(sample.get("model_rss_bytes", 0) for sample in samples)
    summary: dict[str, Any] = {
        "step_s_median": statistics.median(pooled),
        "step_s_min": min(pooled),
        "step_s_max": max(pooled),
        "step_s_round_medians": [statistics.median(s["step_s"]) for s in samples],
        "steps_timed": len(pooled),
        "rounds": len(samples),
        "peak_rss_bytes": peak,
        "rss_bytes_per_param": peak / params,
    }
    if model:
        summary["rss_beyond_model_bytes_per_param"] = (peak - model) / params
    plain = {"step_s", "peak_rss_bytes", "model_rss_bytes", "system", "params", "checksum"}
    summary["round_details"] = [{k: v for k, v in s.items() if k not in plain} for s in samples]
    return summary


def summarize_size(
    params: int, samples: dict[str, list[dict[str, Any]]], failures: dict[str, str]
) -> dict[str, Any]:
    """One size's systems, ratios and misses from ``samples[system] = [round records]``."""
    systems = {name: _system_summary(got, params) for name, got in samples.items() if got}
    ratios: dict[str, float | None] = {}
    for key, (ours, theirs) in _RATIOS.items():
        if ours in systems and theirs in systems:
            ratios[key] = systems[ours]["step_s_median"] / systems[theirs]["step_s_median"]
        else:
            ratios[key] = None
    misses = [
        f"{key} = {ratios[key]:.3f} > {target}"
        for key, target in TARGETS.items()
        if ratios[key] is not None and ratios[key] > target  # type: ignore[operator]
    ]
    misses += [f"{name} failed: {why}" for name, why in failures.items()]
    return {"params": params, "systems": systems, "ratios": ratios, "misses": misses}


def headline(by_size: dict[str, dict[str, Any]], primary: str) -> dict[str, Any]:
    """The issue's keys, taken at the ``primary`` size (the largest measured)."""
    size = by_size[primary]
    nvme = size["systems"].get("ours-nvme")
    keys: dict[str, Any] = {key: size["ratios"][key] for key in TARGETS}
    keys["host_rss_bytes_per_param_nvme"] = nvme["rss_bytes_per_param"] if nvme else None
    keys["host_rss_beyond_model_bytes_per_param_nvme"] = (
        nvme.get("rss_beyond_model_bytes_per_param") if nvme else None
    )
    keys["headline_size"] = primary
    return keys
