#!/usr/bin/env bash
# The main command: sets up .venv if needed, then runs the REST vector search service on
# http://127.0.0.1:6333 with its data in .tierkit-data/ (arguments go to `tierkit serve`).
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
exec tierkit serve --data .tierkit-data "$@"
