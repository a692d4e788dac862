"""tierkit's benchmarks, grouped by the package they measure; run each as a module.

``python -m benchmarks.tiers.io_engine --quick`` and so on (README.md lists them all). The
packages here are not shipped in the wheel; they import tierkit only through public names.
"""
