"""MDSShards: a Mosaic Streaming MDS dataset folder as one map-style Dataset with located bytes.

``MDSShards(folder)`` reads ``folder/index.json`` and the offset table at the head of every
shard (``mds_format.py`` has the layout), numbering the samples of all shards 0..N-1 in index
order. Sample ``i`` is ``{column: value}`` decoded per the shard's column encodings (jpeg/png
stay bytes unless ``decode_images``), passed through ``transform`` when one is given.

It implements :mod:`dataload.located`: ``locate(i)`` is the sample's byte range in its shard, so
under ``ShuffledLoader`` the I/O core reads a whole globally shuffled batch in one submission and
the workers only decode; rank slicing, exact resume and process workers come with the loader.

Checked at construction, each raising :class:`~dataload.errors.SourceFormatError` naming the
shard: a compressed shard, an unsupported encoding, a shard file whose sample count, offsets or
size disagree with ``index.json`` (truncated or replaced). Concurrency: immutable after
construction (column decoders are rebuilt lazily in each process); any thread may call any
method.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from dataload.errors import SampleIndexError, SourceError, SourceFormatError
from dataload.located import checked_batch
from dataload.shards.mds_format import Decoder, column_decoder, parse_index, split_sample
from tiers.io import map_os_errors

__all__ = ["MDSShards"]


class MDSShards(Dataset):
    """The samples of an MDS dataset folder (``index.json`` + uncompressed ``.mds`` shards).

    Args:
        root: the folder holding ``index.json`` (or the path of ``index.json`` itself).
        transform: applied to each sample dict (in the loader's workers).
        decode_images: jpeg/png columns as PIL images (default: their encoded bytes).
        allow_unsafe_types: read ``pkl`` columns (unpickling runs code from the data).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Callable[[dict[str, Any]], Any] | None = None,
        *,
        decode_images: bool = False,
        allow_unsafe_types: bool = False,
    ) -> None:
        root = os.fspath(root)
        index_path = root if root.endswith(".json") else os.path.join(root, "index.json")
        self.root = os.path.dirname(index_path) or "."
        self.transform = transform
        self.decode_images, self.allow_unsafe_types = decode_images, allow_unsafe_types
        with map_os_errors(index_path), open(index_path, "rb") as file:
            entries = parse_index(file.read(), index_path)
        self.shards: list[str] = []
        self._schemas: list[tuple[tuple[str, ...], tuple[str, ...], tuple[int | None, ...]]] = []
        schema_of: list[int] = []
        starts, sizes, shard_of = [], [], []
        for number, entry in enumerate(entries):
            path = os.path.join(self.root, entry["raw_data"]["basename"])
            schema = (
                tuple(entry["column_names"]),
                tuple(entry["column_encodings"]),
                tuple(entry["column_sizes"]),
            )
            if schema not in self._schemas:
                self._schemas.append(schema)
                self._decoders(len(self._schemas) - 1, path)  # unsupported encodings fail here
            schema_of.append(self._schemas.index(schema))
            offsets = _read_offsets(path, entry)
            starts.append(offsets[:-1])
            sizes.append(np.diff(offsets))
            shard_of.append(np.full(len(offsets) - 1, number, np.int32))
            self.shards.append(path)
        if not self.shards or not sum(len(s) for s in starts):
            raise SourceError(index_path, "no samples")
        self._schema_of = np.array(schema_of, np.int32)
        self._start = np.concatenate(starts)
        self._size = np.concatenate(sizes)
        self._shard_of = np.concatenate(shard_of)
        self._cache: dict[int, list[Decoder]] = {}

    @property
    def columns(self) -> dict[str, str]:
        """Column name -> encoding (of the first shard)."""
        names, encodings, _ = self._schemas[0]
        return dict(zip(names, encodings, strict=True))

    def __len__(self) -> int:
        return len(self._shard_of)

    def _check(self, index: int) -> int:
        return SampleIndexError.check(self.root, index, len(self))

    def locate(self, index: int) -> tuple[str, int, int]:
        """(shard path, offset, length) of sample ``index``'s bytes."""
        index = self._check(index)
        return self.shards[self._shard_of[index]], int(self._start[index]), int(self._size[index])

    def locate_many(self, indices: Any) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`locate` for a batch, as arrays (shard paths, shard ids, offsets, lengths)."""
        indices = checked_batch(self.root, indices, len(self))
        return self.shards, self._shard_of[indices], self._start[indices], self._size[indices]

    def decode(self, index: int, data: Any) -> Any:
        """Sample ``index`` from its bytes: ``{column: value}``, then ``transform``."""
        index = self._check(index)
        shard = int(self._shard_of[index])
        schema = int(self._schema_of[shard])
        names, _, sizes = self._schemas[schema]
        values = split_sample(memoryview(data), list(sizes))
        decoders = self._decoders(schema, self.shards[shard])
        sample = {
            name: decoder(value)
            for name, decoder, value in zip(names, decoders, values, strict=True)
        }
        return self.transform(sample) if self.transform is not None else sample

    def __getitem__(self, index: int) -> Any:
        path, offset, length = self.locate(index)
        with map_os_errors(path), open(path, "rb") as file:
            data = os.pread(file.fileno(), length, offset)
        return self.decode(index, data)

    def _decoders(self, schema: int, where: str) -> list[Decoder]:
        decoders = self._cache.get(schema) if hasattr(self, "_cache") else None
        if decoders is None:
            _, encodings, _ = self._schemas[schema]
            decoders = [
                column_decoder(e, where, images=self.decode_images, unsafe=self.allow_unsafe_types)
                for e in encodings
            ]
            if hasattr(self, "_cache"):
                self._cache[schema] = decoders
        return decoders

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": {}}  # decoders are closures: rebuilt per process

    def __repr__(self) -> str:
        return f"MDSShards({self.root!r}, {len(self)} samples, columns {self.columns})"


def _read_offsets(path: str, entry: dict[str, Any]) -> np.ndarray:
    """The shard's sample offsets, checked against its index entry and its file size."""
    with map_os_errors(path), open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        head = file.read(4)
        count = int.from_bytes(head, "little") if len(head) == 4 else -1
        if count != entry["samples"]:
            raise SourceFormatError(
                path, f"holds {count} samples by its header, index.json says {entry['samples']}"
            )
        raw = file.read(4 * (count + 1))
    if len(raw) < 4 * (count + 1):
        raise SourceFormatError(path, f"truncated: {size} bytes, shorter than its offset table")
    offsets = np.frombuffer(raw, "<u4").astype(np.int64)
    expected = entry["raw_data"].get("bytes")
    if (
        offsets[0] < 4 * (count + 2)
        or (np.diff(offsets) < 0).any()
        or offsets[-1] != size
        or (expected is not None and expected != size)
    ):
        raise SourceFormatError(
            path,
            f"truncated or corrupt: offsets end at {int(offsets[-1])}, the file has {size} "
            f"bytes, index.json says {expected}",
        )
    return offsets
