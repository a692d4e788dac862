"""The optimizer benchmark (issue 18): its pieces, and ``benchmarks.optim.step`` end to end.

The end-to-end run is a subprocess, as a user runs it, at 2M parameters with 256 KiB subgroups,
without DeepSpeed (its venv takes ~10 min to build; CI has none): it checks the last line's keys,
that ours matched torch bit for bit, and that every system produced step times. The DeepSpeed
peer has its own tiny run, skipped where .venv-deepspeed is absent. About 30 s in all.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.common.paths import REPO_ROOT
from benchmarks.optim.children import ChildFailed, run_child
from benchmarks.optim.model import param_shapes
from benchmarks.optim.step import DS_STAMP, child_env
from benchmarks.optim.summary import summarize_size

_TIMEOUT_S = 240  # a smoke run takes ~20 s here; this only stops a hung one
KEYS = frozenset(
    {"dram_step_vs_inmemory", "nvme_step_vs_io_floor", "nvme_step_vs_deepspeed_nvme"}
    | {"host_rss_bytes_per_param_nvme", "host_rss_beyond_model_bytes_per_param_nvme", "exact"}
    | {"exact_runs", "sizes", "targets", "deepspeed", "misses", "mode", "settings", "machine"}
    | {"headline_size", "date_utc"}
)


@pytest.mark.parametrize("total", [1, 4096, 4_194_304, 4_210_000, 20_000_000])
def test_param_shapes_hold_exactly_the_asked_total(total: int) -> None:
    numels = [int(torch_numel(shape)) for shape in param_shapes(total)]
    assert sum(numels) == total and all(n > 0 for n in numels)


def torch_numel(shape: tuple[int, ...]) -> int:
    numel = 1
    for dim in shape:
        numel *= dim
    return numel


_PEAK = "import json, sys; from benchmarks.optim.model import peak_rss_bytes as peak; "
_PEAK += "b = bytearray(int(sys.argv[1]) << 20); b[::4096] = b'x' * len(b[::4096]); del b; "
_PEAK += "print('noise'); print(json.dumps({'peak': peak()}))"


def test_child_reports_its_own_peak_rss_and_failures_carry_the_log(tmp_path) -> None:
    big = run_child(
        [sys.executable, "-c", _PEAK, "300"], child_env(1), tmp_path / "a.log", 60, REPO_ROOT
    )
    assert big.record["peak"] >= 300 << 20  # freed before the read: still the peak
    assert big.wait4_maxrss_bytes >= big.record["peak"]
    small = run_child(
        [sys.executable, "-c", _PEAK, "1"], child_env(1), tmp_path / "b.log", 60, REPO_ROOT
    )
    # its own (torch imported, ~250 MiB), not the earlier child's peak nor pytest's image
    assert small.record["peak"] < big.record["peak"] - (250 << 20)
    with pytest.raises(ChildFailed, match="exit 3"):
        run_child([sys.executable, "-c", "exit(3)"], child_env(1), tmp_path / "c.log", 60, tmp_path)


def test_summary_ratios_and_misses() -> None:
    def rec(*steps: float) -> dict[str, object]:
        return {"step_s": list(steps), "peak_rss_bytes": 1000, "model_rss_bytes": 800}

    samples = {
        "torch": [rec(1.0, 1.0, 1.0), rec(1.0, 1.2, 0.8)],
        "ours-dram": [rec(1.3, 1.3, 1.3), rec(1.2, 1.4, 1.3)],
        "ours-nvme": [rec(2.0, 2.0, 2.0)],
        "fio-floor": [rec(2.0)],
    }
    size = summarize_size(100, samples, {"deepspeed-nvme": "exit 1"})
    assert size["ratios"]["dram_step_vs_inmemory"] == pytest.approx(1.3)
    assert size["ratios"]["nvme_step_vs_io_floor"] == pytest.approx(1.0)
    assert size["ratios"]["nvme_step_vs_deepspeed_nvme"] is None
    assert size["systems"]["torch"]["step_s_round_medians"] == [1.0, 1.0]
    assert size["systems"]["torch"]["rss_beyond_model_bytes_per_param"] == pytest.approx(2.0)
    assert any(m.startswith("dram_step_vs_inmemory") for m in size["misses"])
    assert "deepspeed-nvme failed: exit 1" in size["misses"]
    assert not any(m.startswith("nvme_step_vs_io_floor") for m in size["misses"])


def test_step_smoke_end_to_end() -> None:
    pytest.importorskip("kvstore.optim")
    command = [sys.executable, "-m", "benchmarks.optim.step", "--sizes=2m", "--no-deepspeed"]
    command += ["--rounds=1", "--steps=2", f"--subgroup-bytes={256 << 10}"]
    done = subprocess.run(
        command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary.keys() >= KEYS
    assert summary["exact"] is True, summary["exact_runs"]
    size = summary["sizes"]["2m"]
    for system in ("torch", "ours-dram", "ours-nvme", "fio-floor"):
        assert size["systems"][system]["steps_timed"] >= (1 if system == "fio-floor" else 2)
    assert summary["dram_step_vs_inmemory"] > 0 and summary["nvme_step_vs_io_floor"] > 0
    assert summary["nvme_step_vs_deepspeed_nvme"] is None
    assert summary["host_rss_bytes_per_param_nvme"] > 0


@pytest.mark.skipif(not DS_STAMP.exists(), reason="no .venv-deepspeed (scripts/deepspeed_venv.sh)")
@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_deepspeed_peer_steps(device: str, tmp_path) -> None:
    python = str(DS_STAMP.parent / "bin" / "python")
    command = [python, "-m", "benchmarks.optim.deepspeed_peer", f"--device={device}"]
    command += ["--params=1000000", "--steps=2", f"--directory={tmp_path}"]
    command += [f"--subgroup-bytes={1 << 20}"]
    result = run_child(command, child_env(2), tmp_path / "ds.log", _TIMEOUT_S, REPO_ROOT)
    assert result.record["system"] == f"deepspeed-{device}"
    assert len(result.record["step_s"]) == 2 and result.record["peak_rss_bytes"] > 0
    if device == "nvme":  # the state really is in swap files, moved by the step
        assert result.record["directory_bytes"] >= 12 * 1_000_000
        assert result.record["disk_read_write_bytes_per_step"][1] > 0
