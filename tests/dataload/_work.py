"""Module-level work for the process-worker tests: worker processes import it by name.

Stamped records are the conftest's: sample i is int64 i then int64 7 i.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

IMPORTED_IN_PID = os.getpid()  # in a worker: the forkserver's pid when it preloaded this module


def stamp_id(raw: np.ndarray) -> int:
    """The index a stamped record carries."""
    return int(raw.view("<i8")[0])


def stamp_pair(raw: np.ndarray) -> tuple[torch.Tensor, int]:
    index, seven = raw.view("<i8").tolist()
    return torch.tensor([float(index)]), seven


def pid_and_import_pid(raw: np.ndarray) -> torch.Tensor:
    """(this process, the process that imported this module) for a stamped record."""
    return torch.tensor([os.getpid(), IMPORTED_IN_PID])


def slow_stamp_id(raw: np.ndarray) -> int:
    time.sleep(0.02)
    return stamp_id(raw)


def fails_on_13(raw: np.ndarray) -> int:
    index = stamp_id(raw)
    if index == 13:
        raise ValueError("undecodable")
    return index


def worker_facts(raw: np.ndarray) -> tuple[int, int, int, int, int]:
    """(sample, worker id, torch.initial_seed, pid, worker_init_fn's mark) of the worker."""
    info = get_worker_info()
    assert info is not None
    mark = int(os.environ.get("TIERKIT_TEST_INIT_MARK", "-1"))
    return stamp_id(raw), info.id, torch.initial_seed(), os.getpid(), mark


def init_mark(worker_id: int) -> None:
    os.environ["TIERKIT_TEST_INIT_MARK"] = str(100 + worker_id)
    random.seed(0)  # worker_init_fn may reseed what it likes


def init_fails(worker_id: int) -> None:
    raise RuntimeError(f"no GPU for worker {worker_id}")


class IdDataset(Dataset):
    """Plain map-style dataset: sample i is (i, 3 i) as tensors."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.count:
            raise IndexError(index)
        return torch.tensor(index), torch.tensor(3 * index)


class BatchedIdDataset(IdDataset):
    """The same with ``__getitems__`` (DataLoader's batched fetch), counting its calls."""

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.tensor(i), torch.tensor(-3 * i)) for i in indices]


class BrokenItemDataset(IdDataset):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == 21:
            raise KeyError("no such row")
        return super().__getitem__(index)


class StampFileDataset(Dataset):
    """Located bytes: the stamped record file, one 16-byte range per sample."""

    def __init__(self, path: Path, count: int) -> None:
        self.path, self.count = str(path), count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> int:
        with open(self.path, "rb") as file:
            file.seek(16 * index)
            return self.decode(index, file.read(16))

    def locate(self, index: int) -> tuple[str, int, int]:
        return self.path, 16 * index, 16

    def decode(self, index: int, data) -> int:
        value = int(np.frombuffer(data, "<i8")[0])
        assert value == index, (value, index)
        return value


def first_of(sample: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return sample[0]
