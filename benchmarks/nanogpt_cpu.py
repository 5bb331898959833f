"""Training on a CPU: keras_tfam against nanoGPT's own CPU recipe, tokens/s at the same validation loss.

    bash benchmarks/install_peers.sh                       # torch (CPU) for the peer
    git clone https://github.com/karpathy/nanoGPT /tmp/nanoGPT    # the peer's code (not part of this repo)
    python benchmarks/nanogpt_cpu.py --nanogpt /tmp/nanoGPT --peers-python .venv-peers/bin/python

nanoGPT's README gives this recipe for a CPU: the character-level Shakespeare config with 4 layers,
4 heads, width 128, context 64, batch 12, dropout 0, 2000 iterations (AdamW, learning rate 1e-3
warmed up over 100 iterations then cosine-decayed to 1e-4, beta2 0.99, weight decay 0.1, gradient
clipping at 1). Both engines train that model on the same characters:

- nanoGPT runs its own `train.py` on its own `model.py`, in its own process (`--device=cpu
  --compile=False`), on data written in its format (`train.bin`, `val.bin`, `meta.pkl`, split 90/10
  as its `shakespeare_char/prepare.py` does);
- keras_tfam trains a `GPT2LM` of the same sizes with the same optimiser and schedule through
  `model.fit`, on the kernel path `pipelines.kernel_path` picks for this machine.

The text is `--text` (tiny-shakespeare's `input.txt` where you have it); by default the WikiText-2
validation split, 1.1M characters like tiny-shakespeare, since this machine cannot download. Speed:
tokens per second of the training step (median over the iterations after the first 20); quality:
validation loss (nats per character) after the last iteration, averaged over `--eval-iters`
random batches as nanoGPT's `estimate_loss` does.
"""

import argparse
import json
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from pipelines.config import PRECISIONS

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TEXT = os.path.join(HERE, "..", "..", "shared", "data", "wikitext-2", "wiki.valid.tokens")
RECIPE = {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 12, "dropout": 0.0}
SMOKE_RECIPE = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "batch_size": 2, "dropout": 0.0}
WARMUP = 20  # iterations not timed (compilation, then the first steps)


def prepare(text_path, folder):
    """nanoGPT's character-level data: train.bin / val.bin (uint16) and meta.pkl; returns the arrays."""
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.array([index[c] for c in text], dtype=np.uint16)
    split = int(0.9 * len(ids))
    os.makedirs(folder, exist_ok=True)
    ids[:split].tofile(os.path.join(folder, "train.bin"))
    ids[split:].tofile(os.path.join(folder, "val.bin"))
    with open(os.path.join(folder, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": index}, f)
    return ids[:split], ids[split:], len(chars)


def run_nanogpt(checkout, python, workdir, iters, eval_iters):
    """nanoGPT's train.py on the prepared data: {"tokens_per_s", "val_loss"}."""
    for name in ("train.py", "model.py", "configurator.py"):
        shutil.copy(os.path.join(checkout, name), workdir)
    options = {
        **RECIPE,
        "device": "cpu",
        "compile": False,
        "eval_iters": eval_iters,
        "log_interval": 1,
        "max_iters": iters,
        "lr_decay_iters": iters,
        "eval_interval": iters,
        "dataset": "bench_char",
        "always_save_checkpoint": False,
        "learning_rate": 1e-3,
        "min_lr": 1e-4,
        "beta2": 0.99,
        "warmup_iters": 100,
        "gradient_accumulation_steps": 1,
        "dtype": "float32",
        "out_dir": os.path.join(workdir, "out"),
    }
    arguments = [f"--{key}={value}" for key, value in options.items()]
    output = subprocess.run(
        [python, "train.py", *arguments], cwd=workdir, capture_output=True, text=True, check=True
    ).stdout
    times = [float(t) for t in re.findall(r"^iter \d+: loss [\d.]+, time ([\d.]+)ms", output, re.M)]
    val = float(re.findall(r"^step \d+: train loss [\d.]+, val loss ([\d.]+)", output, re.M)[-1])
    seconds = statistics.median(times[WARMUP:]) / 1e3
    return {"tokens_per_s": RECIPE["batch_size"] * RECIPE["block_size"] / seconds, "val_loss": val}


def run_ours(
    train, val, vocabulary_size, iters, eval_iters, jit="auto", precision="auto", recipe=RECIPE, warmup=WARMUP
):
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import time

    import keras
    import tensorflow as tf

    from keras_tfam.models import GPT2LM
    from pipelines.config import TrainConfig
    from pipelines.kernel_path import choose_kernel_path, describe, training_step_seconds, with_cpu_settings
    from pipelines.training import build_optimizer

    batch, block = recipe["batch_size"], recipe["block_size"]

    def build_model():
        return GPT2LM(
            vocabulary_size=vocabulary_size,
            num_layers=recipe["n_layer"],
            num_heads=recipe["n_head"],
            hidden_dim=recipe["n_embd"],
            max_sequence_length=block,
            dropout=0.0,
        )

    def optimizer():
        # nanoGPT's optimiser: AdamW, warmup over 100 iterations then cosine from 1e-3 to 1e-4 at `iters`,
        # beta2 0.99, weight decay 0.1 (here on matrices only, the pipeline's rule), clipping at 1.
        return build_optimizer(
            TrainConfig(
                learning_rate=1e-3,
                warmup_steps=100,
                max_steps=iters,
                min_learning_rate_ratio=0.1,
                weight_decay=0.1,
                beta_2=0.99,
                clip_norm=1.0,
            )
        )

    def step_seconds(jit_compile, policy):
        return training_step_seconds(build_model, optimizer, batch, block, vocabulary_size, jit_compile, policy)

    path = with_cpu_settings(choose_kernel_path(jit, precision, tf.distribute.get_strategy(), step_seconds))
    keras.mixed_precision.set_global_policy(path["precision"])
    keras.utils.set_random_seed(1337)
    model = build_model()
    model.compile(
        optimizer(), keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=path["jit_compile"]
    )
    rng = np.random.default_rng(1337)

    def windows(data, count):
        starts = rng.integers(0, len(data) - block - 1, size=count)
        w = data[starts[:, None] + np.arange(block + 1)].astype("int32")
        return w[:, :-1], w[:, 1:]

    class Times(keras.callbacks.Callback):
        def on_train_batch_begin(self, step, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, step, logs=None):
            times.append(time.perf_counter() - self.start)

    times = []
    x, y = windows(train, iters * batch)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[Times()])
    vx, vy = windows(val, eval_iters * batch)
    val_loss = model.evaluate(vx, vy, batch_size=batch, verbose=0)
    return {
        "tokens_per_s": batch * block / statistics.median(times[warmup:]),
        "val_loss": float(val_loss),
        "kernel_path": describe(path),
        "measured_ms": path.get("measured_ms"),
    }


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", help="a checkout of karpathy/nanoGPT (without it: ours only)")
    parser.add_argument(
        "--peers-python", default=sys.executable, type=os.path.abspath
    )  # nanoGPT runs in its own folder
    parser.add_argument("--text", default=DEFAULT_TEXT)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--eval-iters", type=int, default=200)
    parser.add_argument(
        "--jit", choices=("auto", "on", "off"), default="auto", help="our kernel path, as `tfam train --jit`"
    )
    parser.add_argument(
        "--precision", choices=PRECISIONS, default="auto", help="our precision, as `tfam train --precision`"
    )
    parser.add_argument("--json", help="also write the results there (with the machine and the settings)")
    sys.path.insert(0, HERE)
    from timing import add_smoke, cpu, skipped, small_wikitext, smoke_folder, smoke_settings

    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), iters=3, eval_iters=2)
    workdir = smoke_folder("nanogpt_cpu") if args.smoke else tempfile.mkdtemp()
    if args.smoke:  # the first lines of the validation split, a tiny model, a step timed
        args.text = os.path.join(small_wikitext(os.path.join(workdir, "wikitext-2"), 40, 0), "wiki.valid.tokens")
    train, val, vocabulary_size = prepare(args.text, os.path.join(workdir, "data", "bench_char"))
    results = {}
    if args.nanogpt and args.smoke:
        skipped("nanoGPT")
    elif args.nanogpt:
        results["nanoGPT"] = run_nanogpt(args.nanogpt, args.peers_python, workdir, args.iters, args.eval_iters)
        print(f"nanoGPT: {json.dumps(results['nanoGPT'])}", flush=True)
    recipe, warmup = (SMOKE_RECIPE, 1) if args.smoke else (RECIPE, WARMUP)
    results["keras_tfam"] = run_ours(
        train, val, vocabulary_size, args.iters, args.eval_iters, args.jit, args.precision, recipe, warmup
    )
    print(f"keras_tfam: {json.dumps(results['keras_tfam'])}", flush=True)
    print(
        f"\nmachine: {cpu()}; text {os.path.basename(args.text)} ({len(train) + len(val):,} characters, "
        f"{vocabulary_size} distinct), {args.iters} iterations\n"
    )
    print("| engine | tokens/s | keras_tfam / it | validation loss |\n|---|---:|---:|---:|")
    for name, result in results.items():
        ratio = results["keras_tfam"]["tokens_per_s"] / result["tokens_per_s"]
        print(f"| {name} | {result['tokens_per_s']:,.0f} | {ratio:.2f}x | {result['val_loss']:.4f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": cpu(), "settings": vars(args), "results": results}, f)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
