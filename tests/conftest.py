"""Skips tests whose hardware marker (uring, gpu, numa) this machine cannot satisfy, and
runs the vLLM tests last."""

from __future__ import annotations

import functools
import os

import pytest


@functools.cache
def _missing_uring() -> str | None:
    from tiers.io.uring.engine import UringEngine

    return UringEngine.probe()


@functools.cache
def _missing_gpu() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return None if torch.cuda.is_available() else "no CUDA device on this machine"


@functools.cache
def _missing_numa() -> str | None:
    root = "/sys/devices/system/node"
    nodes = [n for n in os.listdir(root) if n.startswith("node")] if os.path.isdir(root) else []
    return None if len(nodes) > 1 else f"only {len(nodes)} NUMA node(s) here"


_CHECKS = {"uring": _missing_uring, "gpu": _missing_gpu, "numa": _missing_numa}


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, check in _CHECKS.items():
        if item.get_closest_marker(marker) is not None and (reason := check()):
            pytest.skip(f"needs {marker}: {reason}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The vLLM tests run last: scripts/test.sh builds their venv while the rest run."""
    last = [item for item in items if "/kvstore/vllm/" in item.path.as_posix()]
    if last:
        keep = [item for item in items if "/kvstore/vllm/" not in item.path.as_posix()]
        items[:] = keep + last
