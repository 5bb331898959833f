"""The matmul floor of GPT-2 small decoding: one step's weight products alone, per kernel path and precision.

    python benchmarks/experiments/decode_matmul_floor.py [--batch 1 8]

A decoding step multiplies `batch` rows by every weight of the model once: per
layer the query, key, value and output projections (768 x 768 each) and the
two feed-forward matrices (768 x 3072, 3072 x 768), then the tied head
(50,257 x 768). This script runs exactly those products, nothing else, in one
compiled function, under XLA and under TensorFlow's own (oneDNN) kernels, with
float32 and bfloat16 weights. Steps/s is what decoding could reach if
everything but the matmuls were free; GB/s is the weight bytes read per second.
The machine (CPU model, flags, cores) heads the output.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/timing.py

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

WIDTH, LAYERS, VOCABULARY = 768, 12, 50257


def floor(batch, dtype, jit_compile, repeats=20):
    """(steps/s, GB/s) of one decoding step's matmuls at `batch` rows."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    shapes = [(WIDTH, WIDTH)] * 4 + [(WIDTH, 4 * WIDTH), (4 * WIDTH, WIDTH)]
    weights = [
        tf.Variable(tf.cast(rng.standard_normal(shape, dtype="float32") * 0.02, dtype))
        for _ in range(LAYERS)
        for shape in shapes
    ]
    embedding = tf.Variable(tf.cast(rng.standard_normal((VOCABULARY, WIDTH), dtype="float32") * 0.02, dtype))
    size = 2 if dtype == tf.bfloat16 else 4
    weight_bytes = (sum(int(np.prod(w.shape)) for w in weights) + VOCABULARY * WIDTH) * size

    @tf.function(jit_compile=jit_compile, autograph=False)
    def step(x):
        # Each product feeds the next (768 -> 768 four times -> 3072 -> 768 per layer), so none can be
        # skipped or reordered away; the weights read are the model's.
        h = x
        for w in weights:
            h = tf.matmul(h, w)
        logits = tf.matmul(h, embedding, transpose_b=True)
        return tf.reduce_max(tf.cast(logits, tf.float32))

    x = tf.cast(tf.random.normal((batch, WIDTH), stddev=0.02), dtype)
    step(x).numpy()  # compiles
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            step(x).numpy()
        best = min(best, (time.perf_counter() - start) / repeats)
    return 1 / best, weight_bytes / best / 1e9


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    import tensorflow as tf
    from timing import cpu

    print(f"machine: {cpu()}; TensorFlow {tf.__version__}\n")
    print("| batch | weights | kernels | steps/s | tokens/s | weight GB/s |\n|---:|---|---|---:|---:|---:|")
    for batch in args.batch:
        for dtype in (tf.float32, tf.bfloat16):
            for jit_compile in (True, False):
                steps, bandwidth = floor(batch, dtype, jit_compile)
                print(
                    f"| {batch} | {dtype.name} | {'XLA' if jit_compile else 'oneDNN'} | {steps:.1f} | "
                    f"{steps * batch:.1f} | {bandwidth:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
