"""Where the vLLM tests find .venv-vllm's python, waiting for a build still under way.

``scripts/test.sh`` builds .venv-vllm in the background while ruff, mypy and the rest of the
suite run (the build is minutes of downloads), and says so through two environment variables:
``TIERKIT_VLLM_BUILD_STATUS`` names a file that is empty while the build runs and then holds
``ok`` or ``failed``, and ``TIERKIT_VLLM_BUILD_LOG`` its log. With them set, a vLLM test waits
for the build and FAILS if it failed (a broken build must not turn into skipped tests); without
them, the tests skip where .venv-vllm is absent, as a plain ``pytest`` run expects.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
_BUILD_WAIT_S = 1200.0


def _build_outcome(status_path: Path, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        outcome = status_path.read_text().strip() if status_path.exists() else ""
        if outcome:
            return outcome
        time.sleep(1.0)
    return "timed out"


def vllm_python() -> Path:
    """.venv-vllm's python, once built; skips or fails the calling test otherwise."""
    status = os.environ.get("TIERKIT_VLLM_BUILD_STATUS")
    if status:
        outcome = _build_outcome(Path(status), _BUILD_WAIT_S)
        if outcome != "ok":
            log_path = Path(os.environ.get("TIERKIT_VLLM_BUILD_LOG", os.devnull))
            log = log_path.read_text()[-4000:] if log_path.exists() else ""
            pytest.fail(f"building .venv-vllm {outcome}; its log ends:\n{log}")
    if not PYTHON.exists():
        pytest.skip("no .venv-vllm (scripts/vllm_venv.sh builds it)")
    return PYTHON
