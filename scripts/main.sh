#!/usr/bin/env bash
# The main job: creates (or reuses) .venv, installs keras_tfam, runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
exec .venv/bin/python -m pipelines.demo "$@"
