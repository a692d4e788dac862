"""The byte format of a stored point (writer and reader in one place).

A record is the LMDB value under the point's internal id (8 bytes, big-endian u64)::

    offset 0        u32 LE   H: length of the header
    offset 4        H bytes  header: UTF-8 JSON {"id": point id, "owner": tenant | null,
                             "tenants": [tenant, ...], "payload": object | null,
                             "v": [side, crc]}
    then            u32 LE   CRC-32 of key + everything before (tiers.storage.seal)

``owner``: the tenant that wrote the point (null: the admin); ``tenants``: those that may read
it (the owner first, then grants in order). The index's access table holds the same tenants
as labels; this copy lets a restart replay a half-applied write (see collection.py). ``v``:
where the vector is, the slot ``side`` of the point's two in the store's vector file and the
slot's CRC-32 (vector_file.py). A record written before the vector file existed has no ``v``
and the vector inline after the header (dim x 4 bytes, float32 LE); it is read as such and
rewritten in the new form by its next write.

A record read from the store loads its vector on first use of ``vector`` (a query wanting
payloads only never reads it); ``stored`` names the slot it came from while the vector is
unchanged, so a write that changes only tenants or payload keeps the slot.

Thread-safety: pure functions; a PointRecord belongs to one caller at a time.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from tiers.storage import seal, unseal
from vectordb.collections.points import PointId

__all__ = ["PointRecord", "decode_record", "encode_record", "internal_key", "stored_slot"]

_U32 = struct.Struct("<I")
_U64 = struct.Struct(">Q")


class PointRecord:
    __slots__ = ("_load", "_vector", "owner", "payload", "point_id", "stored", "tenants")

    def __init__(
        self,
        point_id: PointId,
        owner: str | None,
        tenants: list[str],
        payload: dict[str, Any] | None,
        vector: np.ndarray | None = None,
        *,
        stored: tuple[int, int] | None = None,
        load: Callable[[], np.ndarray] | None = None,
    ) -> None:
        """``vector`` (float32 [dim]) or ``load``, which reads it from the slot ``stored``
        (side, crc) names."""
        if vector is None and load is None:
            raise ValueError("a PointRecord needs its vector or a way to load it")
        self.point_id, self.owner, self.tenants, self.payload = point_id, owner, tenants, payload
        self._vector, self._load, self.stored = vector, load, stored

    @property
    def vector(self) -> np.ndarray:
        if self._vector is None:
            assert self._load is not None
            self._vector, self._load = self._load(), None
        return self._vector

    @vector.setter
    def vector(self, value: np.ndarray) -> None:
        self._vector, self._load, self.stored = value, None, None  # a new slot on its write

    def __repr__(self) -> str:
        return (
            f"PointRecord({self.point_id!r}, owner={self.owner!r}, tenants={self.tenants!r}, "
            f"payload={self.payload!r}, stored={self.stored!r})"
        )


def internal_key(internal_id: int) -> bytes:
    return _U64.pack(internal_id)


def encode_record(internal_id: int, record: PointRecord, slot: tuple[int, int]) -> bytes:
    """The value for ``record`` whose vector is in ``slot`` (side, crc)."""
    header = orjson.dumps(
        {
            "id": record.point_id,
            "owner": record.owner,
            "tenants": record.tenants,
            "payload": record.payload,
            "v": list(slot),
        }
    )
    return seal(internal_key(internal_id), _U32.pack(len(header)) + header)


def decode_record(
    internal_id: int,
    value: bytes,
    path: str,
    load: Callable[[int, tuple[int, int]], np.ndarray] | None = None,
) -> PointRecord:
    """The record; CorruptionError naming ``path`` if it fails its checksum. ``load(id,
    (side, crc))`` reads a vector from the vector file when first asked for."""
    body = unseal(internal_key(internal_id), bytes(value), path)
    (length,) = _U32.unpack_from(body)
    header = orjson.loads(body[4 : 4 + length])
    slot = header.get("v")
    if slot is None:  # the older form: the vector inline
        vector = np.frombuffer(body, dtype="<f4", offset=4 + length).astype(np.float32)
        return PointRecord(
            header["id"], header["owner"], header["tenants"], header["payload"], vector
        )
    stored = (int(slot[0]), int(slot[1]))
    if load is None:
        raise ValueError("this record's vector is in the vector file: pass load")
    loader = load  # bound for the closure
    return PointRecord(
        header["id"],
        header["owner"],
        header["tenants"],
        header["payload"],
        stored=stored,
        load=lambda: loader(internal_id, stored),
    )


def stored_slot(internal_id: int, value: bytes | None, path: str) -> tuple[int, int] | None:
    """The slot (side, crc) a stored value names (None: no record, or the inline form)."""
    if value is None:
        return None
    body = unseal(internal_key(internal_id), bytes(value), path)
    (length,) = _U32.unpack_from(body)
    slot = orjson.loads(body[4 : 4 + length]).get("v")
    return None if slot is None else (int(slot[0]), int(slot[1]))
