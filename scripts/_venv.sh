# Sourced by the README's commands: creates .venv and installs tierkit with what it needs,
# only when pyproject.toml changed since the last install. Needs python3.11+ and pip.
# Progress goes to stderr: a first install is a silent minute otherwise, and stdout is the
# command's own (the demo's last line is its JSON summary).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${TIERKIT_PYTHON:-python3}"
stamp=".venv/.tierkit-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    if [ -f "$stamp" ]; then
        echo "updating .venv (pyproject.toml changed)..." >&2
    else
        echo "setting up .venv (first run only, ~1 min: numpy, faiss, numba, torch...)" >&2
    fi
    started=$SECONDS
    if [ ! -x .venv/bin/python ]; then
        "$py" -m venv .venv
    fi
    .venv/bin/python -m pip install --quiet --upgrade pip
    # torch==2.13.0 is pinned (a CPU build where one is on local disk).
    .venv/bin/python -m pip install --quiet -e ".[dev,torch]"
    echo "$want" > "$stamp"
    echo ".venv ready in $((SECONDS - started)) s" >&2
fi
export PATH="$root/.venv/bin:$PATH"
