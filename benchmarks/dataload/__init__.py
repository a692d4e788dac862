"""Benchmark of the ``dataload`` package: the shuffled loader against its peers (``loader``)."""
