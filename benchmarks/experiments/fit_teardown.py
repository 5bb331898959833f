"""Where a `fit` over tf.data spends its time: the steps, and the wait after the last one (TensorFlow).

    python benchmarks/experiments/fit_teardown.py [--fits 6] [--steps 50] [--steps-per-execution 1]

Trains a 2-layer, 64-wide GPT2LM (rotary positions, 283 tokens: the size of a character-level model of
WikiText-2) on batches of 32 x 64 random tokens with `model.fit(jit_compile=True)`, warmed up by one
short fit of each kind, then times `--fits` rounds of three fits over the same data in one process:

- `arrays`: NumPy arrays, through Keras' own array adapter (a tf.data pipeline with autotuning on);
- `autotuned`: a `tf.data.Dataset` of the same batches, prefetched, autotuning on (tf.data's default);
- `untuned`: the same dataset with `options.autotune.enabled = False`, as `pipelines.data.lm_stream` does.

For each fit it prints the steps' own milliseconds (first step's start to last step's end, from a
callback), the whole fit's milliseconds per step, and the time from the last step's end to `fit`'s
return. An autotuned iterator runs a thread that wakes 10, 30, 70, ... ms after the iterator is made
(`10 * (2**k - 1)` ms, then every 60 s); deleting the iterator often waits for the next of those wakes.
The last column says which wake the fit ended at, when it ended within 60 ms after one (the fit
makes its iterator a few ms after it starts; Keras' array adapter builds its pipeline first).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/timing.py

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

KINDS = ("arrays", "autotuned", "untuned")


def tuner_wakes_ms(until_ms):
    """The times an autotuned tf.data iterator's tuning thread wakes, in ms after the iterator is made."""
    wakes, period, at = [], 10, 10
    while at <= until_ms:
        wakes.append(at)
        period = min(2 * period, 60_000)
        at += period
    return wakes


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=6, help="timed rounds of one fit of each kind")
    parser.add_argument("--steps", type=int, default=50, help="training steps per fit")
    parser.add_argument("--steps-per-execution", type=int, default=1, help="as `model.compile`'s")
    args = parser.parse_args()
    from timing import refuse_non_positive

    refuse_non_positive(parser, args, "fits", "steps", "steps_per_execution")
    import time

    import keras
    import numpy as np
    import tensorflow as tf
    from timing import machine

    from keras_tfam.models import GPT2LM

    vocabulary_size, batch, length = 283, 32, 64
    keras.utils.set_random_seed(0)
    model = GPT2LM(
        vocabulary_size=vocabulary_size,
        num_layers=2,
        num_heads=4,
        hidden_dim=64,
        max_sequence_length=length,
        context_length=length,
        position="rotary",
    )
    model.compile(
        keras.optimizers.AdamW(3e-3, weight_decay=0.0),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
        steps_per_execution=args.steps_per_execution,
    )
    tokens = (
        np.random.default_rng(0).integers(0, vocabulary_size, size=(batch * args.steps, length + 1)).astype("int32")
    )
    x, y = tokens[:, :-1], tokens[:, 1:]

    def data(kind, count):
        if kind == "arrays":
            return {"x": x[:count], "y": y[:count], "batch_size": batch}
        dataset = tf.data.Dataset.from_tensor_slices((x[:count], y[:count])).batch(batch).prefetch(tf.data.AUTOTUNE)
        options = tf.data.Options()
        options.autotune.enabled = kind == "autotuned"
        return {"x": dataset.with_options(options)}

    class Times(keras.callbacks.Callback):
        def on_train_batch_begin(self, step, logs=None):
            if step == 0:
                self.first = time.perf_counter()

        def on_train_batch_end(self, step, logs=None):
            self.last = time.perf_counter()

    for kind in KINDS:
        model.fit(**data(kind, batch * args.steps_per_execution), epochs=1, shuffle=False, verbose=0)
    print(f"machine: {machine()}, keras {keras.__version__}")
    print(
        f"2-layer 64-wide GPT2LM, batch {batch} x {length}, {args.steps} steps a fit, "
        f"steps_per_execution {args.steps_per_execution}"
    )
    print(
        "| data | fit | steps' ms per step | fit's ms per step | after the last step, ms | ended at the tuner's wake |"
    )
    print("|---|---:|---:|---:|---:|---|")
    waits = {kind: [] for kind in KINDS}
    for fit in range(1, args.fits + 1):
        for kind in KINDS:
            times = Times()
            start = time.perf_counter()
            model.fit(**data(kind, len(x)), epochs=1, shuffle=False, verbose=0, callbacks=[times])
            end = time.perf_counter()
            after_ms = (end - times.last) * 1e3
            waits[kind].append(after_ms)
            ended_ms = (end - start) * 1e3
            wake = [w for w in tuner_wakes_ms(ended_ms) if 0 <= ended_ms - w <= 60]
            print(
                f"| {kind} | {fit} | {(times.last - times.first) / args.steps * 1e3:.1f} | "
                f"{ended_ms / args.steps:.1f} | {after_ms:,.0f} | {f'{wake[-1]:,} ms' if wake else '-'} |",
                flush=True,
            )
    print("\n| data | fits that waited over 100 ms after their last step | mean wait, ms |\n|---|---:|---:|")
    for kind, values in waits.items():
        print(f"| {kind} | {sum(v > 100 for v in values)} of {len(values)} | {np.mean(values):,.0f} |")


if __name__ == "__main__":
    main()
