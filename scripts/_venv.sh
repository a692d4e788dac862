# Sourced by the README's commands: creates .venv and installs tierkit with what it needs,
# only when pyproject.toml changed since the last install. Needs python3.11+ and pip.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${TIERKIT_PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$py" -m venv .venv
fi
stamp=".venv/.tierkit-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    # torch==2.13.0 is pinned (a CPU build where one is on local disk).
    .venv/bin/python -m pip install --quiet -e ".[dev,torch]"
    echo "$want" > "$stamp"
fi
export PATH="$root/.venv/bin:$PATH"
