"""A training step with `keras_tfam.losses.TokenCrossEntropy` against Keras' sparse cross-entropy.

    python benchmarks/experiments/loss_step.py [--vocabulary 8192 --batch 16 --length 256 --rounds 2]

GPT2LM of `benchmarks/train_step.py`'s size (4 layers, width 256, 4 heads, dropout 0), AdamW,
`jit_compile=True`, TensorFlow: two models of the same initial weights, one per loss, whose
`train_on_batch` steps alternate (A B A B ...) so that a machine whose speed drifts slows both
alike; the median of `--steps` steps each after 3 compiling ones, per round (a fresh process).
"""

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/timing.py


def run(args):
    """Median step time of each loss: two models of the same weights, their steps interleaved."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    from keras_tfam.losses import TokenCrossEntropy
    from keras_tfam.models import GPT2LM

    losses = {"keras": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "token": TokenCrossEntropy()}
    models = {}
    for name, loss in losses.items():
        keras.utils.set_random_seed(0)
        models[name] = GPT2LM(
            vocabulary_size=args.vocabulary,
            num_layers=4,
            num_heads=4,
            hidden_dim=256,
            intermediate_dim=1024,
            max_sequence_length=args.length,
            dropout=0.0,
        )
        models[name].compile(keras.optimizers.AdamW(1e-3), loss, jit_compile=True)
    ids = np.random.default_rng(0).integers(0, args.vocabulary, size=(args.batch, args.length + 1)).astype("int32")
    times, values = {name: [] for name in models}, {}
    for step in range(3 + args.steps):
        for name, model in models.items():
            start = time.perf_counter()
            values[name] = float(model.train_on_batch(ids[:, :-1], ids[:, 1:]))
            if step >= 3:  # the first steps compile
                times[name].append(time.perf_counter() - start)
    return {name: {"ms": 1e3 * float(np.median(times[name])), "loss": values[name]} for name in models}


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocabulary", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engine", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        print(json.dumps(run(args)))
        return
    from timing import cpu, forwarded_options, run_json

    forwarded = [*forwarded_options(args, "rounds"), "--engine"]
    print(f"{cpu()}; GPT2LM 4 x 256, vocabulary {args.vocabulary}, batch {args.batch} x {args.length}, float32\n")
    print("| round | Keras' loss | TokenCrossEntropy | Keras / ours |\n|---|---:|---:|---:|")
    for round_ in range(1, args.rounds + 1):
        result = run_json(__file__, *forwarded)
        theirs, ours = result["keras"], result["token"]
        assert abs(theirs["loss"] - ours["loss"]) < 1e-3 * abs(theirs["loss"]), result  # the same training
        print(
            f"| {round_} | {theirs['ms']:.1f} ms | {ours['ms']:.1f} ms | {theirs['ms'] / ours['ms']:.2f}x |", flush=True
        )


if __name__ == "__main__":
    main()
