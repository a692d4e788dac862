"""Workload (b): Fashion-MNIST images as 785-byte records (784 pixels + label), decoded per sample.

The Debian package ``dataset-fashion-mnist`` is installed with apt-get when missing (not in the
test suite's smoke mode); if that is not possible the workload is skipped with a note. Train and
test sets (70,000 images) go into one raw record file. Both loaders run the same transform per
sample (pixels -> float tensor in [0, 1], normalised; label -> int), so the comparison is the
loading machinery, not the decode.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks.dataload._measure import Run, time_run
from benchmarks.dataload._peers import RecordDataset, torch_loader
from dataload import FixedSizeSource, ShuffledLoader

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
RECORD_BYTES = 785
BATCH = 128
WORKLOAD = "fmnist"


def decode(raw: np.ndarray) -> tuple[torch.Tensor, int]:
    """One sample: normalised 1x28x28 float image and its label."""
    image = torch.from_numpy(raw[:784].astype(np.float32)).reshape(1, 28, 28)
    return (image / 255.0 - 0.2860) / 0.3530, int(raw[784])


def ensure_fmnist(notes: list[str], install: bool = True) -> bool:
    if (FMNIST_DIR / "train-images-idx3-ubyte.gz").exists():
        return True
    if not install:
        notes.append(f"(b) skipped: {FMNIST_DIR} is absent (apt-get install dataset-fashion-mnist)")
        return False
    print("(b) installing dataset-fashion-mnist with apt-get", file=sys.stderr, flush=True)
    done = subprocess.run(
        "apt-get install -y dataset-fashion-mnist || "
        "(apt-get update && apt-get install -y dataset-fashion-mnist)",
        shell=True,
        capture_output=True,
        text=True,
        check=False,
    )
    if (FMNIST_DIR / "train-images-idx3-ubyte.gz").exists():
        return True
    notes.append(f"(b) skipped: dataset-fashion-mnist unavailable ({done.stderr.strip()[-200:]})")
    return False


def build_records(path: Path) -> int:
    if path.exists():
        return path.stat().st_size // RECORD_BYTES
    rows = []
    for split in ("train", "t10k"):
        with gzip.open(FMNIST_DIR / f"{split}-images-idx3-ubyte.gz") as f:
            images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
        with gzip.open(FMNIST_DIR / f"{split}-labels-idx1-ubyte.gz") as f:
            labels = np.frombuffer(f.read(), np.uint8, offset=8)
        rows.append(np.concatenate([images, labels[:, None]], axis=1))
    data = np.concatenate(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.tobytes())
    return len(data)


def run_fmnist(out: Path, mode: str, rounds: int, notes: list[str]) -> list[Run]:
    """Part (b); ``mode`` is "full", "quick" or "smoke" (no install, a few batches)."""
    if not ensure_fmnist(notes, install=mode != "smoke"):
        print(notes[-1], flush=True)
        return []
    path = out / "dataload_fmnist.rec"
    count = build_records(path)
    print(f"(b) Fashion-MNIST: {count} records of {RECORD_BYTES} bytes, {path}", flush=True)
    quick = mode != "full"
    max_samples = {"full": count, "quick": 20_000, "smoke": 1_000}[mode]
    max_time_s = {"full": 30.0, "quick": 6.0, "smoke": 0.5}[mode]
    runs = []
    for round_index in range(rounds):
        seed = 200 + round_index
        for workers in (0, 2, 4) if not quick else (0, 2):

            def ours(workers: int = workers, seed: int = seed) -> tuple:
                source = FixedSizeSource(path, RECORD_BYTES)
                loader = ShuffledLoader(
                    source, BATCH, seed=seed, transform=decode, num_workers=workers
                )
                return iter(loader), loader.close

            def theirs(workers: int = workers, seed: int = seed) -> tuple:
                dataset = RecordDataset(path, RECORD_BYTES, count, transform=decode)
                return torch_loader(dataset, BATCH, workers, seed)

            for name, start in ((f"tierkit_w{workers}", ours), (f"torch_nw{workers}", theirs)):
                run = time_run(
                    WORKLOAD,
                    name,
                    round_index,
                    [path],
                    start,
                    lambda b: int(b[0].shape[0]),
                    lambda b: int(b[0].shape[0]) * RECORD_BYTES,
                    max_samples,
                    max_time_s,
                )
                _print(run)
                runs.append(run)
    return runs


def _print(run: Run) -> None:
    print(
        f"  round {run.round_index} {run.workload} {run.loader:12s} {run.samples_per_s:9,.0f} "
        f"samples/s cpu {run.cpu_us_per_sample:6.1f} us/sample "
        f"first {run.first_batch_s * 1e3:6.1f} ms",
        flush=True,
    )
