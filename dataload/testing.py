"""Test helpers shipped with the package: one save-and-resume check for every stateful loader.

``assert_resumes_exactly`` runs a loader straight through, then runs fresh loaders that are cut
at the given batch counts -- each cut saves ``state_dict()``, closes the loader, builds a new one
and loads the state -- and asserts both runs yield the same sample keys in the same order. Cuts
may repeat the resume any number of times (resuming twice is the case users hit).

Concurrency: single-threaded test code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["assert_resumes_exactly", "collect_keys"]


def collect_keys(
    make: Callable[[], Any], key_of: Callable[[Any], list[Any]], batches: int
) -> list[Any]:
    """Keys of the first ``batches`` batches of a fresh loader, across epochs."""
    keys: list[Any] = []
    loader = make()
    try:
        while len(keys) < batches:
            for batch in loader:
                keys.append(key_of(batch))
                if len(keys) == batches:
                    break
    finally:
        loader.close()
    return keys


def assert_resumes_exactly(
    make: Callable[[], Any],
    key_of: Callable[[Any], list[Any]],
    cuts: Sequence[int],
    total_batches: int,
) -> None:
    """Straight run == run cut (save, close, rebuild, load) after each count in ``cuts``."""
    expected = collect_keys(make, key_of, total_batches)
    got: list[Any] = []
    state: dict[str, Any] | None = None
    boundaries = [*sorted({c for c in cuts if 0 < c < total_batches}), total_batches]
    for boundary in boundaries:
        loader = make()
        try:
            if state is not None:
                loader.load_state_dict(state)
            while len(got) < boundary:
                for batch in loader:
                    got.append(key_of(batch))
                    if len(got) == boundary:
                        break
            state = loader.state_dict()
        finally:
            loader.close()
    assert got == expected, _first_difference(expected, got)


def _first_difference(expected: list[Any], got: list[Any]) -> str:
    for i, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return f"batch {i} differs after resume: expected {a}, got {b}"
    return f"lengths differ: expected {len(expected)} batches, got {len(got)}"
