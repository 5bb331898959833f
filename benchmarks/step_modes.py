"""One small model's training step, fit after fit: how fast, and on how many cores (TensorFlow, a CPU).

    python benchmarks/step_modes.py [--fits 4] [--steps 160] [--steps-per-execution 16]
    XLA_FLAGS=--xla_cpu_multi_thread_eigen=false python benchmarks/step_modes.py   # XLA's options apply

Trains a 2-layer, 64-wide GPT2LM (rotary positions, 283 tokens: the size of a character-level model of
WikiText-2) on batches of 32 x 64 random tokens with `model.fit(jit_compile=True)`, warmed up by one
short fit, then times `--fits` fits of `--steps` steps each over the same data in one process. For each
fit it prints milliseconds per step and the process's CPU-seconds per wall-second: about 1.7 when the
step's work runs on both cores of a 2-core machine, about 0.9 when it runs on one at a time. On a 2-core
AMD EPYC the same compiled step ran in either of two modes, 32 or 64 ms per step, switching between fits
of one process (BENCHMARKS.md, "Two speeds of one compiled step").
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=4, help="timed fits in this process")
    parser.add_argument("--steps", type=int, default=160, help="training steps per fit")
    parser.add_argument("--steps-per-execution", type=int, default=16, help="as `model.compile`'s")
    args = parser.parse_args()
    from timing import refuse_non_positive

    refuse_non_positive(parser, args, "fits", "steps", "steps_per_execution")
    import time

    import keras
    import numpy as np
    from timing import machine

    from keras_tfam.models import GPT2LM

    vocabulary_size, batch, length = 283, 32, 64
    keras.utils.set_random_seed(0)
    model = GPT2LM(vocabulary_size=vocabulary_size, num_layers=2, num_heads=4, hidden_dim=64,
                   max_sequence_length=length, context_length=length, position="rotary")
    model.compile(keras.optimizers.AdamW(3e-3, weight_decay=0.0),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True,
                  steps_per_execution=args.steps_per_execution)
    tokens = np.random.default_rng(0).integers(0, vocabulary_size, size=(batch * args.steps, length + 1)).astype("int32")
    warm_up = batch * args.steps_per_execution
    model.fit(tokens[:warm_up, :-1], tokens[:warm_up, 1:], batch_size=batch, epochs=1, verbose=0)
    print(f"machine: {machine()}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print(f"2-layer 64-wide GPT2LM, batch {batch} x {length}, {args.steps} steps a fit, "
          f"steps_per_execution {args.steps_per_execution}")
    print("| fit | ms per step | CPU-seconds per second |")
    print("|---:|---:|---:|")
    for fit in range(1, args.fits + 1):
        cpu, wall = time.process_time(), time.perf_counter()
        model.fit(tokens[:, :-1], tokens[:, 1:], batch_size=batch, epochs=1, verbose=0)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(f"| {fit} | {wall / args.steps * 1e3:.1f} | {cpu / wall:.2f} |", flush=True)


if __name__ == "__main__":
    main()
