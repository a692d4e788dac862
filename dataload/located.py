"""The located-bytes protocol: a map-style Dataset that can say where each sample's bytes are.

A plain map-style ``Dataset`` (``__len__`` + ``__getitem__``) works with ``ShuffledLoader`` as
it is: workers call ``__getitem__``, which does its own reads, one sample at a time. A dataset
that also implements the two methods below lets the loader do the reading instead: the I/O
core reads every sample of a batch (and of the batches after it) in one submission, ahead of
time, and the worker only decodes::

    class MyDataset(torch.utils.data.Dataset):
        def __len__(self) -> int: ...
        def __getitem__(self, index):                  # still used by DataLoader
            path, offset, length = self.locate(index)
            with open(path, "rb") as f:
                f.seek(offset)
                return self.decode(index, f.read(length))

        def locate(self, index: int) -> tuple[str, int, int]:
            '''(path, offset in bytes, length in bytes) of sample ``index``.'''

        def decode(self, index: int, data) -> Any:
            '''Sample ``index`` from its bytes (``data``: a read-only bytes-like view, valid
            only during the call -- copy what you keep).'''

A dataset with many samples per file can also say where a whole batch is, in one vectorised
call the loader then prefers (``locate`` is still required: DataLoader users and errors use it)::

        def locate_many(self, indices: np.ndarray) -> tuple[Sequence[str], np.ndarray, np.ndarray,
                                                           np.ndarray]:
            '''(paths, path_ids, offsets, lengths): sample ``indices[j]`` is ``lengths[j]``
            bytes at ``offsets[j]`` of ``paths[path_ids[j]]``; ``paths`` may be the dataset's
            whole file table (only the entries named by ``path_ids`` are opened).'''

Rules: ``locate`` must be cheap (no I/O: keep an index) and deterministic; ``decode(i,
bytes_at(locate(i)))`` must equal ``__getitem__(i)``. Many samples may share a file (a shard,
a packed file); the loader keeps a bounded set of files open. A file that cannot be read, or
is shorter than ``offset + length``, fails that sample (SampleReadError, CorruptSampleError),
which ``on_error="skip"`` drops like any other.

:class:`~dataload.image_folder.ImageFolder` implements it for a folder of image files.

Concurrency: ``locate`` is called on the loader's I/O thread, ``decode`` in its workers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dataload.errors import SampleIndexError
from tiers.io import InvalidArgumentError

__all__ = ["LocatedDataset", "checked_batch", "is_located", "locate_batch"]


@runtime_checkable
class LocatedDataset(Protocol):
    """A map-style dataset whose samples are byte ranges of files (see the module doc)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...

    def locate(self, index: int) -> tuple[str, int, int]: ...

    def decode(self, index: int, data: Any) -> Any: ...


def is_located(dataset: object) -> bool:
    """Whether ``dataset`` implements the located-bytes protocol (both methods callable)."""
    return callable(getattr(dataset, "locate", None)) and callable(getattr(dataset, "decode", None))


def checked_batch(name: str, indices: Any, count: int) -> np.ndarray:
    """``indices`` as int64, or SampleIndexError naming the first outside ``0 <= i < count``."""
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    if len(indices) and (indices.min() < 0 or indices.max() >= count):
        bad = int(indices[(indices < 0) | (indices >= count)][0])
        raise SampleIndexError(name, bad, f"out of range for {count} samples")
    return indices


def locate_batch(
    dataset: Any, indices: np.ndarray
) -> tuple[Sequence[str], np.ndarray, np.ndarray, np.ndarray]:
    """``(paths, path_ids, offsets, lengths)`` of a batch: from ``locate_many`` when the dataset
    has it, else from one ``locate`` per sample (paths then numbered in order of appearance)."""
    many = getattr(dataset, "locate_many", None)
    if callable(many):
        paths, path_ids, offsets, lengths = many(indices)
        arrays = [np.asarray(a, dtype=np.int64).reshape(-1) for a in (path_ids, offsets, lengths)]
        if any(len(a) != len(indices) for a in arrays):
            name = type(dataset).__name__
            raise InvalidArgumentError(f"{name}.locate_many: not one path id, offset, length each")
        return paths, arrays[0], arrays[1], arrays[2]
    spots = [dataset.locate(i) for i in indices.tolist()]
    table: dict[str, int] = {}
    ids = (table.setdefault(os.fspath(spot[0]), len(table)) for spot in spots)
    path_ids = np.fromiter(ids, np.int64, len(spots))
    offsets = np.fromiter((int(spot[1]) for spot in spots), np.int64, len(spots))
    lengths = np.fromiter((int(spot[2]) for spot in spots), np.int64, len(spots))
    return list(table), path_ids, offsets, lengths
