"""Mosaic Streaming's MDS format, read from its specification (``streaming/base/format/mds``).

A dataset folder holds ``index.json``, ``{"version": 2, "shards": [...]}``, one entry per shard:
``format`` "mds", ``column_names`` (sorted), ``column_encodings``, ``column_sizes`` (bytes per
value for fixed-size encodings, null for variable ones), ``samples``, ``compression`` (null when
the shard is stored raw) and ``raw_data`` / ``zip_data`` (``basename`` relative to the folder,
``bytes``). An uncompressed shard file is::

    u32 n                          number of samples
    u32 offsets[n + 1]             sample i is bytes offsets[i] .. offsets[i+1] of the file
    config                         the shard's JSON entry (offsets[0] points past it)
    samples

and a sample is ``u32 size`` for each variable-size column, in column order, followed by every
column's value, in column order. All integers little-endian. Value encodings read here: bytes,
str, int (int64), the numpy scalars (uint8..uint64, int8..int64, float16/32/64), str_int,
str_float, str_decimal, json, pkl (pickle: only with ``allow_unsafe_types``, as Streaming),
jpeg/png (raw bytes, or PIL images with ``decode_images``), pil (width, height, mode header +
raw pixels) and ndarray (``ndarray``, ``ndarray:<dtype>`` or ``ndarray:<dtype>:<d0,d1,..>``;
dtype and shape not fixed by the encoding are stored per value). Other encodings (list[...],
jpeg_array) and compressed shards raise :class:`~dataload.errors.SourceFormatError` naming them.

Concurrency: pure functions and immutable column decoders; any thread may use them.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy as np

from dataload.errors import SourceFormatError

__all__ = ["SCALARS", "column_decoder", "parse_index", "split_sample"]

_SCALAR_NAMES = "uint8 uint16 uint32 uint64 int8 int16 int32 int64 float16 float32 float64"
SCALARS = {name: np.dtype(name).newbyteorder("<") for name in _SCALAR_NAMES.split()}
# ndarray: the per-value dtype byte and the shape-dtype code (low 2 bits of the ndim byte)
NDARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32"}
NDARRAY_DTYPES |= {33: "int32", 34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
SHAPE_DTYPES = {0: "<u1", 1: "<u2", 2: "<u4", 3: "<u8"}
Decoder = Callable[[memoryview], Any]


def parse_index(raw: bytes, where: str) -> list[dict[str, Any]]:
    """The shard entries of an ``index.json``, checked to be version-2 MDS."""
    try:
        obj = json.loads(raw)
        shards = obj["shards"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceFormatError(where, f"not an MDS index.json: {exc!r}") from exc
    if obj.get("version") != 2:
        raise SourceFormatError(where, f"index version {obj.get('version')!r}, expected 2")
    for number, shard in enumerate(shards):
        if shard.get("format") != "mds":
            raise SourceFormatError(where, f"shard {number}: format {shard.get('format')!r}")
        if shard.get("compression"):
            raise SourceFormatError(
                where,
                f"shard {number} is {shard['compression']}-compressed "
                f"({(shard.get('zip_data') or {}).get('basename')}); only uncompressed MDS is "
                "read -- write it with compression=None",
            )
    return shards


def _ndarray(spec: str, where: str) -> Decoder:
    parts = spec.split(":")[1:] if ":" in spec else []
    dtype = np.dtype(parts[0]).newbyteorder("<") if parts and parts[0] else None
    shape = tuple(int(d) for d in parts[1].split(",")) if len(parts) > 1 else None
    if dtype is not None and dtype.name not in NDARRAY_DTYPES.values():
        raise SourceFormatError(where, f"ndarray dtype {parts[0]!r} is not an MDS dtype")

    def decode(data: memoryview) -> np.ndarray:
        at, value_dtype, value_shape = 0, dtype, shape
        if value_dtype is None:
            value_dtype = np.dtype(NDARRAY_DTYPES[data[0]]).newbyteorder("<")
            at = 1
        if value_shape is None:
            ndim, code = data[at] >> 2, data[at] & 3
            dims = np.frombuffer(data, SHAPE_DTYPES[code], ndim, at + 1)
            value_shape = tuple(int(d) for d in dims)
            at += 1 + dims.nbytes
        return np.frombuffer(data, value_dtype, offset=at).reshape(value_shape).copy()

    return decode


def _pil(data: memoryview) -> Any:
    from PIL import Image

    width, height, mode_size = np.frombuffer(data, "<u4", 3).tolist()
    mode = bytes(data[12 : 12 + mode_size]).decode("utf-8")
    return Image.frombytes(mode, (width, height), bytes(data[12 + mode_size :]))


def _image(data: memoryview) -> Any:
    from PIL import Image

    image = Image.open(io.BytesIO(bytes(data)))
    image.load()
    return image


def column_decoder(encoding: str, where: str, *, images: bool, unsafe: bool) -> Decoder:
    """A function from a value's bytes to the value, for ``encoding``."""
    name = encoding.split(":", 1)[0]
    if name in SCALARS:
        dtype = SCALARS[name]
        return lambda data: np.frombuffer(data, dtype, 1)[0]
    simple: dict[str, Decoder] = {
        "bytes": bytes,
        "str": lambda data: str(data, "utf-8"),
        "int": lambda data: int.from_bytes(data[:8], "little", signed=True),
        "str_int": lambda data: int(str(data, "utf-8")),
        "str_float": lambda data: float(str(data, "utf-8")),
        "str_decimal": lambda data: Decimal(str(data, "utf-8")),
        "json": lambda data: json.loads(bytes(data)),
        "pil": _pil,
        "jpeg": _image if images else bytes,
        "png": _image if images else bytes,
    }
    if name in simple and name == encoding:
        return simple[name]
    if name == "ndarray":
        return _ndarray(encoding, where)
    if name == "pkl":
        if not unsafe:
            raise SourceFormatError(
                where, "a pkl column runs arbitrary code when read: pass allow_unsafe_types=True"
            )
        return lambda data: pickle.loads(data)
    raise SourceFormatError(where, f"MDS encoding {encoding!r} is not supported here")


def split_sample(data: memoryview, sizes: list[int | None]) -> list[memoryview]:
    """The column values of one sample, given each column's fixed size (None: variable)."""
    variable = sum(1 for size in sizes if size is None)
    lengths = iter(np.frombuffer(data, "<u4", variable).tolist())
    at = 4 * variable
    values = []
    for size in sizes:
        length = next(lengths) if size is None else size
        if at + length > len(data):
            raise ValueError(f"sample is {len(data)} bytes, its columns need more")
        values.append(data[at : at + length])
        at += length
    return values
