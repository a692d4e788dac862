"""Benchmarks of the ``tiers`` package: the I/O engines (``io_engine``) and the tiered store
(``store``)."""
