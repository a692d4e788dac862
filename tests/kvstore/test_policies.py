"""Block policies against plain models: the prefix policy offers the least valuable leaf."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.policies import BLOCK_POLICIES, make_block_policy, recompute_cost
from tiers import InvalidArgumentError


def _first_victim(policy_name: str, ops: list[tuple[str, int]]) -> str | None:
    """Replay ``ops`` on a policy over a forest of 12 keys; its first victim."""
    policy = make_block_policy(policy_name)
    for op, node in ops:
        key = f"k{node}"
        if op == "admit":
            policy.admit(key, f"k{node // 2}" if node else None, 0)
        elif op == "touch":
            policy.touch(key)
        else:
            policy.forget(key)
    return next(iter(policy.victims()), None)


OPS = st.lists(
    st.tuples(st.sampled_from(["admit", "admit", "touch", "forget"]), st.integers(0, 11)),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(ops=OPS)
def test_prefix_policy_offers_the_least_valuable_leaf(ops: list[tuple[str, int]]) -> None:
    clock = itertools.count()
    last: dict[int, int] = {}
    hits: dict[int, int] = {}
    parent: dict[int, int | None] = {}
    for op, node in ops:  # the plain model: dicts of last uses, hits and parent links
        if op == "admit":
            if node not in last:
                parent[node] = node // 2 if node and node // 2 in last else None
            hits[node] = hits.get(node, 0) + 1
            last[node] = next(clock)
        elif op == "touch" and node in last:
            hits[node] += 1
            last[node] = next(clock)
        elif op == "forget" and node in last:
            del last[node], parent[node], hits[node]
            for child, link in parent.items():  # its children are cut loose
                if link == node:
                    parent[child] = None
    leaves = [n for n in last if not any(p == n for c, p in parent.items() if c in last)]
    value = lambda n: (math.log2(1 + hits[n]), last[n])  # noqa: E731 (no victim yet: clock 0)
    expected = f"k{min(leaves, key=value)}" if leaves else None
    assert _first_victim("prefix", ops) == expected


def test_prefix_policy_keeps_a_reused_leaf_and_ages_it_out() -> None:
    policy = make_block_policy("prefix")
    for key in ("hot", "cold1", "cold2", "cold3"):
        policy.admit(key, None, 0)
    for _ in range(3):
        policy.touch("hot")
    victims = policy.victims()
    assert [next(victims), next(victims)] == ["cold1", "cold2"]  # older, but hit once
    for key in ("cold1", "cold2"):
        policy.forget(key)
    victims.close()
    for i in range(8):  # new blocks, each hit twice: the clock has risen past "hot"'s value
        policy.admit(f"new{i}", None, 0)
        policy.touch(f"new{i}")
    order = list(itertools.islice(policy.victims(), 3))
    assert order[0] == "cold3" and order[1] == "hot"


def test_lru_takes_a_chain_root_first_and_prefix_its_leaf() -> None:
    ops = [("admit", 1), ("admit", 2), ("admit", 4), ("touch", 1), ("touch", 2), ("touch", 4)]
    assert _first_victim("lru", ops) == "k1"  # the root: its descendants become unreachable
    assert _first_victim("prefix", ops) == "k4"


def test_prefix_policy_offers_a_parent_once_its_last_child_leaves() -> None:
    policy = make_block_policy("prefix")
    policy.admit("root", None, 0)
    policy.admit("mid", "root", 1)
    policy.admit("leaf", "mid", 2)
    order = []
    victims = policy.victims()
    for key in victims:
        order.append(key)
        policy.forget(key)
    assert order == ["leaf", "mid", "root"]


def test_prefix_policy_falls_back_when_every_leaf_is_kept() -> None:
    policy = make_block_policy("prefix")
    policy.admit("root", None, 0)
    policy.admit("leaf", "root", 1)
    offered = list(itertools.islice(policy.victims(), 3))
    assert offered[0] == "leaf" and "root" in offered[1:]


def test_cost_policy_keeps_deep_blocks_longer() -> None:
    policy = make_block_policy("cost")
    policy.admit("deep", None, 40)
    policy.admit("shallow", None, 0)
    assert next(iter(policy.victims())) == "shallow"
    assert recompute_cost(40) > recompute_cost(0)


def test_every_policy_forgets_and_unknown_names_are_refused() -> None:
    for name in BLOCK_POLICIES:
        policy = make_block_policy(name)
        policy.admit("a", None, 0)
        policy.forget("a")
        policy.forget("never-admitted")
        assert list(policy.victims()) == []
    with pytest.raises(InvalidArgumentError, match="prefix"):
        make_block_policy("mru")
