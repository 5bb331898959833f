#!/usr/bin/env bash
# Creates (or reuses) .venv, installs keras_tfam with its test extra, runs the tests.
# pytest exits non-zero when it fails or collects no test, and so does this script.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
exec .venv/bin/python -m pytest -q "$@"
