"""kvstore.rag.learned and the "learned" rule: what earlier checks measured picks the
candidates of the next check.

- a chunk's scores are each token's first measurement ("learned") or its newest
  ("learned-refresh"), and never-measured tokens score above everything (against a plain
  list model, hypothesis);
- through ``assemble``: a later "learned" reuse leaves a chunk's first whole-check values as
  they were, a later "learned-refresh" reuse changes them (planted fault: refreshing under
  "learned" fails it);
- a prompt's first reuse checks every reused token (nothing measured yet); a later reuse of
  the same chunks checks only candidates and computes less than the deviation rule, which
  checks all, at the same fraction (planted fault: forgetting the measurements makes it
  check everything again).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.rag.learned import UNSEEN, remember, token_scores

pytest.importorskip("transformers", reason="kvstore.rag needs transformers")

from kvstore.rag import assemble
from tests.kvstore.rag.test_assemble import _open, _segments, model  # noqa: F401

NAN = float("nan")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), st.floats(0, 100)), min_size=6, max_size=6),
                max_size=6), st.booleans())  # fmt: skip
def test_the_first_or_newest_measurement_wins(
    checks: list[list[float | None]], refresh: bool
) -> None:
    """Against a plain model: a list of the first (or, refreshing, the latest) value per
    token, None before any."""
    learned: torch.Tensor | None = None
    plain: list[float | None] = [None] * 6
    for check in checks:
        deviation = torch.tensor([NAN if v is None else v for v in check])
        learned = remember(learned, deviation, refresh)
        plain = [
            old if new is None or (old is not None and not refresh) else new
            for old, new in zip(plain, check, strict=True)
        ]
        scores = token_scores(6, learned)
        for got, want in zip(scores.tolist(), plain, strict=True):
            assert got >= 0.5 * UNSEEN if want is None else got == pytest.approx(want)
    if all(v is None for v in plain):
        assert learned is None


def test_later_reuses_check_only_candidates(model: Any, tmp_path: Path) -> None:  # noqa: F811
    async def main() -> None:
        cache = await _open(model, tmp_path)
        try:
            await assemble(model, cache, _segments([0, 1, 2, 3]))
            first = await assemble(model, cache, _segments([3, 2, 1, 0]),
                                   recompute_fraction=0.2, rule="learned")  # fmt: skip
            check_all = await assemble(model, cache, _segments([3, 2, 1, 0]),
                                       recompute_fraction=0.2, rule="deviation")  # fmt: skip
            # nothing was measured before: every reused token was checked, as "deviation"
            assert first.tokens_computed == pytest.approx(check_all.tokens_computed)
            info = cache.lookup(_segments([0])[1].token_ids)
            assert info is not None and info.learned is not None
            assert not bool(info.learned.isnan().any())  # the first check saw all of it
            segments = _segments([2, 0, 3, 1])
            later = await assemble(model, cache, segments, recompute_fraction=0.2, rule="learned")
            deviation = await assemble(model, cache, segments, recompute_fraction=0.2,
                                       rule="deviation")  # fmt: skip
            assert later.tokens_computed < 0.85 * deviation.tokens_computed
            assert later.reused_tokens == deviation.reused_tokens
        finally:
            await cache.aclose()

    asyncio.run(main())


def test_learned_keeps_the_first_check(model: Any, tmp_path: Path) -> None:  # noqa: F811
    """Each rule in a cache of its own: the same three prompts, then the chunks' values."""

    async def learned_after(rule: str, path: Path) -> list[torch.Tensor]:
        cache = await _open(model, path)
        try:
            await assemble(model, cache, _segments([0, 1, 2, 3]))
            await assemble(model, cache, _segments([3, 2, 1, 0]), recompute_fraction=0.2,
                           rule=rule)  # fmt: skip
            firsts = [_values(cache, i) for i in range(4)]
            await assemble(model, cache, _segments([2, 0, 3, 1]), recompute_fraction=0.2,
                           rule=rule)  # fmt: skip
            return [torch.stack([first, _values(cache, i)]) for i, first in enumerate(firsts)]
        finally:
            await cache.aclose()

    fixed = asyncio.run(learned_after("learned", tmp_path / "fixed"))
    assert all(torch.equal(pair[0], pair[1]) for pair in fixed)
    refreshed = asyncio.run(learned_after("learned-refresh", tmp_path / "refresh"))
    assert any(not torch.equal(pair[0], pair[1]) for pair in refreshed)


def _values(cache: Any, chunk: int) -> torch.Tensor:
    info = cache.lookup(_segments([chunk])[1].token_ids)
    assert info is not None and info.learned is not None
    return info.learned.clone()
