"""kvstore.vllm against vLLM's own code: the paged-cache layout against vLLM's CPU cache-write
op (layout_contract.py), and the OffloadingSpec and SecondaryTierManager against vLLM's ABCs
(offload_contract.py).

They need vLLM, which is not a tierkit dependency: those files run here under .venv-vllm's
pytest (scripts/vllm_venv.sh builds it; vllm_venv.py says when they skip).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.kvstore.vllm.vllm_venv import vllm_python

CONTRACTS = [
    Path(__file__).with_name(name) for name in ("layout_contract.py", "offload_contract.py")
]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kvstore_vllm_keeps_vllms_contracts(tmp_path: Path) -> None:
    python = vllm_python()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    # -c /dev/null: not tierkit's pytest config (its plug-ins are not in that venv)
    command = [str(python), "-m", "pytest", "-c", os.devnull, "-p", "no:cacheprovider",
               "--rootdir", str(tmp_path), "-q", *map(str, CONTRACTS)]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "failed" not in result.stdout
