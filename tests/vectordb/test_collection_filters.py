"""Payload filters (vectordb.collections.filters): Qdrant's semantics, and typed refusals."""

from __future__ import annotations

from typing import Any

import pytest

from vectordb.collections import InvalidFilterError, parse_filter

PAYLOAD = {
    "lang": "en",
    "n": 7,
    "flag": True,
    "tags": ["a", "b"],
    "meta": {"owner": "ops", "size": 2.5},
    "items": [{"k": "x"}, {"k": "y"}],
    "none": None,
    "empty": [],
}


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ({"key": "lang", "match": {"value": "en"}}, True),
        ({"key": "lang", "match": {"value": "de"}}, False),
        ({"key": "n", "match": {"value": 7}}, True),
        ({"key": "flag", "match": {"value": True}}, True),
        ({"key": "flag", "match": {"value": 1}}, False),  # 1 is not true
        ({"key": "n", "match": {"value": True}}, False),
        ({"key": "tags", "match": {"value": "b"}}, True),  # any element of a list
        ({"key": "tags", "match": {"any": ["z", "a"]}}, True),
        ({"key": "lang", "match": {"except": ["de", "fr"]}}, True),
        ({"key": "lang", "match": {"except": ["en"]}}, False),
        ({"key": "lang", "match": {"text": "e"}}, True),
        ({"key": "meta.owner", "match": {"value": "ops"}}, True),
        ({"key": "items[].k", "match": {"value": "y"}}, True),
        ({"key": "items.k", "match": {"value": "z"}}, False),
        ({"key": "n", "range": {"gte": 7, "lt": 8}}, True),
        ({"key": "n", "range": {"gt": 7}}, False),
        ({"key": "meta.size", "range": {"lte": 2.5}}, True),
        ({"key": "lang", "range": {"gt": 0}}, False),  # not a number
        ({"key": "missing", "match": {"value": "x"}}, False),
        ({"has_id": [3, 4]}, True),
        ({"has_id": [5]}, False),
        ({"is_empty": {"key": "empty"}}, True),
        ({"is_empty": {"key": "missing"}}, True),
        ({"is_empty": {"key": "none"}}, True),
        ({"is_empty": {"key": "lang"}}, False),
        ({"is_null": {"key": "none"}}, True),
        ({"is_null": {"key": "missing"}}, False),
    ],
)
def test_a_condition_holds_as_qdrant_says(condition: dict[str, Any], expected: bool) -> None:
    for clause, want in (("must", expected), ("must_not", not expected)):
        parsed = parse_filter({clause: [condition]})
        assert parsed is not None
        assert parsed.matches(3, PAYLOAD) is want


def test_must_should_and_must_not_combine() -> None:
    yes = {"key": "lang", "match": {"value": "en"}}
    no = {"key": "lang", "match": {"value": "de"}}

    def holds(value: dict[str, Any]) -> bool:
        parsed = parse_filter(value)
        assert parsed is not None
        return parsed.matches(1, PAYLOAD)

    assert holds({"must": [yes], "should": [no, yes]})
    assert not holds({"must": [yes], "should": [no]})
    assert not holds({"must": [yes, no]})
    assert holds({"must": yes})  # one condition without a list
    assert holds({"should": [{"must": [yes], "must_not": [no]}]})  # nested
    assert holds({})
    assert parse_filter(None) is None


def test_routing_equalities_are_the_top_level_keyword_matches() -> None:
    parsed = parse_filter(
        {
            "must": [
                {"key": "lang", "match": {"value": "en"}},
                {"key": "meta.owner", "match": {"value": "ops"}},
                {"key": "n", "range": {"gt": 1}},
            ],
            "should": [{"key": "tags", "match": {"value": "a"}}],
        }
    )
    assert parsed is not None
    assert parsed.equalities == (("lang", "en"),)


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ([], "filter"),
        ({"must": [{"key": "a"}]}, "filter.must[0]"),
        ({"must": [{"key": "", "match": {"value": 1}}]}, "filter.must[0]"),
        ({"must": [{"key": "a", "match": {"value": 1.5}}]}, "filter.must[0].match.value"),
        ({"must": [{"key": "a", "match": {"value": [1]}}]}, "filter.must[0].match.value"),
        ({"must": [{"key": "a", "match": {"any": "x"}}]}, "filter.must[0].match.any"),
        ({"must": [{"key": "a", "match": {"regex": "x"}}]}, "filter.must[0].match"),
        ({"must": [{"key": "a", "range": {"gt": "1"}}]}, "filter.must[0].range.gt"),
        ({"must": [{"key": "a", "range": {"between": 1}}]}, "filter.must[0].range"),
        ({"must": [{"key": "a", "geo_radius": {}}]}, "filter.must[0]"),
        ({"must_not": [{"has_id": [-1]}]}, "filter.must_not[0].has_id"),
        ({"should": [{"is_empty": "a"}]}, "filter.should[0].is_empty"),
        ({"min_should": {"conditions": [], "min_count": 1}}, "filter.min_should"),
        ({"filter": {}}, "filter"),
        ({"must": [5]}, "filter.must[0]"),
    ],
)
def test_a_filter_that_does_not_parse_is_refused_with_where(value: Any, where: str) -> None:
    with pytest.raises(InvalidFilterError) as caught:
        parse_filter(value)
    assert caught.value.where == where
    assert str(caught.value).startswith(where + ": ")
