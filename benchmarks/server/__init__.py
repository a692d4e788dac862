"""The REST service's load benchmark (issue 16): ``python -m benchmarks.server.load --quick``."""
