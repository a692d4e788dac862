"""Workload (c): Debian package descriptions as Parquet, tokenised per sample.

``../shared/data/debian-minilm/docs.jsonl`` (62k docs) becomes a Parquet file (id, text; row
groups of 1,024 rows). The tokenizer is deliberately simple and deterministic -- lower-case,
split on non-alphanumerics, CRC-32 of each word modulo a 32k vocabulary, truncated or padded to
128 ids -- the same function for every loader. Peers: DataLoader over the Parquet table read
with pyarrow (map-style, RandomSampler), and HF ``datasets`` (``Dataset.from_parquet``, random
access through the same DataLoader) when it can be installed.
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from _dataload_measure import Run, time_run
from _dataload_peers import ensure_hf_datasets, torch_loader
from torch.utils.data import Dataset

from dataload import ParquetSource, ShuffledLoader

DOCS = Path(__file__).resolve().parents[2] / "shared/data/debian-minilm/docs.jsonl"
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


def build_parquet(path: Path) -> int:
    if not path.exists():
        ids, texts = [], []
        with open(DOCS) as file:
            for line in file:
                doc = json.loads(line)
                ids.append(doc["id"])
                texts.append(doc["text"])
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"id": ids, "text": texts}), path, row_group_size=1024)
    return pq.ParquetFile(path).metadata.num_rows


def run_text(out: Path, quick: bool, rounds: int, notes: list[str]) -> list[Run]:
    if not DOCS.exists():
        notes.append(f"(c) skipped: {DOCS} is absent")
        print(notes[-1], flush=True)
        return []
    path = out / "dataload_docs.parquet"
    count = build_parquet(path)
    print(f"(c) Parquet text: {count} docs, {path.stat().st_size / 1e6:.0f} MB, {path}", flush=True)
    hf = _hf_dataset(path, out, notes)
    max_samples, max_time_s = (6_000, 6.0) if quick else (count, 15.0)
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


def _hf_dataset(path: Path, out: Path, notes: list[str]):
    reason = ensure_hf_datasets()
    if reason is not None:
        notes.append(f"(c) HF datasets peer skipped: {reason}")
        print(notes[-1], flush=True)
        return None
    import datasets

    return datasets.Dataset.from_parquet(str(path), cache_dir=str(out / "hf_cache"))
