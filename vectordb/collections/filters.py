"""Payload filters in Qdrant's JSON form, parsed once into a predicate over (id, payload).

Grammar (the subset of Qdrant's ``Filter`` that is supported; anything else is refused with
InvalidFilterError naming where, never ignored)::

    filter     := {"must"?: clauses, "should"?: clauses, "must_not"?: clauses}
    clauses    := condition | [condition, ...]
    condition  := filter
                | {"key": path, "match": {"value": v} | {"any": [v..]} | {"except": [v..]}
                                        | {"text": str}}
                | {"key": path, "range": {"gt"?, "gte"?, "lt"?, "lte"?: number}}
                | {"has_id": [point id, ...]}
                | {"is_empty": {"key": path}} | {"is_null": {"key": path}}

``path`` is dotted (``meta.lang``); where a value on the path is a list, a condition holds if it
holds for any element (Qdrant's rule). ``must``: all hold; ``should``: at least one (when
given); ``must_not``: none. ``v`` is a string, an integer or a boolean (``1`` and ``true``
differ).

Thread-safety: a Filter is immutable after parsing; ``matches`` is pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vectordb.collections.errors import InvalidFilterError, InvalidPointError
from vectordb.collections.points import PointId, check_point_id

__all__ = ["Filter", "parse_filter"]

Predicate = Callable[[PointId, Any], bool]
_MISSING = object()
_RANGE_OPS = ("gt", "gte", "lt", "lte")


@dataclass(frozen=True)
class Filter:
    """A parsed filter. ``equalities``: the (key, value) pairs of its top-level ``must``
    keyword matches, which every matching point satisfies (for routing through an index)."""

    predicate: Predicate
    equalities: tuple[tuple[str, Any], ...] = field(default=())

    def matches(self, point_id: PointId, payload: dict[str, Any] | None) -> bool:
        return self.predicate(point_id, payload or {})


def parse_filter(value: Any) -> Filter | None:
    """The filter ``value`` describes (None for None), or InvalidFilterError."""
    if value is None:
        return None
    predicate = _filter(value, "filter")
    return Filter(predicate, tuple(_equalities(value)))


def _filter(value: Any, where: str) -> Predicate:
    if not isinstance(value, dict):
        raise InvalidFilterError(f"expected an object, got {type(value).__name__}", where)
    unknown = set(value) - {"must", "should", "must_not", "min_should"}
    if unknown:
        raise InvalidFilterError(f"unsupported keys {sorted(unknown)}", where)
    if value.get("min_should") is not None:
        raise InvalidFilterError("min_should is not supported", where + ".min_should")
    must = _clauses(value.get("must"), where + ".must")
    should = _clauses(value.get("should"), where + ".should")
    must_not = _clauses(value.get("must_not"), where + ".must_not")

    def predicate(pid: PointId, payload: Any) -> bool:
        if not all(c(pid, payload) for c in must):
            return False
        if should and not any(c(pid, payload) for c in should):
            return False
        return not any(c(pid, payload) for c in must_not)

    return predicate


def _clauses(value: Any, where: str) -> list[Predicate]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    return [_condition(item, f"{where}[{i}]") for i, item in enumerate(items)]


def _condition(value: Any, where: str) -> Predicate:
    if not isinstance(value, dict):
        raise InvalidFilterError(f"expected a condition object, got {type(value).__name__}", where)
    if {"must", "should", "must_not"} & set(value) and "key" not in value:
        return _filter(value, where)
    if "has_id" in value:
        return _has_id(value["has_id"], where + ".has_id")
    for kind in ("is_empty", "is_null"):
        if kind in value:
            inner = value[kind]
            if not isinstance(inner, dict) or not isinstance(inner.get("key"), str):
                raise InvalidFilterError('expected {"key": "<field>"}', f"{where}.{kind}")
            return _emptiness(_path(inner["key"]), kind == "is_null")
    key = value.get("key")
    if not isinstance(key, str) or not key:
        raise InvalidFilterError("a field condition needs a non-empty string 'key'", where)
    path = _path(key)
    if value.get("match") is not None:
        return _on_values(path, _match(value["match"], where + ".match"))
    if value.get("range") is not None:
        return _on_values(path, _range(value["range"], where + ".range"))
    supported = "match, range, has_id, is_empty, is_null or a nested filter"
    raise InvalidFilterError(f"unsupported condition (supported: {supported})", where)


def _has_id(value: Any, where: str) -> Predicate:
    if not isinstance(value, list):
        raise InvalidFilterError("expected a list of point ids", where)
    try:
        ids = frozenset(check_point_id(v) for v in value)
    except InvalidPointError as exc:
        raise InvalidFilterError(str(exc), where) from None
    return lambda pid, payload: pid in ids


def _emptiness(path: list[str], null_only: bool) -> Predicate:
    def predicate(pid: PointId, payload: Any) -> bool:
        found = _lookup(payload, path)
        if null_only:
            return found is None
        return found is _MISSING or found is None or found == []

    return predicate


def _keyword(value: Any, where: str) -> Any:
    if isinstance(value, (str, bool, int)):
        return value
    raise InvalidFilterError(f"expected a string, integer or boolean, got {value!r}", where)


def _match(value: Any, where: str) -> Callable[[Any], bool]:
    if not isinstance(value, dict) or len(value) != 1:
        raise InvalidFilterError('expected one of {"value"}, {"any"}, {"except"}, {"text"}', where)
    ((kind, target),) = value.items()
    if kind == "value":
        wanted = _typed(_keyword(target, where + ".value"))
        return lambda v: _typed(v) == wanted
    if kind in ("any", "except"):
        if not isinstance(target, list):
            raise InvalidFilterError("expected a list", f"{where}.{kind}")
        options = {_typed(_keyword(t, f"{where}.{kind}")) for t in target}
        if kind == "any":
            return lambda v: _typed(v) in options
        return lambda v: _typed(v) not in options
    if kind == "text":
        if not isinstance(target, str):
            raise InvalidFilterError("expected a string", where + ".text")
        return lambda v: isinstance(v, str) and target in v
    raise InvalidFilterError(f"unsupported match {kind!r}", where)


def _range(value: Any, where: str) -> Callable[[Any], bool]:
    if not isinstance(value, dict) or not set(value) <= set(_RANGE_OPS):
        raise InvalidFilterError(f"expected an object of {', '.join(_RANGE_OPS)}", where)
    bounds = {op: v for op, v in value.items() if v is not None}
    for op, bound in bounds.items():
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or math.isnan(bound):
            raise InvalidFilterError(f"expected a number, got {bound!r}", f"{where}.{op}")

    def test(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        return (
            ("gt" not in bounds or v > bounds["gt"])
            and ("gte" not in bounds or v >= bounds["gte"])
            and ("lt" not in bounds or v < bounds["lt"])
            and ("lte" not in bounds or v <= bounds["lte"])
        )

    return test


def _on_values(path: list[str], test: Callable[[Any], bool]) -> Predicate:
    def predicate(pid: PointId, payload: Any) -> bool:
        found = _lookup(payload, path)
        if found is _MISSING:
            return False
        values = found if isinstance(found, list) else [found]
        return any(test(v) for v in values)

    return predicate


def _lookup(payload: Any, path: list[str]) -> Any:
    """The value at ``path``; through lists, the flattened values of every element."""
    found: Any = payload
    for part in path:
        if isinstance(found, list):
            items = [item[part] for item in found if isinstance(item, dict) and part in item]
            found = [x for item in items for x in (item if isinstance(item, list) else [item])]
            if not found:
                return _MISSING
        elif isinstance(found, dict) and part in found:
            found = found[part]
        else:
            return _MISSING
    return found


def _path(key: str) -> list[str]:
    return [part[:-2] if part.endswith("[]") else part for part in key.split(".")]


def _typed(value: Any) -> tuple[str, Any]:
    """A value tagged by kind, so that 1 and True (equal in Python) never match each other."""
    return (type(value).__name__, value)


def _equalities(value: dict[str, Any]) -> list[tuple[str, Any]]:
    must = value.get("must")
    items = must if isinstance(must, list) else [must] if must is not None else []
    out = []
    for item in items:
        match = item.get("match") if isinstance(item, dict) else None
        if isinstance(match, dict) and set(match) == {"value"} and "." not in item["key"]:
            out.append((item["key"], match["value"]))
    return out
