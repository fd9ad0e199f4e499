#!/usr/bin/env bash
# Install fdbqueue into ./.venv and run the end-to-end demo on the embedded engine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[cli]'
.venv/bin/fdbqueue demo "$@"
