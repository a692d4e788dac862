"""The write-ahead log's tenancy records: the one place their byte layout is defined.

Kinds (vectordb.wal holds 1 = insert, 2 = delete), all little-endian, ``aux`` = count of ids::

    3  insert with tenants   ids int64[n] | vectors [n, dim] in the index dtype, zero-padded to
                             8 bytes | indptr int64[n + 1] | refs int64[indptr[n]] | names
    4  grant                 ids int64[n] | names (one name: the tenant)
    5  revoke                ids int64[n] | names (one name)
    6  delete tenant         names (one name); n = 0

    names = json_bytes int64 | UTF-8 JSON list of tenant ids (ints and strings as given)

Row i of an insert may be read by the tenants ``names[refs[indptr[i]:indptr[i + 1]]]``. Records
carry names, not the index's tenant numbers, so that numbers are only ever given when a record
is applied (first time or replay alike, in log order: tenant_names).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from tiers.io import CorruptionError
from vectordb.tenancy.tenant_names import TenantId

__all__ = [
    "DELETE_TENANT",
    "GRANT",
    "REVOKE",
    "TENANT_INSERT",
    "TENANT_KINDS",
    "TenantRows",
    "decode_tenant_record",
    "encode_grant",
    "encode_insert",
    "plausible",
]

TENANT_INSERT, GRANT, REVOKE, DELETE_TENANT = 3, 4, 5, 6
TENANT_KINDS = (TENANT_INSERT, GRANT, REVOKE, DELETE_TENANT)
TenantRows = tuple[np.ndarray, np.ndarray, list[TenantId]]  # indptr, refs, names


def _names(names: list[TenantId]) -> bytes:
    body = json.dumps(names, ensure_ascii=False).encode()
    return np.int64(len(body)).tobytes() + body


def _pad8(data: bytes) -> bytes:
    return data + bytes(-len(data) % 8)


def encode_insert(ids: np.ndarray, vectors: np.ndarray, rows: TenantRows) -> bytes:
    indptr, refs, names = rows
    return b"".join(
        [
            np.ascontiguousarray(ids, np.int64).tobytes(),
            _pad8(np.ascontiguousarray(vectors).tobytes()),
            np.ascontiguousarray(indptr, np.int64).tobytes(),
            np.ascontiguousarray(refs, np.int64).tobytes(),
            _names(names),
        ]
    )


def encode_grant(ids: np.ndarray, name: TenantId) -> bytes:
    return np.ascontiguousarray(ids, np.int64).tobytes() + _names([name])


def plausible(kind: int, count: int, payload_bytes: int, vector_bytes: int) -> bool:
    """The size check a record must pass before its CRC is trusted (log damage rules)."""
    if payload_bytes % 8:
        return False
    if kind == TENANT_INSERT:
        fixed = count * 8 + -(-count * vector_bytes // 8) * 8 + (count + 1) * 8 + 8
        return payload_bytes >= fixed
    if kind in (GRANT, REVOKE):
        return payload_bytes >= count * 8 + 8
    return kind == DELETE_TENANT and count == 0 and payload_bytes >= 8


def decode_tenant_record(
    kind: int, count: int, payload: bytes | memoryview, dim: int, dtype: Any
) -> tuple[np.ndarray, np.ndarray | None, Any]:
    """(ids, vectors or None, tenants): TenantRows for an insert, else the one tenant id."""
    at = 8 * count
    ids = np.frombuffer(payload, np.int64, count).copy()
    vectors = None
    if kind == TENANT_INSERT:
        size = count * dim * np.dtype(dtype).itemsize
        vectors = np.frombuffer(payload, dtype, count * dim, at).reshape(count, dim).copy()
        at += -(-size // 8) * 8
        indptr = np.frombuffer(payload, np.int64, count + 1, at).copy()
        at += 8 * (count + 1)
        nnz = int(indptr[-1]) if count + 1 else 0
        if nnz < 0 or at + 8 * nnz + 8 > len(payload) or (np.diff(indptr) < 0).any():
            raise CorruptionError("a tenant insert record's rows do not fit its payload")
        refs = np.frombuffer(payload, np.int64, nnz, at).copy()
        at += 8 * nnz
        names = _read_names(payload, at)
        if len(refs) and (refs.min() < 0 or refs.max() >= len(names)):
            raise CorruptionError("a tenant insert record names a tenant it does not hold")
        return ids, vectors, (indptr, refs, names)
    names = _read_names(payload, at)
    if len(names) != 1:
        raise CorruptionError(f"a tenant record holds {len(names)} tenants, not one")
    return ids, None, names[0]


def _read_names(payload: bytes | memoryview, at: int) -> list[TenantId]:
    size = int(np.frombuffer(payload, np.int64, 1, at)[0])
    if size < 0 or at + 8 + size > len(payload):
        raise CorruptionError("a tenant record's names run past its payload")
    try:
        names = json.loads(bytes(payload[at + 8 : at + 8 + size]).decode())
    except (UnicodeDecodeError, ValueError) as error:
        raise CorruptionError(f"a tenant record's names do not parse: {error}") from error
    if not isinstance(names, list) or not all(
        isinstance(n, (int, str)) and not isinstance(n, bool) for n in names
    ):
        raise CorruptionError("a tenant record's names are not a list of tenant ids")
    return names
