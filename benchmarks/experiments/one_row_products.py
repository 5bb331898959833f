"""One decoding step's products at batch 1, through Keras' layers and through ours, on XLA's CPU backend.

    python benchmarks/experiments/one_row_products.py [--repeats 5]

Decoding one sequence multiplies a single row by every weight. This script builds GPT-2 small's
products as layers (per block: query, key, value and output projections 768 x 768, feed-forward
768 x 3072 and 3072 x 768, with biases; then the tied 50,257 x 768 head) and times one step of them
in one compiled function, in two pairs, interleaved so that the machine's drift hits both sides:

- `keras.layers.Dense` against `keras_tfam.layers.Dense` (the same weights): XLA fuses Keras'
  `matmul + bias` of one row into a single-threaded loop; ours adds the bias as `x - (-b)`;
- `keras.layers.ReversibleEmbedding` against `keras_tfam.layers.TiedEmbedding` (the head): `h @ E^T`
  makes XLA copy `E` transposed inside a loop; ours computes `E @ h`.

It prints milliseconds per step and the weight bytes read per second, best of `--repeats` series.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/timing.py

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

WIDTH, LAYERS, VOCABULARY = 768, 12, 50257


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="series of 20 steps each; the best counts")
    args = parser.parse_args()
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras
    import numpy as np
    import tensorflow as tf
    from timing import best_interleaved, cpu

    from keras_tfam.layers import Dense, TiedEmbedding

    shapes = [(WIDTH, WIDTH)] * 4 + [(WIDTH, 4 * WIDTH), (4 * WIDTH, WIDTH)]
    keras.utils.set_random_seed(0)
    ours = [Dense(n, bias_initializer="random_normal") for _ in range(LAYERS) for _, n in shapes]
    theirs = [keras.layers.Dense(n) for _ in range(LAYERS) for _, n in shapes]
    for a, b, (k, _) in zip(ours, theirs, shapes * LAYERS):
        a.build((None, k))
        b.build((None, k))
        b.set_weights(a.get_weights())
    head = TiedEmbedding(VOCABULARY, WIDTH)
    keras_head = keras.layers.ReversibleEmbedding(VOCABULARY, WIDTH)
    head.build()
    keras_head.build()
    keras_head.set_weights(head.get_weights())

    def products(layers):
        def step(x):
            h = x
            for layer in layers:
                # Each product feeds the next (its input sliced or tiled to width), so none is skipped.
                k = layer.kernel.shape[0]
                h = layer(h[..., :k] if h.shape[-1] >= k else tf.tile(h, [1, 1, k // h.shape[-1]]))
            return tf.reduce_sum(h)

        return step

    def logits(layer):
        return lambda x: tf.reduce_max(layer(x, reverse=True))

    layer_bytes = sum(k * n + n for k, n in shapes) * LAYERS * 4
    cases = {
        "Dense, Keras'": (products(theirs), layer_bytes),
        "Dense, keras_tfam's": (products(ours), layer_bytes),
        "head, Keras' ReversibleEmbedding": (logits(keras_head), VOCABULARY * WIDTH * 4),
        "head, keras_tfam's TiedEmbedding": (logits(head), VOCABULARY * WIDTH * 4),
    }
    x = tf.constant(np.random.default_rng(0).normal(size=(1, 1, WIDTH)).astype("float32"))
    compiled = {name: tf.function(fn, jit_compile=True, autograph=False) for name, (fn, _) in cases.items()}
    for fn in compiled.values():
        fn(x).numpy()
    twenty_steps = {name: lambda fn=fn: [fn(x).numpy() for _ in range(20)] for name, fn in compiled.items()}
    best = best_interleaved(twenty_steps, args.repeats, per_call=20)
    print(
        f"machine: {cpu()}; TF {tf.__version__}, keras {keras.__version__}; "
        f"batch 1, best of {args.repeats} x 20 steps\n"
    )
    print("| products | ms per step | weight GB/s |\n|---|---:|---:|")
    for name, (_, size) in cases.items():
        print(f"| {name} | {best[name] * 1e3:.2f} | {size / best[name] / 1e9:.1f} |")


if __name__ == "__main__":
    main()
