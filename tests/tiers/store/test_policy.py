"""Eviction policies against plain models of LRU, LFU and GreedyDual-Size-Frequency."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiers.io.errors import InvalidArgumentError
from tiers.store.policy import CostAwarePolicy, LfuPolicy, LruPolicy, make_policy

OPS = st.lists(
    st.tuples(st.sampled_from(["admit", "touch", "forget"]), st.sampled_from("abcdef")), max_size=60
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_lru_evicts_least_recently_used_first(ops: list[tuple[str, str]]) -> None:
    policy, order = LruPolicy(), []
    for op, key in ops:
        if op == "admit" or (op == "touch" and key in order):
            if key in order:
                order.remove(key)
            order.append(key)
            getattr(policy, op)(key, *((1, 0.0) if op == "admit" else ()))
        elif op == "forget":
            policy.forget(key)
            if key in order:
                order.remove(key)
    assert list(policy.victims()) == order


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_lfu_evicts_least_frequently_used_first(ops: list[tuple[str, str]]) -> None:
    policy, hits, age, clock = LfuPolicy(), {}, {}, itertools.count()
    for op, key in ops:
        if op == "admit":
            policy.admit(key, 1, 0.0)
            hits[key] = hits.get(key, 0) + 1
            age[key] = next(clock)
        elif op == "touch" and key in hits:
            policy.touch(key)
            hits[key] += 1
            age[key] = next(clock)
        elif op == "forget":
            policy.forget(key)
            hits.pop(key, None)
            age.pop(key, None)
    victims = list(policy.victims())
    assert sorted(victims) == sorted(hits)
    counts = [hits[k] for k in victims]
    assert counts == sorted(counts)  # never a more-used key before a less-used one


def test_cost_aware_keeps_small_slow_hot_objects() -> None:
    policy = CostAwarePolicy()
    policy.admit("big-cold", 1 << 20, 1e-3)
    policy.admit("small-hot", 4096, 1e-3)
    policy.admit("small-cheap", 4096, 1e-7)
    for _ in range(5):
        policy.touch("small-hot")
    victims = policy.victims()
    assert next(victims) == "small-cheap"  # refetching it costs almost nothing
    assert next(victims) == "big-cold"  # per byte, the big one is worth least
    victims.close()
    assert list(policy.victims())[-1] == "small-hot"


def test_offered_but_kept_victims_stay_tracked() -> None:
    policy = LfuPolicy()
    for key in "abc":
        policy.admit(key, 1, 0.0)
    victims = policy.victims()
    assert next(victims) == "a"  # offered, but the caller keeps it (e.g. pinned)
    victims.close()
    assert sorted(policy.victims()) == ["a", "b", "c"]


def test_unknown_policy() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown eviction policy"):
        make_policy("random")
