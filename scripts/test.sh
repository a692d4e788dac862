#!/usr/bin/env bash
# The whole test suite: sets up .venv if needed, then ruff, mypy and pytest.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
ruff check .
ruff format --check . || { echo "ruff format: run 'ruff format .'"; exit 1; }
mypy  # the library packages, as configured in pyproject.toml
# .venv-vllm for the vLLM tests (tests/kvstore/vllm): cached; TIERKIT_SKIP_VLLM=1 skips it
bash "$(dirname "${BASH_SOURCE[0]}")/vllm_venv.sh"
python -m pytest "$@"
