"""Workload (c): Debian package descriptions as Parquet, tokenised per sample.

``../shared/data/debian-minilm/docs.jsonl`` (62k docs; the test suite's smoke mode takes the
first 4,096) becomes a Parquet file (id, text; row groups of 1,024 rows). The tokenizer is
deliberately simple and deterministic -- lower-case, split on non-alphanumerics, CRC-32 of each
word modulo a 32k vocabulary, truncated or padded to 128 ids -- the same function for every
loader. Peers: DataLoader over the Parquet table read with pyarrow (map-style, RandomSampler),
and HF ``datasets`` (``Dataset.from_parquet``, random access through the same DataLoader) when
it can be installed (smoke mode: when it is already).
"""

from __future__ import annotations

import itertools
import json
import re
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from benchmarks.common.paths import SHARED_DATA
from benchmarks.dataload._measure import Run, time_run
from benchmarks.dataload._peers import ensure_hf_datasets, torch_loader
from dataload import ParquetSource, ShuffledLoader

DOCS = SHARED_DATA / "debian-minilm" / "docs.jsonl"
SMOKE_DOCS = 4096
WORKLOAD = "parquet_text"
BATCH = 64
TOKENS = 128
_WORD = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> torch.Tensor:
    ids = [zlib.crc32(w.encode()) % 32768 for w in _WORD.findall(text.lower())[:TOKENS]]
    out = np.zeros(TOKENS, np.int64)
    out[: len(ids)] = ids
    return torch.from_numpy(out)


def sample_tokens(sample: dict) -> torch.Tensor:
    return tokenize(sample["text"])


class TableDataset(Dataset):
    """Map-style dataset over a pyarrow table held in memory (read once, in the timed region)."""

    def __init__(self, path: Path) -> None:
        self.texts = pq.read_table(path, columns=["text"]).column("text")

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> torch.Tensor:
        return tokenize(self.texts[index].as_py())


class HFDataset(Dataset):
    def __init__(self, hf) -> None:
        self.hf = hf

    def __len__(self) -> int:
        return len(self.hf)

    def __getitem__(self, index: int) -> torch.Tensor:
        return tokenize(self.hf[int(index)]["text"])


def build_parquet(path: Path, limit: int | None = None) -> int:
    """Write the first ``limit`` docs (all by default) to ``path`` unless it exists; rows."""
    if not path.exists():
        ids, texts = [], []
        with open(DOCS) as file:
            for line in itertools.islice(file, limit):
                doc = json.loads(line)
                ids.append(doc["id"])
                texts.append(doc["text"])
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"id": ids, "text": texts}), path, row_group_size=1024)
    return pq.ParquetFile(path).metadata.num_rows


def run_text(out: Path, mode: str, rounds: int, notes: list[str]) -> list[Run]:
    """Part (c); ``mode`` is "full", "quick" or "smoke" (4,096 docs, no pip install)."""
    if not DOCS.exists():
        notes.append(f"(c) skipped: {DOCS} is absent")
        print(notes[-1], flush=True)
        return []
    smoke = mode == "smoke"
    path = out / ("dataload_docs_smoke.parquet" if smoke else "dataload_docs.parquet")
    count = build_parquet(path, SMOKE_DOCS if smoke else None)
    print(f"(c) Parquet text: {count} docs, {path.stat().st_size / 1e6:.0f} MB, {path}", flush=True)
    hf = _hf_dataset(path, out, notes, install=not smoke)
    quick = mode != "full"
    budgets = {"full": (count, 15.0), "quick": (6_000, 6.0), "smoke": (500, 0.5)}
    max_samples, max_time_s = budgets[mode]
    runs = []
    for round_index in range(rounds):
        seed = 300 + round_index
        for workers in (0, 2) if quick else (0, 2, 4):
            starts = {
                f"tierkit_w{workers}": _ours(path, workers, seed),
                f"torch_nw{workers}": lambda w=workers, s=seed: torch_loader(
                    TableDataset(path), BATCH, w, s
                ),
            }
            if hf is not None:
                starts[f"hf_datasets_nw{workers}"] = lambda w=workers, s=seed: torch_loader(
                    HFDataset(hf), BATCH, w, s
                )
            for name, start in starts.items():
                run = time_run(
                    WORKLOAD,
                    name,
                    round_index,
                    [path],
                    start,
                    lambda b: int(b.shape[0]),
                    lambda b: int(b.shape[0]) * TOKENS * 8,
                    max_samples,
                    max_time_s,
                )
                print(
                    f"  round {round_index} {WORKLOAD} {name:16s} {run.samples_per_s:9,.0f} "
                    f"samples/s cpu {run.cpu_us_per_sample:6.1f} us/sample "
                    f"first {run.first_batch_s * 1e3:6.1f} ms",
                    flush=True,
                )
                runs.append(run)
    return runs


def _ours(path: Path, workers: int, seed: int):
    def start() -> tuple:
        source = ParquetSource(path, columns=["text"])
        loader = ShuffledLoader(
            source, BATCH, seed=seed, transform=sample_tokens, num_workers=workers
        )
        return iter(loader), loader.close

    return start


def _hf_dataset(path: Path, out: Path, notes: list[str], install: bool = True):
    reason = ensure_hf_datasets(install)
    if reason is not None:
        notes.append(f"(c) HF datasets peer skipped: {reason}")
        print(notes[-1], flush=True)
        return None
    import datasets

    return datasets.Dataset.from_parquet(str(path), cache_dir=str(out / "hf_cache"))
