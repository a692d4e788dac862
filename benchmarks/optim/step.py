"""AdamW step time and peak host RSS: torch in memory, ours (DRAM, NVMe), fio's floor, DeepSpeed.

``python -m benchmarks.optim.step [--quick]`` (run it under ``flock /tmp/tierkit-bench.lock``).
Full mode: 100M and 500M parameters (``--sizes`` adds 1000m where RAM and disk allow: 16 bytes per
parameter of state in memory, 12 on disk, twice that for fio's files); ``--quick``: 20M, about
two minutes, DeepSpeed only if .venv-deepspeed exists (full mode builds it first, cached).

Systems: torch's fused AdamW in memory; ours in DRAM (resident, the default); ours on NVMe with
the default ``master="auto"``, which is "params" for this fp32 CPU model (``ours-nvme``: the fp32
parameters are the masters, the tier holds the two moments, 8 bytes per parameter each way) and
with ``master="tier"`` (``ours-nvme-tier``: an fp32 master too, 12); fio moving ours-nvme's
bytes; DeepSpeed ZeRO-2 cpu and ZeRO-3 nvme offload.
Subgroups are sized by ours (``subgroup_bytes=None``) unless ``--subgroup-bytes`` is given;
DeepSpeed's ``sub_group_size`` and fio's block follow them.

Per size, ``--rounds`` rounds (at least 2), the order of systems reversed every other round;
every system steps in a fresh process with the same thread count (``torch.set_num_threads`` and
``OMP_NUM_THREADS``), ``--warmup`` untimed steps then ``--steps`` timed ones. The last stdout line
is the JSON summary (``benchmarks/out/optim-step.json`` keeps a copy); logs of every child go to
benchmarks/out/optim-logs/. Exactness (``exact.py``) runs first, in this process, at 1.5M params.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common.paths import OUT_DIR, REPO_ROOT
from benchmarks.common.scratch import remove_at_exit
from benchmarks.optim.children import ChildFailed, run_child
from benchmarks.optim.exact import check_exact
from benchmarks.optim.io_floor import STATE_BYTES_PER_PARAM, measure_io_floor
from benchmarks.optim.model import param_shapes
from benchmarks.optim.summary import TARGETS, headline, summarize_size

DS_VENV = REPO_ROOT / ".venv-deepspeed"
DS_STAMP = DS_VENV / ".tierkit-deepspeed-requirements"
SYSTEMS = ["torch", "ours-dram", "ours-nvme", "ours-nvme-tier", "fio-floor"]
SYSTEMS += ["deepspeed-cpu", "deepspeed-nvme"]
_CHILD_TIMEOUT_S = 1800.0


def parse_size(text: str) -> int:
    scale = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}.get(text[-1].lower(), 1)
    return int(float(text.rstrip("kmbgKMBG")) * scale)


def deepspeed_ready(build: bool) -> str | None:
    """None when the DeepSpeed venv can run, else why not (building it first when ``build``)."""
    if build:
        done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "deepspeed_venv.sh")])
        if done.returncode != 0:
            return f"scripts/deepspeed_venv.sh failed ({done.returncode})"
    if not DS_STAMP.exists():
        return "no .venv-deepspeed (run scripts/deepspeed_venv.sh)"
    return None


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env["TORCH_EXTENSIONS_DIR"] = str(DS_VENV / "torch_extensions")
    env["DS_ACCELERATOR"] = "cpu"
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def subgroup_plan(params: int, subgroup_bytes: int | None) -> tuple[int, int]:
    """(subgroup bytes, mean object bytes) of ours-nvme on the benchmark's model: what
    ``OffloadedOptimizer(..., fused=True, master="params")`` picks (automatic unless given);
    fio's floor uses the object size, DeepSpeed's ``sub_group_size`` the subgroup."""
    from kvstore.optim.layout import build_layout
    from kvstore.optim.sizing import auto_subgroup_bytes

    sections = STATE_BYTES_PER_PARAM // 4
    chosen = subgroup_bytes or auto_subgroup_bytes(4 * params, sections)
    numels = [[math.prod(shape) for shape in param_shapes(params)]]
    subgroups = build_layout(numels, chosen // 4, split_params=False)
    return chosen, sum(s.object_bytes(sections) for s in subgroups) // len(subgroups)


def run_system(
    system: str, params: int, args: argparse.Namespace, scratch: Path, tag: str
) -> dict[str, Any]:
    """One round of one system: its record (peak RSS: the child's own VmHWM)."""
    subgroup_bytes, object_bytes = subgroup_plan(params, args.subgroup_bytes)
    if system == "fio-floor":
        floor = measure_io_floor(scratch / "fio", params, object_bytes)
        return {
            "step_s": [floor.floor_s],
            "peak_rss_bytes": 0,
            "fio_s": floor.seconds,
            "bytes_each_way": floor.bytes_each_way,
            "block_size_bytes": floor.block_size_bytes,
        }
    state_dir = scratch / f"{system}-state"
    shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True)
    common = [f"--params={params}", f"--warmup={args.warmup}", f"--steps={args.steps}"]
    common += [f"--threads={args.threads}", f"--directory={state_dir}"]
    if system.startswith("deepspeed-"):
        python = str(DS_VENV / "bin" / "python")
        device = system.removeprefix("deepspeed-")
        command = [python, "-m", "benchmarks.optim.deepspeed_peer", f"--device={device}"]
        command.append(f"--subgroup-bytes={subgroup_bytes}")  # as ours picks it
    else:
        command = [sys.executable, "-m", "benchmarks.optim.worker", f"--system={system}"]
        if args.subgroup_bytes:  # else ours sizes its subgroups itself, as users call it
            command.append(f"--subgroup-bytes={args.subgroup_bytes}")
    log_path = OUT_DIR / "optim-logs" / f"{tag}-{system}.log"
    try:
        result = run_child(
            command + common, child_env(args.threads), log_path, _CHILD_TIMEOUT_S, REPO_ROOT
        )
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    record = dict(result.record)
    record["wait4_maxrss_bytes"] = result.wait4_maxrss_bytes
    record["wall_s"] = result.wall_s
    return record


def measure_size(params: int, systems: list[str], args: argparse.Namespace) -> dict[str, Any]:
    scratch = remove_at_exit(OUT_DIR / "optim-scratch", args.keep_data)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    failures: dict[str, str] = {}
    for round_index in range(args.rounds):
        order = systems if round_index % 2 == 0 else systems[::-1]
        for system in order:
            if system in failures:
                continue
            tag = f"{params // 10**6}m-r{round_index}"
            print(f"[optim.step] {tag} {system} ...", file=sys.stderr, flush=True)
            try:
                record = run_system(system, params, args, scratch, tag)
            except (ChildFailed, RuntimeError) as failure:
                failures[system] = str(failure).splitlines()[0]
                print(f"[optim.step] {system} failed: {failure}", file=sys.stderr, flush=True)
                continue
            samples[system].append(record)
            print(f"[optim.step]   step_s {record['step_s']}", file=sys.stderr, flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return summarize_size(params, samples, failures)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="20M params, about two minutes")
    parser.add_argument("--sizes", default=None, help="comma list, e.g. 100m,500m,1000m")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--subgroup-bytes", type=int, default=None, help="default: automatic")
    parser.add_argument("--no-deepspeed", action="store_true")
    parser.add_argument("--keep-data", action="store_true")
    args = parser.parse_args(argv)
    sizes_text = args.sizes or ("20m" if args.quick else "100m,500m")
    sizes = [parse_size(text) for text in sizes_text.split(",")]
    systems = list(SYSTEMS)
    ds_absent = "--no-deepspeed" if args.no_deepspeed else deepspeed_ready(build=not args.quick)
    if ds_absent:
        systems = [name for name in systems if not name.startswith("deepspeed-")]
        print(f"[optim.step] DeepSpeed skipped: {ds_absent}", file=sys.stderr, flush=True)
    load_start = os.getloadavg()
    exact_dir = remove_at_exit(OUT_DIR / "optim-exact", args.keep_data)
    shutil.rmtree(exact_dir, ignore_errors=True)
    exact_runs = [check_exact("dram", None), check_exact("nvme", exact_dir / "nvme")]
    exact_runs.append(check_exact("nvme", exact_dir / "nvme-params", master="params"))
    shutil.rmtree(exact_dir, ignore_errors=True)
    by_size = {f"{p // 10**6}m": measure_size(p, systems, args) for p in sizes}
    primary = f"{max(sizes) // 10**6}m"
    summary: dict[str, Any] = headline(by_size, primary)
    summary["exact"] = all(run["exact"] for run in exact_runs)
    summary |= {"exact_runs": exact_runs, "sizes": by_size, "targets": TARGETS}
    summary["deepspeed"] = ds_absent or "measured"
    summary["misses"] = [f"{name}: {m}" for name, s in by_size.items() for m in s["misses"]]
    if not summary["exact"]:
        summary["misses"].append("exact: ours differs from torch AdamW")
    summary["mode"] = "quick" if args.quick else "full"
    summary["settings"] = {k: v for k, v in vars(args).items() if k != "quick"}
    summary["machine"] = f"{platform.node()} {platform.release()}, nproc={os.cpu_count()}"
    summary["loadavg_1_5_15"] = {"start": load_start, "end": os.getloadavg()}
    summary["date_utc"] = datetime.datetime.now(datetime.UTC).isoformat(" ", "seconds")
    line = json.dumps(summary)
    (OUT_DIR / "optim-step.json").write_text(line + "\n")
    print(line, flush=True)


if __name__ == "__main__":
    main()
