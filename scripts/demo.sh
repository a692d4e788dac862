#!/usr/bin/env bash
# The main job: sets up .venv if needed, then runs the tierkit demo.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
tierkit demo "$@"
