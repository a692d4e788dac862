"""IndexConfig and SearchParams: every field checked for type and range, errors naming it."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.any_values import ANY_VALUE
from tiers.io.errors import ConfigError, InvalidArgumentError
from vectordb import IndexConfig, IndexConfigError, SearchParams

_NAN, _INF = math.nan, math.inf
# (class, field, bad values): every field of both
_BAD: list[tuple[type, str, list[Any]]] = [
    (IndexConfig, "dim", [0, -3, 2.0, "8", True, None, np.float32(8)]),
    (IndexConfig, "metric", ["hamming", "L2", 2, None, ["l2"]]),
    (IndexConfig, "dtype", ["float64", np.float32, "", None, 4]),
    (IndexConfig, "head_fraction", [0.0, -0.1, 1.5, _NAN, "0.1", True, None]),
    (IndexConfig, "replica_count", [0, 2.5, "4", False, 65]),
    (IndexConfig, "rng_factor", [0.0, -1.0, _NAN, _INF, "1", None]),
    (IndexConfig, "closure", [0.5, _NAN, -_INF, "1.5", None]),
    (IndexConfig, "candidate_heads", [0, -1, 64.0, "64", True]),
    (IndexConfig, "posting_limit", [0, 120.0, "120", None]),
    (IndexConfig, "append_reserve", [-0.1, 4.5, _NAN, _INF, "0", None]),
    (IndexConfig, "merge_threshold", [-1, 2.5, "10", 60, 100, None]),
    (IndexConfig, "reassign_neighbours", [0, 32.0, "32", False]),
    (IndexConfig, "navigator", ["kd-tree", "", None, 1]),
    (IndexConfig, "checkpoint_wal_bytes", [0, "64MiB", 1.5e6, -1]),
    (IndexConfig, "seed", [-1, 1.0, "0", None]),
    (SearchParams, "max_postings", [0, -1, 2.5, "8", True]),
    (SearchParams, "prune_ratio", [0.5, _NAN, "4", None, -_INF]),
    (SearchParams, "shared_postings", [-1, 1.5, "2", False]),
    (SearchParams, "strict", ["no", "false", 0, 1, None]),
]
_CASES = [(cls, field, value) for cls, field, values in _BAD for value in values]


def _make(cls: type, field: str, value: Any) -> Any:
    base: dict[str, Any] = {"dim": 8} if cls is IndexConfig else {}
    return cls(**{**base, field: value})


@pytest.mark.parametrize(
    ("cls", "field", "value"),
    _CASES,
    ids=[f"{cls.__name__}.{field}={value!r}" for cls, field, value in _CASES],
)
def test_every_bad_value_names_its_field(cls: type, field: str, value: Any) -> None:
    with pytest.raises(IndexConfigError) as info:
        _make(cls, field, value)
    where = f"{cls.__name__}.{field}"
    assert info.value.where == where and str(info.value).startswith(f"{where}: ")
    # one thing to catch, whichever layer's configuration it is
    assert isinstance(info.value, ConfigError) and isinstance(info.value, InvalidArgumentError)


def test_fields_that_depend_on_each_other() -> None:
    with pytest.raises(IndexConfigError) as info:
        IndexConfig(dim=8, replica_count=9, candidate_heads=8)
    assert info.value.where == "IndexConfig.replica_count"
    with pytest.raises(IndexConfigError) as info:
        IndexConfig(dim=8, metric="cosine", dtype="uint8")
    assert info.value.where == "IndexConfig.dtype"
    with pytest.raises(IndexConfigError) as info:
        IndexConfig(dim=8, posting_limit=20, merge_threshold=10)
    assert info.value.where == "IndexConfig.merge_threshold"


def test_good_values_are_accepted_and_normalised() -> None:
    config = IndexConfig(
        dim=np.int64(16),
        metric="ip",
        dtype="float16",
        head_fraction=1,
        replica_count=np.int32(8),
        rng_factor=2,
        closure=_INF,
        candidate_heads=8,
        posting_limit=3,
        append_reserve=4,
        merge_threshold=0,
        reassign_neighbours=1,
        navigator="hnsw",
        checkpoint_wal_bytes=1,
        seed=2**40,
    )
    assert type(config.dim) is int and type(config.replica_count) is int
    assert type(config.head_fraction) is float and config.head_fraction == 1.0
    assert IndexConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    params = SearchParams(max_postings=np.int64(3), prune_ratio=_INF, shared_postings=0)
    assert type(params.max_postings) is int and params.strict is False
    assert SearchParams(max_postings=None, shared_postings=None, strict=True).strict


def test_unknown_keys_list_the_known_ones() -> None:
    with pytest.raises(IndexConfigError, match=r"unknown keys \['colour'\]; known: \['append"):
        IndexConfig.from_dict({"dim": 4, "colour": "red"})


_FIELDS = sorted({(cls, field) for cls, field, _ in _BAD}, key=lambda p: (p[0].__name__, p[1]))


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(_FIELDS), ANY_VALUE)
def test_any_value_is_accepted_or_named(field: tuple[type, str], value: Any) -> None:
    """Whatever a field holds, the answer is a config or an error naming that field, never a
    TypeError from a comparison deep inside."""
    cls, name = field
    try:
        made = _make(cls, name, value)
    except IndexConfigError as exc:
        assert exc.where is not None and exc.where.startswith(cls.__name__), str(exc)
    else:
        got = getattr(made, name)  # as given, or normalised: 3 -> 3.0 for a float field
        assert got == (_as_float(value) if isinstance(got, float) else value)


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond any float is infinite where infinity is allowed
        return math.inf if value > 0 else -math.inf
