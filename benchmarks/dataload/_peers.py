"""The peers: torch's DataLoader over a stock map-style dataset, and HF ``datasets``.

``RecordDataset`` is what a PyTorch user writes for a file of fixed-size records: one ``pread``
per ``__getitem__``, a tensor per sample, the default collate stacking them. The file descriptor
is opened lazily in each worker (a descriptor shared across fork would share its offset; pread
does not use it, but opening per process is the usual, safe pattern).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

__all__ = ["RecordDataset", "ensure_hf_datasets", "torch_loader"]


class RecordDataset(Dataset):
    """Fixed-size records of one file, one ``os.pread`` per sample; optional transform."""

    def __init__(
        self,
        path: Path,
        record_size_bytes: int,
        count: int,
        header_bytes: int = 0,
        transform: Callable[[np.ndarray], Any] | None = None,
    ) -> None:
        self.path = str(path)
        self.record_size_bytes = record_size_bytes
        self.count = count
        self.header_bytes = header_bytes
        self.transform = transform
        self._fd: int | None = None
        self._pid = -1

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> Any:
        if self._fd is None or self._pid != os.getpid():
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        offset = self.header_bytes + index * self.record_size_bytes
        raw = np.frombuffer(os.pread(self._fd, self.record_size_bytes, offset), np.uint8)
        if self.transform is not None:
            return self.transform(raw)
        return torch.from_numpy(raw.copy())


def torch_loader(
    dataset: Dataset, batch_size: int, num_workers: int, seed: int
) -> tuple[Iterator[Any], Callable[[], None]]:
    """A DataLoader with RandomSampler (global shuffle), its iterator, and a closer."""
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=RandomSampler(dataset, generator=generator),
        num_workers=num_workers,
    )
    iterator = iter(loader)

    def close() -> None:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    return iterator, close


def ensure_hf_datasets(install: bool = True) -> str | None:
    """Import HF ``datasets``, pip-installing it into this venv when absent (and ``install``);
    None or the reason it is not there."""
    try:
        import datasets

        return None
    except ImportError:
        if not install:
            return "HF datasets is not installed (not installed in smoke mode)"
    print("HF datasets not installed: pip install datasets", file=sys.stderr, flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "datasets"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        return f"pip install datasets failed: {done.stderr.strip()[-300:]}"
    try:
        import datasets  # noqa: F401
    except ImportError as exc:
        return f"datasets still not importable after pip install: {exc}"
    return None
