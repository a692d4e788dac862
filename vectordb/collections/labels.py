"""The index labels (vectordb.tenancy tenant ids) a collection gives its points.

A point carries one label per tenant that may read it (``t:<tenant>``) and one per value of each
keyword-indexed payload field (``k:<json [field, value]>``); the index keeps, per label, the
vectors it may search (Curator-style shortlists), so a tenant's query and a filter on an
indexed keyword both search only their own points. The prefixes keep the two kinds apart: a
tenant named like a field value is another label. A label over the index's 1,024-character
limit is replaced by its SHA-256 (a collision would need a SHA-256 collision).

Thread-safety: pure functions.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

__all__ = ["keyword_label", "keyword_labels", "tenant_label"]

_MAX_LABEL_CHARS = 1024


def tenant_label(tenant: str) -> str:
    return _bounded("t:" + tenant)


def keyword_label(field: str, value: Any) -> str:
    return _bounded("k:" + orjson.dumps([field, value]).decode())


def keyword_labels(payload: dict[str, Any] | None, fields: list[str]) -> list[str]:
    """The keyword labels of ``payload`` for the indexed ``fields`` (each element of a list
    value is one; values that are not strings, integers or booleans get none)."""
    if not payload:
        return []
    labels = []
    for name in fields:
        if name not in payload:
            continue
        value = payload[name]
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, (str, int, bool)):
                labels.append(keyword_label(name, item))
    return sorted(set(labels))


def _bounded(label: str) -> str:
    if len(label) <= _MAX_LABEL_CHARS:
        return label
    return label[:2] + "#" + hashlib.sha256(label.encode()).hexdigest()
