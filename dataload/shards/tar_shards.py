"""TarShards: WebDataset-style tar shards as one map-style Dataset, every sample one ranged read.

``TarShards("data/shard-{000000..000099}.tar")`` (or a list of paths) indexes each shard once
(``tar_index.py``: members grouped by key as WebDataset groups them, cached in a sidecar) and
numbers the samples of all shards 0..N-1 in shard order. Sample ``i`` is a dict as WebDataset
yields it -- ``{"__key__": key, "__url__": shard path, <extension>: bytes, ...}`` -- passed
through ``transform`` when one is given.

It implements :mod:`dataload.located` (``locate_many`` too): a sample's members are
consecutive in its shard, so ``locate(i)`` is the one byte range from the first member's data
to the end of the last member's (headers between them included, a few hundred bytes) and
``decode`` slices the members out of it. Under ``ShuffledLoader`` the I/O core therefore reads
a whole batch -- samples from any shards, in a global shuffle -- in one submission built from
arrays; rank slicing, exact resume and process
workers come with the loader, unchanged. Under DataLoader ``__getitem__`` does the one read
itself.

Invariants: the index is built at construction and never changes; a shard modified afterwards
must be re-opened (a new ``TarShards``), which re-indexes it. Concurrency: immutable after
construction; any thread or process may call any method (it pickles compactly to workers: the
index is a few numpy arrays).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from dataload.errors import SampleIndexError, SourceError
from dataload.located import checked_batch
from dataload.shards.tar_index import load_index
from tiers.io import map_os_errors

__all__ = ["TarShards", "expand_shards"]

_BRACES = re.compile(r"\{([^{}]*)\}")


def expand_shards(shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """Shard paths from a path, a list of paths, or a brace pattern: ``{000..009}`` (a numeric
    range, zero-padded to the width of its first bound) and ``{a,b}`` (alternatives)."""
    if isinstance(shards, str | os.PathLike):
        pattern = os.fspath(shards)
        match = _BRACES.search(pattern)
        if match is None:
            return [pattern]
        head, tail, body = pattern[: match.start()], pattern[match.end() :], match.group(1)
        if ".." in body:
            low, high = body.split("..", 1)
            if not (low.isdigit() and high.isdigit()):
                raise SourceError(pattern, f"brace range {{{body}}} is not numeric")
            width = len(low) if low.startswith("0") else 0
            choices = [f"{n:0{width}d}" for n in range(int(low), int(high) + 1)]
        else:
            choices = body.split(",")
        return [path for c in choices for path in expand_shards(head + c + tail)]
    return [path for item in shards for path in expand_shards(item)]


class TarShards(Dataset):
    """The samples of WebDataset tar shards, indexed once, each read with one ranged read.

    Args:
        shards: a path, a brace pattern (``"shard-{000000..000009}.tar"``) or a list of them.
        transform: applied to each sample dict (in the loader's workers).
        cache_dir: where sidecars go when a shard's folder is not writable (default:
            ``$TIERKIT_CACHE_DIR/tar-index`` or ``~/.cache/tierkit/tar-index``).
    Raises:
        FileMissingError: a shard does not exist. SourceFormatError: a shard is not a readable
        tar (truncated, corrupt header, compressed), naming it. SourceError: no samples at all.
    """

    def __init__(
        self,
        shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        transform: Callable[[dict[str, Any]], Any] | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.shards = expand_shards(shards)
        self.transform = transform
        if not self.shards:
            raise SourceError(str(shards), "no shards")
        extra = len(self.shards) - 1
        self.root = self.shards[0] + (f" (+{extra} shards)" if extra else "")
        cache = os.fspath(cache_dir) if cache_dir is not None else None
        fields: dict[str, int] = {}
        firsts, offsets, sizes, field_ids, shard_of, keys = [], [], [], [], [], []
        members = 0
        self.indexed_now = 0  # shards (re)indexed by this constructor; the rest had sidecars
        for number, path in enumerate(self.shards):
            index, built = load_index(path, cache)
            self.indexed_now += built
            remap = np.array([fields.setdefault(f, len(fields)) for f in index.fields], np.int32)
            firsts.append(index.first_member[:-1] + members)
            offsets.append(index.member_offset)
            sizes.append(index.member_size)
            field_ids.append(remap[index.member_field] if len(remap) else index.member_field)
            shard_of.append(np.full(index.sample_count, number, np.int32))
            keys.extend(index.keys)
            members += len(index.member_offset)
        if not keys:
            raise SourceError(self.root, "no samples: no member names of the form <key>.<ext>")
        self.fields = list(fields)
        self._first = np.concatenate([*firsts, [members]]).astype(np.int64)
        offset, size = np.concatenate(offsets), np.concatenate(sizes)
        self._shard_of = np.concatenate(shard_of)
        last = self._first[1:] - 1
        self._span_start = offset[self._first[:-1]]
        self._span_size = offset[last] + size[last] - self._span_start
        # per member: (offset within its sample's span, size, field) -- one slice per decode
        sample_of = np.repeat(np.arange(len(self._shard_of)), np.diff(self._first))
        relative = offset - self._span_start[sample_of]
        self._members = np.stack([relative, size, np.concatenate(field_ids)], axis=1)
        encoded = [k.encode("utf-8", "surrogateescape") for k in keys]
        self._keys = b"".join(encoded)
        self._key_ends = np.cumsum([0] + [len(k) for k in encoded], dtype=np.int64)

    def __len__(self) -> int:
        return len(self._shard_of)

    def key(self, index: int) -> str:
        """The WebDataset key of sample ``index``."""
        raw = self._keys[int(self._key_ends[index]) : int(self._key_ends[index + 1])]
        return raw.decode("utf-8", "surrogateescape")

    def _check(self, index: int) -> int:
        return SampleIndexError.check(self.root, index, len(self))

    def locate(self, index: int) -> tuple[str, int, int]:
        """(shard path, offset, length) of the byte range holding all of the sample's members."""
        index = self._check(index)
        shard = self.shards[self._shard_of[index]]
        return shard, int(self._span_start[index]), int(self._span_size[index])

    def locate_many(self, indices: Any) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`locate` for a batch, as arrays: (shard paths, shard of each sample, offsets,
        lengths) -- the loader's I/O core then builds the batch's reads without a Python object
        per sample."""
        indices = checked_batch(self.root, indices, len(self))
        spans = self._span_start[indices], self._span_size[indices]
        return self.shards, self._shard_of[indices], *spans

    def decode(self, index: int, data: Any) -> Any:
        """Sample ``index`` from the bytes of its range (``data``: as ``locate`` describes)."""
        index = self._check(index)
        first, end = self._first[index : index + 2].tolist()
        sample: dict[str, Any] = {
            "__key__": self.key(index),
            "__url__": self.shards[self._shard_of[index]],
        }
        view, fields = memoryview(data), self.fields
        for at, size, field in self._members[first:end].tolist():
            sample[fields[field]] = bytes(view[at : at + size])
        return self.transform(sample) if self.transform is not None else sample

    def __getitem__(self, index: int) -> Any:
        path, offset, length = self.locate(index)
        with map_os_errors(path), open(path, "rb") as file:
            data = os.pread(file.fileno(), length, offset)
        if len(data) < length:
            raise SourceError(path, "shard shorter than its index: re-open the dataset")
        return self.decode(index, data)

    def __repr__(self) -> str:
        return f"TarShards({self.root!r}, {len(self)} samples, fields {self.fields})"
