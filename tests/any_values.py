"""ANY_VALUE: a hypothesis strategy for whatever a user might put in a setting, so the config
tests can say "any value is accepted or named" for the store's settings and the index's alike."""

from __future__ import annotations

from hypothesis import strategies as st

__all__ = ["ANY_VALUE"]

ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 70), 1 << 70),
    st.sampled_from([1 << 1100, -(1 << 1100)]),  # beyond any float
    st.floats(),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
