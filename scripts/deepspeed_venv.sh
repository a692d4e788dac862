#!/usr/bin/env bash
# Builds .venv-deepspeed, the venv the optimizer benchmark's DeepSpeed peer runs in
# (benchmarks/optim/deepspeed_peer.py), from scripts/deepspeed-requirements.txt. Cached: it
# rebuilds only when the requirements file's sha256 differs from the one stored in the venv.
# DeepSpeed's C++ ops (CPU Adam, async_io over libaio, pinned memory, the shared-memory comm its
# CPU accelerator loads) are compiled once here, into the venv's own torch_extensions folder, so
# a benchmark run never pays a JIT build. async_io needs libaio-dev (installed with apt-get when
# missing, as root). A first build is ~15 min on 2 idle cores (37 min under load), 1.2 GB.
# TIERKIT_SKIP_DEEPSPEED=1 skips it (the benchmark then reports DeepSpeed as absent).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ "${TIERKIT_SKIP_DEEPSPEED:-0}" = "1" ]; then
    echo "deepspeed_venv: skipped (TIERKIT_SKIP_DEEPSPEED=1)" >&2
    exit 0
fi
py="${TIERKIT_PYTHON:-python3}"
venv=".venv-deepspeed"
reqs="scripts/deepspeed-requirements.txt"
stamp="$venv/.tierkit-deepspeed-requirements"
want="$(sha256sum "$reqs" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
    exit 0
fi
started=$SECONDS
echo "building $venv (~15 min: torch, DeepSpeed, its CPU Adam, async_io and comm ops)..." >&2
if ! dpkg -s libaio-dev >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq libaio-dev >&2
fi
rm -rf "$venv"
"$py" -m venv "$venv"
# DeepSpeed's setup.py imports torch, so torch goes in first and DeepSpeed builds against it.
grep -v '^deepspeed' "$reqs" > "$venv/base-requirements.txt"
"$venv/bin/python" -m pip install --quiet -r "$venv/base-requirements.txt"
export DS_ACCELERATOR=cpu
"$venv/bin/python" -m pip install --quiet --no-build-isolation "$(grep '^deepspeed' "$reqs")"
# A build that fails half way leaves no stamp, so the next run starts over.
export TORCH_EXTENSIONS_DIR="$root/$venv/torch_extensions"
"$venv/bin/python" - <<'PY' >&2
from deepspeed.accelerator import get_accelerator
for name in ("CPUAdamBuilder", "AsyncIOBuilder", "PinMemoryBuilder", "ShareMemCommBuilder"):
    builder = get_accelerator().create_op_builder(name)
    builder.load(verbose=False)
    print("built", builder.name)
PY
echo "$want" > "$stamp"
echo "$venv ready in $((SECONDS - started)) s ($(du -sh "$venv" | cut -f1))" >&2
