"""One decoding step's attention over a KV cache on XLA's CPU backend: the cache's layout against its speed.

    python benchmarks/experiments/one_query_attention.py [--batch 1 8] [--repeats 5]

A decoding step attends one query per sequence over every cached key and value, in each of GPT-2
small's 12 layers (12 heads of 64, here 160 cached positions: a 32-token prompt and 128 new
tokens). This script times that attention alone, 12 layers per step inside a `tf.while_loop`, in
two forms, interleaved:

- `(B, S, K, H)` cache, multiply and sum: the library's layout (`KeyValueCache`) and its one-query
  kernel (`keras_tfam.ops.attention_weights` / `apply_attention_weights`): XLA writes the products
  `q * k` and `w * v` out, then sums them;
- `(B, K, S, H)` cache, batched products: the head-major layout a cache could have, where both
  products are batched matrix-vector products with no transpose.

(A batched matmul over the `(B, S, K, H)` layout transposes the whole cache every step: slower than
both.) It prints milliseconds per step for the 12 layers, best of `--repeats` series of 32 steps.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/timing.py

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

LAYERS, HEADS, HEAD_DIM, CACHED = 12, 12, 64, 160
STEPS = 32


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=5, help="series of 32 steps each; the best counts")
    args = parser.parse_args()
    for value in [*args.batch, args.repeats]:
        if value < 1:
            parser.error(f"--batch and --repeats take positive integers. Received: {value}")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import numpy as np
    import tensorflow as tf
    from timing import best_interleaved, cpu

    from keras_tfam.ops import apply_attention_weights, attention_weights

    print(f"machine: {cpu()}")
    print(f"{LAYERS} layers x {HEADS} heads of {HEAD_DIM}, {CACHED} cached positions, one query per sequence")
    print("| batch | (B, S, K, H), multiply and sum: ms per step | (B, K, S, H), batched products | ratio |")
    print("|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for batch in args.batch:
        shape = (batch, CACHED, HEADS, HEAD_DIM)
        keys = [tf.Variable(rng.standard_normal(shape).astype("float32")) for _ in range(LAYERS)]
        values = [tf.Variable(rng.standard_normal(shape).astype("float32")) for _ in range(LAYERS)]
        head_keys = [tf.Variable(tf.transpose(k, (0, 2, 1, 3))) for k in keys]
        head_values = [tf.Variable(tf.transpose(v, (0, 2, 1, 3))) for v in values]

        def library(query, i):
            return apply_attention_weights(attention_weights(query, keys[i]), values[i])

        def head_major(query, i):
            weights = tf.nn.softmax(tf.einsum("btnh,bnsh->bnts", query * HEAD_DIM**-0.5, head_keys[i]), -1)
            return tf.einsum("bnts,bnsh->btnh", weights, head_values[i])

        def loop(attend):
            @tf.function(jit_compile=True, autograph=False)
            def run(query):
                def body(step, q):
                    for i in range(LAYERS):
                        q = q + 0.1 * attend(q, i)
                    return step + 1, q

                return tf.while_loop(lambda step, q: step < STEPS, body, (tf.constant(0), query))[1]

            return run

        query = tf.constant(rng.standard_normal((batch, 1, HEADS, HEAD_DIM)).astype("float32"))
        both = tf.function(lambda q: (library(q, 0), head_major(q, 0)), jit_compile=True)
        np.testing.assert_allclose(*both(query), rtol=1e-4, atol=1e-5)  # the same attention, one layer
        forms = {"library": loop(library), "head-major": loop(head_major)}
        for run in forms.values():
            run(query).numpy()
        best = best_interleaved(
            {name: lambda run=run: run(query).numpy() for name, run in forms.items()}, args.repeats, per_call=STEPS
        )
        print(
            f"| {batch} | {best['library'] * 1e3:.2f} | {best['head-major'] * 1e3:.2f} | "
            f"{best['library'] / best['head-major']:.2f}x |"
        )


if __name__ == "__main__":
    main()
