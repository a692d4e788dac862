"""kvstore.testing: helpers for tests and benchmarks of KV caching (a tiny random Llama).

``tiny_llama`` imports only torch and, when called, transformers; nothing here is imported
by the rest of ``kvstore``.
"""

from kvstore.testing.tiny_llama import make_tiny_llama

__all__ = ["make_tiny_llama"]
