"""The KV-cache store's benchmark (issue 17): ``python -m benchmarks.kvstore.cache [--quick]``."""
