"""The byte format of a stored point (writer and reader in one place).

A record is the LMDB value under the point's internal id (8 bytes, big-endian u64)::

    offset 0        u32 LE   H: length of the header
    offset 4        H bytes  header: UTF-8 JSON {"id": point id, "owner": tenant | null,
                             "tenants": [tenant, ...], "payload": object | null}
    offset 4 + H    dim x 4  the vector, float32 LE (normalised for Cosine, as queried)
    then            u32 LE   CRC-32 of key + everything before (tiers.storage.seal)

``owner``: the tenant that wrote the point (null: the admin); ``tenants``: those that may read
it (the owner first, then grants in order). The index's access table holds the same tenants
as labels; this copy lets a restart replay a half-applied write (see collection.py).

Thread-safety: pure functions.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from tiers.storage import seal, unseal
from vectordb.collections.points import PointId

__all__ = ["PointRecord", "decode_record", "encode_record", "internal_key"]

_U32 = struct.Struct("<I")
_U64 = struct.Struct(">Q")


@dataclass
class PointRecord:
    point_id: PointId
    owner: str | None
    tenants: list[str]
    payload: dict[str, Any] | None
    vector: np.ndarray  # float32 [dim]


def internal_key(internal_id: int) -> bytes:
    return _U64.pack(internal_id)


def encode_record(internal_id: int, record: PointRecord) -> bytes:
    header = orjson.dumps(
        {
            "id": record.point_id,
            "owner": record.owner,
            "tenants": record.tenants,
            "payload": record.payload,
        }
    )
    vector = np.ascontiguousarray(record.vector, dtype="<f4").tobytes()
    return seal(internal_key(internal_id), _U32.pack(len(header)) + header + vector)


def decode_record(internal_id: int, value: bytes, path: str) -> PointRecord:
    """The record; CorruptionError naming ``path`` if it fails its checksum."""
    body = unseal(internal_key(internal_id), bytes(value), path)
    (length,) = _U32.unpack_from(body)
    header = orjson.loads(body[4 : 4 + length])
    vector = np.frombuffer(body, dtype="<f4", offset=4 + length).astype(np.float32)
    return PointRecord(header["id"], header["owner"], header["tenants"], header["payload"], vector)
