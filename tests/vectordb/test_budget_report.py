"""The memory-budget benchmark's ratio keys (benchmarks/vectordb/_budget_report.py): QPS at
recall 0.9 where both systems reach it, else at the peer's best recall, never crediting ours
with a recall it did not reach."""

from __future__ import annotations

from typing import Any

from benchmarks.vectordb._budget_report import BudgetRun, headline, ratio_rule, verdicts


def _pass(mode: str, value: int, recall: float, qps: float, queries: int = 200) -> dict[str, Any]:
    return {"mode": mode, "value": value, "recall": recall, "qps": qps, "queries": queries,
            "wall_s": queries / qps, "p50_ms": 1.0, "p99_ms": 2.0, "rss_bytes": 0}  # fmt: skip


def _run(ours: list[dict[str, Any]], peer: list[dict[str, Any]]) -> BudgetRun:
    run = BudgetRun(100, 10, {"tight": 15, "short": 30, "ample": 200}, True)
    run.results["tight"] = {
        "ours": {"passes": ours, "default_value": 8},
        "faiss_ondisk": {"passes": peer},
    }
    return run


def test_both_reach_the_target_the_ratio_is_at_0_9() -> None:
    ours = [_pass("single", 4, 0.85, 400), _pass("single", 8, 0.95, 200)]
    peer = [_pass("single", 8, 0.80, 100), _pass("single", 16, 0.90, 50)]
    rule = ratio_rule(_run(ours, peer), "tight", "single", "faiss_ondisk")
    assert rule["rule"] == "qps@0.9"
    # ours interpolated in log-QPS at 0.9: halfway between 400 and 200
    assert abs(rule["ratio"] - (400 * 200) ** 0.5 / 50) < 0.01


def test_a_peer_short_of_the_target_is_met_at_its_best_recall() -> None:
    ours = [_pass("single", 4, 0.80, 500), _pass("single", 8, 0.86, 300),
            _pass("single", 12, 0.93, 200)]  # fmt: skip
    peer = [
        _pass("single", 4, 0.78, 7),
        _pass("single", 8, 0.84, 2),
        _pass("single", 16, 0.99, 1, queries=1),
    ]  # too few queries: not a measurement
    rule = ratio_rule(_run(ours, peer), "tight", "single", "faiss_ondisk")
    assert rule["rule"] == "at_peer_best"
    assert rule["peer_recall"] == 0.84 and rule["peer_qps"] == 2
    # ours' fastest measured pass at a recall >= 0.84 (not 0.80's, not interpolated)
    assert rule["ours_recall"] == 0.86 and rule["ours_qps"] == 300
    assert rule["ratio"] == 150.0
    keys = headline(_run(ours, peer))
    assert keys["single_qps_vs_faiss_ondisk"] == 150.0
    line = next(v for v in verdicts(keys) if v.startswith("| single_qps_vs_faiss_ondisk"))
    assert "at_peer_best" in line and "0.8600" in line and "0.8400" in line and "PASS" in line


def test_a_peer_too_slow_for_a_measured_pass_is_said_so() -> None:
    ours = [_pass("conc8", 4, 0.86, 550), _pass("conc8", 8, 0.92, 360)]
    peer = [_pass("conc8", 4, 0.757, 3.5, queries=14)]
    rule = ratio_rule(_run(ours, peer), "tight", "conc8", "faiss_ondisk")
    assert rule["rule"] == "at_peer_best (<20 q)" and rule["peer_queries"] == 14
    assert rule["ours_qps"] == 550 and rule["ratio"] == round(550 / 3.5, 3)


def test_no_figure_where_ours_falls_short_or_a_side_has_no_pass() -> None:
    ours = [_pass("single", 4, 0.70, 900)]
    peer = [_pass("single", 8, 0.84, 2)]
    short = ratio_rule(_run(ours, peer), "tight", "single", "faiss_ondisk")
    assert short["ratio"] is None and "never reaches the peer's best" in short["why"]
    missing = ratio_rule(_run(ours, []), "tight", "single", "faiss_ondisk")
    assert missing["ratio"] is None and "faiss_ondisk has no measured pass" in missing["why"]
    peer_reaches = [_pass("single", 8, 0.92, 20)]
    below = ratio_rule(_run(ours, peer_reaches), "tight", "single", "faiss_ondisk")
    assert below["ratio"] is None and "ours never reaches" in below["why"]
    keys = headline(_run(ours, peer))
    assert keys["single_qps_vs_faiss_ondisk"] is None
    line = next(v for v in verdicts(keys) if v.startswith("| single_qps_vs_faiss_ondisk"))
    assert "n/a" in line


def _given_up(value: int, offered: int, wall_s: float) -> dict[str, Any]:
    return {"mode": "batch", "value": value, "queries": 0, "offered": offered,
            "unfinished": True, "recall": 0.0, "qps": 0.0, "qps_below": offered / wall_s,
            "wall_s": wall_s, "p50_ms": wall_s * 1e3, "p99_ms": wall_s * 1e3,
            "rss_bytes": 0}  # fmt: skip


def test_a_peer_batch_given_up_bounds_its_qps_and_the_ratio_from_below() -> None:
    ours = [_pass("batch", 8, 0.88, 500, 500), _pass("batch", 12, 0.94, 300, 500)]
    peer = [_pass("batch", 2, 0.70, 40, 500), _given_up(4, 500, 40.0), _given_up(8, 500, 5.0)]
    run = _run(ours, peer)
    rule = ratio_rule(run, "tight", "batch", "faiss_ondisk")
    # the smallest knob given up bounds every larger one: QPS < 500 / 40 s
    assert rule["lower_bound"] and rule["peer_qps_below"] == 12.5 and rule["peer_value"] == 4
    assert rule["ours_recall"] == 0.9 and abs(rule["ratio"] - rule["ours_qps"] / 12.5) < 0.01
    keys = headline(run)
    line = next(v for v in verdicts(keys) if v.startswith("| batch_qps_vs_faiss_ondisk"))
    assert "> " in line and "lower bound" in line and "< 12.5" in line and "PASS" in line


def test_no_bound_where_the_peer_finished_a_pass_at_the_target() -> None:
    ours = [_pass("batch", 8, 0.92, 500, 500)]
    peer = [_pass("batch", 4, 0.91, 50, 500), _given_up(8, 500, 40.0)]
    rule = ratio_rule(_run(ours, peer), "tight", "batch", "faiss_ondisk")
    assert rule["rule"] == "qps@0.9" and "lower_bound" not in rule


def test_a_worker_killed_in_its_batch_leaves_a_pass_given_up() -> None:
    from benchmarks.vectordb._budget import _killed_in

    started = {"mode": "batch", "value": 4, "offered": 500, "at": 1000.0}
    given_up = _killed_in(started, 1040.0, "exit status -9")
    assert given_up["unfinished"] and given_up["queries"] == 0
    assert given_up["qps_below"] == 12.5 and given_up["killed"] == "exit status -9"
    ours = [_pass("batch", 8, 0.93, 400, 500)]
    rule = ratio_rule(_run(ours, [given_up]), "tight", "batch", "faiss_ondisk")
    assert rule["lower_bound"] and rule["ratio"] == 32.0
