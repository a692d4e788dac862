"""Benchmarks of the ``vectordb`` package: the SPANN index against faiss and DiskANN
(``spann``), its placement defaults (``placement``) and what corruption costs (``scrub``).

Nothing here may import numpy or the repository: ``_diskann_worker`` runs as
``-m benchmarks.vectordb._diskann_worker`` under another venv's interpreter, which imports
this package first.
"""
