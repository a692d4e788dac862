"""SearchResult: what a search answers, and whether every list it needed could be trusted.

It unpacks as ``ids, scores = await index.search(...)`` (a 2-tuple), so callers that never meet
corruption see nothing new. When a posting list a search needed failed its check, the search
answers from the lists that verified (unless ``SearchParams.strict``) and says so here:
``degraded`` is True and ``skipped_lists`` names the lists left out, so a caller can tell an
answer that may miss neighbours from a complete one. ``SpannIndex.verify()`` finds every such
list, ``repair()`` rebuilds them.

Thread-safety: immutable once made.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SearchResult"]


class SearchResult(tuple):  # type: ignore[type-arg,unused-ignore]
    """``(ids int64 [Q, k], scores float32 [Q, k])`` plus :attr:`skipped_lists`."""

    ids: np.ndarray
    scores: np.ndarray
    skipped_lists: np.ndarray

    def __new__(cls, ids: np.ndarray, scores: np.ndarray, skipped_lists: Any = ()) -> SearchResult:
        result = super().__new__(cls, (ids, scores))
        result.ids, result.scores = ids, scores
        result.skipped_lists = np.unique(np.asarray(skipped_lists, np.int64))
        return result

    @property
    def degraded(self) -> bool:
        """True when some list this search needed failed its check and was left out."""
        return len(self.skipped_lists) > 0

    def __repr__(self) -> str:
        note = f", skipped_lists={self.skipped_lists.tolist()}" if self.degraded else ""
        return f"SearchResult(queries={len(self.ids)}, k={self.ids.shape[1]}{note})"
