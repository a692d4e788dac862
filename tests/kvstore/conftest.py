"""Fixtures shared by the kvstore tests: the tiny random Llama, made once per test module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer random Llama (seed 0, float32, head_dim 32, 2 KV heads) saved locally; skips
    the test where transformers is not installed."""
    pytest.importorskip("transformers", reason="the tiny Llama needs transformers")
    from kvstore.testing.tiny_llama import make_tiny_llama

    return make_tiny_llama(str(tmp_path_factory.mktemp("tiny-llama")))
