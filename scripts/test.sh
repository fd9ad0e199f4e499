#!/usr/bin/env bash
# Install fdbqueue with its dev tools into ./.venv and run the whole test suite.
# The fdb:// engine's tests run on a real cluster when one is reachable, otherwise through the
# official bindings over the C-API double (tests/support/fdbdouble/); real-cluster-only tests
# then skip with the reason. The tiers: tests/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev,spark,cli,web,metrics]'
# The Spark tests start a real local Spark, which needs a Java runtime (17 or later); the
# dashboard's browser tests drive Debian's Chromium (Playwright, from the dev extra, drives it).
need=()
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v chromium >/dev/null || [ -n "${CHROMIUM:-}" ] || need+=(chromium)
if [ "${#need[@]}" -gt 0 ]; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Installed above: a missing pyspark or browser is then a failure, not a skip.
FDBQUEUE_REQUIRE_SPARK=1 FDBQUEUE_REQUIRE_BROWSER=1 .venv/bin/python -m pytest "$@"
