"""Shard writers and module-level per-sample work for the shard tests (workers import it by name).

``write_tar`` writes a WebDataset-style shard with Python's ``tarfile``; ``write_mds`` is a small
MDS writer built from the format's specification (``dataload/shards/mds_format.py``) -- the
``mosaicml-streaming`` package cannot be installed beside this project's numpy and transformers.
Payloads are derived from keys (``payload``), so a worker can check it got the right bytes.
"""

from __future__ import annotations

import io
import json
import pickle
import tarfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dataload import ShuffledLoader

SCALAR_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
SCALAR_DTYPES |= {"float16", "float32", "float64"}
NDARRAY_CODES = {"uint8": 8, "int8": 9, "uint16": 16, "int16": 17, "float16": 18, "uint32": 32}
NDARRAY_CODES |= {"int32": 33, "float32": 34, "uint64": 64, "int64": 65, "float64": 66}


def payload(key: str, ext: str) -> bytes:
    """The bytes the shard writers store for ``key``'s ``ext`` member (length varies with it)."""
    return f"{key}:{ext};".encode() * (1 + sum(map(ord, key)) % 7)


def write_tar(path: Path, members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT) -> Path:
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return path


def sample_members(keys: list[str], exts: tuple[str, ...] = ("png", "cls")) -> list:
    return [(f"{key}.{ext}", payload(key, ext)) for key in keys for ext in exts]


def write_shards(folder: Path, shards: int, per_shard: int) -> list[Path]:
    """``shards`` tar shards of ``per_shard`` samples each, keys ``s<shard>/<n>``."""
    folder.mkdir(parents=True, exist_ok=True)
    return [
        write_tar(
            folder / f"shard-{s:04d}.tar",
            sample_members([f"s{s}/{n:05d}" for n in range(per_shard)]),
        )
        for s in range(shards)
    ]


def checked_key(sample: dict[str, Any]) -> str:
    """The sample's key, after checking its members are that key's bytes."""
    key = sample["__key__"]
    for ext in ("png", "cls"):
        assert sample[ext] == payload(key, ext), (key, ext)
    return key


def checked_id(sample: dict[str, Any]) -> int:
    """The id an MDS test sample carries, after checking its text column matches it."""
    assert sample["text"] == f"row {sample['id']}" * (1 + sample["id"] % 5)
    return sample["id"]


def every_sample_once(
    dataset: Any, key_of: Callable[[Any], Any], world_size: int, workers: int, batch: int = 7
) -> Counter:
    """Counts of every key over one epoch at each rank (``rank_remainder="drop"``)."""
    seen: Counter = Counter()
    for rank in range(world_size):
        with ShuffledLoader(
            dataset,
            batch,
            seed=5,
            rank=rank,
            world_size=world_size,
            rank_remainder="drop",
            transform=key_of,
            collate_fn=list,
            num_workers=workers,
        ) as loader:
            for keys in loader:
                seen.update(keys)
    return seen


def mds_value(encoding: str, value: Any) -> bytes:
    name = encoding.split(":", 1)[0]
    if name in ("bytes", "png", "jpeg"):
        return bytes(value)
    if name in ("str", "str_int", "str_float", "str_decimal"):
        return str(value).encode()
    if name == "int":
        return np.int64(value).tobytes()
    if name in SCALAR_DTYPES:
        return np.dtype(name).type(value).tobytes()
    if name == "json":
        return json.dumps(value).encode()
    if name == "pkl":
        return pickle.dumps(value)
    if name == "ndarray":
        parts = encoding.split(":")[1:]
        head = b"" if parts and parts[0] else bytes([NDARRAY_CODES[value.dtype.name]])
        if len(parts) < 2:
            dims = np.array(value.shape, np.uint32)  # shape dtype code 2: uint32
            head += bytes([(value.ndim << 2) | 2]) + dims.tobytes()
        return head + value.tobytes()
    raise ValueError(encoding)


def fixed_size(encoding: str) -> int | None:
    name, _, rest = encoding.partition(":")
    if name == "int":
        return 8
    if name in SCALAR_DTYPES:
        return np.dtype(name).itemsize
    parts = rest.split(":")
    if name == "ndarray" and len(parts) == 2:
        return int(np.prod([int(d) for d in parts[1].split(",")])) * np.dtype(parts[0]).itemsize
    return None


def write_mds(folder: Path, columns: dict[str, str], rows: list[dict], per_shard: int) -> Path:
    """An MDS dataset of ``rows``, ``per_shard`` samples per uncompressed shard."""
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(columns)
    encodings = [columns[n] for n in names]
    sizes = [fixed_size(e) for e in encodings]
    shards = []
    for number, first in enumerate(range(0, len(rows), per_shard)):
        samples = []
        for row in rows[first : first + per_shard]:
            values = [mds_value(e, row[n]) for n, e in zip(names, encodings, strict=True)]
            lengths = [len(v) for v, s in zip(values, sizes, strict=True) if s is None]
            samples.append(np.array(lengths, "<u4").tobytes() + b"".join(values))
        entry: dict[str, Any] = {
            "column_encodings": encodings,
            "column_names": names,
            "column_sizes": sizes,
            "compression": None,
            "format": "mds",
            "hashes": [],
            "samples": len(samples),
            "size_limit": 1 << 26,
            "version": 2,
            "zip_data": None,
        }
        config = json.dumps(entry, sort_keys=True).encode()
        head = 4 + 4 * (len(samples) + 1) + len(config)
        offsets = np.cumsum([0] + [len(s) for s in samples]) + head
        data = np.uint32(len(samples)).tobytes() + offsets.astype("<u4").tobytes() + config
        data += b"".join(samples)
        basename = f"shard.{number:05d}.mds"
        (folder / basename).write_bytes(data)
        entry["raw_data"] = {"basename": basename, "bytes": len(data), "hashes": {}}
        shards.append(entry)
    (folder / "index.json").write_text(json.dumps({"shards": shards, "version": 2}))
    return folder
