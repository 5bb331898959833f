#!/usr/bin/env bash
# Builds the documentation site into site/ (not committed) with MkDocs, Material and mkdocstrings:
# the reference from the docstrings (docs/reference/*.md name every public class and function), the
# guides, the pattern pictures. Warnings are errors (mkdocs.yml: strict), so a broken link or a
# reference to a name that does not exist fails the build. Creates (or reuses) .venv as
# scripts/test.sh does. `bash scripts/docs.sh serve` serves it on localhost:8000 instead.
set -euo pipefail
if [ "$#" -gt 1 ] || { [ "$#" -eq 1 ] && [ "$1" != "serve" ]; }; then
  echo "scripts/docs.sh: unknown argument(s) '$*'; usage: bash scripts/docs.sh [serve]" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
bash scripts/install.sh docs
export NO_MKDOCS_2_WARNING=1
if [ "${1:-}" = "serve" ]; then
  exec .venv/bin/mkdocs serve
fi
.venv/bin/mkdocs build --strict --site-dir site
echo "site/index.html"
