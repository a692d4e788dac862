"""What the "learned" rule remembers of the check's deviations: per chunk, per token.

CacheBlend's check runs every reused token through the layers below the check layer to find
the few whose K deviates most: on a shallow model that is most of a reuse's cost. The tokens
that deviate most are largely the same from one prompt to the next (measured on the test
model: a chunk's opening tokens and its closing newline, which later text attends to), so
the rule checks a chunk whole only at its first non-exact reuse and keeps what the check saw
(``ChunkInfo.learned`` ``[tokens]``); later reuses check only the candidates with the highest
remembered deviation.

"learned" keeps each token's first measurement for good; "learned-refresh" overwrites the
values of the tokens each later check measured. Refreshing drifts (our reading of the
figures): later checks measure only the candidates, a candidate measured low in one context
falls out of the set while the others keep their whole-check values, and the set loses the
tokens that matter most (``--quick`` replay, fraction 0.05, same tokens: mean KL 5.95e-5
fixed against 9.09e-5 refreshing; on the 5,000-request replay refreshing gave 1.02e-4, over
the quality bound).

A model-wide prior by token and place in the chunk, tried instead of the first whole check,
lost too much quality on the benchmark (mean KL 1.19e-4 at fraction 0.05 against 5.95e-5
with the first whole check, pure reuse 1.86e-4): the first check is kept.

The measurements live in memory beside the ``ChunkCache`` (a reopened cache checks each
chunk whole once more).

Thread-safety: none; used from the cache's one event loop (``assemble`` updates after the
model thread has returned).
"""

from __future__ import annotations

import torch

__all__ = ["UNSEEN", "remember", "token_scores"]

UNSEEN = 1e30  # the score of a token never measured: above everything, so always checked


def token_scores(num_tokens: int, learned: torch.Tensor | None) -> torch.Tensor:
    """A reused chunk's per-token scores: its measurements, ``UNSEEN`` where none."""
    if learned is None:
        return torch.full((num_tokens,), UNSEEN)
    return torch.where(learned.isnan(), torch.full_like(learned, UNSEEN), learned)


def remember(
    learned: torch.Tensor | None, deviation: torch.Tensor, refresh: bool = False
) -> torch.Tensor | None:
    """Fold one check's ``deviation`` of a chunk (NaN where unchecked) into its measurements;
    the chunk's new ``learned`` (None while nothing was ever measured). Without ``refresh`` a
    token's first measurement is kept for good (only never-measured tokens take a value);
    with it the newest measurement wins."""
    checked = ~deviation.isnan()
    if learned is not None and not refresh:
        checked &= learned.isnan()
    if not bool(checked.any()):
        return learned
    merged = torch.full_like(deviation, float("nan")) if learned is None else learned.clone()
    merged[checked] = deviation[checked].float()
    return merged
