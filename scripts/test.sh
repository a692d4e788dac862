#!/usr/bin/env bash
# The whole test suite: sets up .venv if needed, then ruff, mypy and pytest.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
# .venv-vllm, for the vLLM tests (tests/kvstore/vllm), builds in the background meanwhile
# (minutes of downloads on a first run; cached after): those tests run last and wait for it,
# failing if the build failed. TIERKIT_SKIP_VLLM=1 skips it and them.
vllm_log="$(mktemp)" vllm_status="$(mktemp)"
(
    if bash "$(dirname "${BASH_SOURCE[0]}")/vllm_venv.sh" >"$vllm_log" 2>&1; then
        echo ok >"$vllm_status"
    else
        echo failed >"$vllm_status"
    fi
) &
vllm_build=$!
kill_tree() {  # the build's pip too, when a failing step ends this script early
    local child
    for child in $(pgrep -P "$1"); do kill_tree "$child"; done
    kill "$1" 2>/dev/null || true
}
trap 'kill_tree "$vllm_build"' EXIT
export TIERKIT_VLLM_BUILD_STATUS="$vllm_status" TIERKIT_VLLM_BUILD_LOG="$vllm_log"
ruff check .
ruff format --check . || { echo "ruff format: run 'ruff format .'"; exit 1; }
mypy  # the library packages, as configured in pyproject.toml
# Two processes, a test file each at a time (module fixtures stay in one process): much of the
# suite waits on subprocesses, fsync and sockets, so two overlap well even on 2 vCPUs.
# Arguments come after, so `-n 0` runs it in one process.
python -m pytest -n 2 --dist loadfile "$@"
wait "$vllm_build"
cat "$vllm_log" >&2
