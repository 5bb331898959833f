#!/usr/bin/env bash
# The main job: creates (or reuses) .venv, installs keras_tfam, trains the default GPT-2
# (gpt2_tiny) on WikiText-2 and exports it for TF Serving under saved_models/gpt2_tiny/<version>.
#
# Data: DATA_DIR (a folder with wiki.{train,valid,test}.tokens) if set; otherwise the
# shared folder ../shared/data/wikitext-2 if present (it holds valid and test only, so the
# run uses the "mini" protocol: train on valid, evaluate on test); otherwise WikiText-2 is
# downloaded through the TFDS builder. Extra arguments go to `tfam train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
args=(--config gpt2_tiny --out runs/gpt2_tiny --export-dir saved_models/gpt2_tiny)
if [ -n "${DATA_DIR:-}" ]; then
  args+=(--data-dir "$DATA_DIR")
elif [ -f ../shared/data/wikitext-2/wiki.valid.tokens ] && [ ! -f ../shared/data/wikitext-2/wiki.train.tokens ]; then
  echo "main: no WikiText-2 train split here; mini protocol (train on valid, evaluate on test)"
  args+=(--data-dir ../shared/data/wikitext-2 --train-split valid --eval-split test)
fi
exec .venv/bin/tfam train "${args[@]}" "$@"
