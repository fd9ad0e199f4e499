#!/usr/bin/env bash
# Install fdbqueue with its dev tools into ./.venv and run the whole test suite.
# FoundationDB-backed tests skip with the reason when no cluster is reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
.venv/bin/python -m pytest "$@"
