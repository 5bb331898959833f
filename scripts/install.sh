#!/usr/bin/env bash
# Creates (or reuses) .venv and installs keras_tfam into it, editable, with the extras named in $1
# (e.g. "test", "docs"; none when empty), through uv (installed first with pip): the same versions as pip,
# installed faster. Bytecode is compiled at install, as pip does: with PYTHONDONTWRITEBYTECODE set, every
# process would otherwise compile TensorFlow's sources again on import. The wheel folders pip is told of
# (PIP_FIND_LINKS, pip's configuration) are uv's too, e.g. a local CPU build of PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip uv
target="."
[ -z "${1:-}" ] || target=".[$1]"
links=()
for folder in ${PIP_FIND_LINKS:-} $(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true); do
  [ -d "$folder" ] && links+=(--find-links "$folder")
done
.venv/bin/python -m uv pip install -q --compile-bytecode --python .venv/bin/python "${links[@]}" -e "$target"
