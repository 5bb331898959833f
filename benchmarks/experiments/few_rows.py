"""A few rows by float32 or 16-bit weights inside a decoding loop: Keras' product against `(rows @ x^T)^T`.

    python benchmarks/experiments/few_rows.py [--rows 2 4 8 16 32 64] [--repeats 5] [--steps 32] [--dtype bfloat16]

Decoding a batch of B sequences multiplies B rows by every weight matrix, once per step, inside a
compiled loop. On a CPU, XLA's product of `x (M, K)` by a `(K, N)` kernel reads the kernel at about half
more slowly than the product of the kernel's rows `(N, K)` by `x^T`. `keras_tfam.layers.Dense` therefore
multiplies a few rows inside the generator's loop as `keras_tfam.engine.xla_cpu.columns_product` over the kernel
transposed once before the loop (`XlaCpuEngine.loop`), and `TiedEmbedding` its logits as
`(E @ h^T)^T` over the table as it is stored. This times, for each number of rows, one loop step of:

- the feed-forward products of GPT-2 small (12 layers of 768 x 3072 and 3072 x 768, with biases and a
  residual, as in decoding): `keras.layers.Dense` against `keras_tfam.layers.Dense` inside
  the XLA-CPU engine's loop (the transposed copies made once per call, outside the loop, and counted);
- GPT-2 small's tied head (50,257 x 768): `keras.layers.ReversibleEmbedding` against
  `keras_tfam.layers.TiedEmbedding` in the XLA-CPU engine.

With `--dtype bfloat16` (or float16) every layer computes in that dtype, as `generation.with_dtype` makes
a model: XLA's CPU product multiplies float32 copies of 16-bit weights (Keras' layers), and ours copies
them to float32 rows before the loop; either way the loop reads float32 weights, counted at 4 bytes each.

Every form runs in its own compiled loop of `--steps` steps, interleaved, best of `--repeats`; it prints
milliseconds per step, the weight bytes read per second and the ratio, the machine first. The results
are checked against each other (the same sums in another order: within float32 rounding, or a 16-bit one).
"""

import argparse
import os
import sys
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/timing.py

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

WIDTH, LAYERS, VOCABULARY = 768, 12, 50257


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64], help="rows per product (2-64)")
    parser.add_argument("--repeats", type=int, default=5, help="series of --steps steps each; the best counts")
    parser.add_argument("--steps", type=int, default=32, help="loop steps per call")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="the layers' dtype (weights and computation)",
    )
    args = parser.parse_args()
    from timing import refuse_non_positive

    refuse_non_positive(parser, args, "repeats", "steps")
    bad = [rows for rows in args.rows if not 2 <= rows <= 64]
    if bad:
        parser.error(f"--rows must be integers from 2 to 64. Received: {bad[0]}")
    import keras
    import numpy as np
    from timing import best_interleaved, cpu

    from keras_tfam.engine.xla_cpu import XLA_CPU
    from keras_tfam.layers import Dense, TiedEmbedding
    from keras_tfam.utils import static_dim

    keras.utils.set_random_seed(0)
    kernel_init = keras.initializers.RandomNormal(stddev=0.02)
    ours, theirs = [], []
    for units, width in [(4 * WIDTH, WIDTH), (WIDTH, 4 * WIDTH)] * LAYERS:
        layer = Dense(units, kernel_initializer=kernel_init, bias_initializer=kernel_init, dtype=args.dtype)
        layer.build((None, width))
        keras_layer = keras.layers.Dense(units, dtype=args.dtype)
        keras_layer.build((None, width))
        keras_layer.set_weights(layer.get_weights())
        ours.append(layer)
        theirs.append(keras_layer)
    head = TiedEmbedding(VOCABULARY, WIDTH, embeddings_initializer=kernel_init, dtype=args.dtype)
    head.build()
    keras_head = keras.layers.ReversibleEmbedding(VOCABULARY, WIDTH, tie_weights=True, dtype=args.dtype)
    keras_head.build()
    keras_head.set_weights(head.get_weights())

    def feed_forward(layers, rows_context):
        variables = [v for layer in layers for v in layer.variables]

        def step(x):
            for i in range(0, len(layers), 2):
                x = x + 0.01 * layers[i + 1](keras.ops.relu(layers[i](x)))
            return x

        def run(x):
            if not rows_context:
                return keras.ops.fori_loop(0, args.steps, lambda i, x: step(x), x)
            with XLA_CPU.decoding(variables, static_dim(x.shape[0])), XLA_CPU.loop():
                return keras.ops.fori_loop(0, args.steps, lambda i, x: step(x), x)

        return run

    def logits(layer):
        def run(x):
            with XLA_CPU.decoding():
                return loop(x)

        def loop(x):
            def body(i, carry):
                h, total = carry
                out = layer(h, reverse=True)
                out = keras.ops.cast(out, "float32")
                return h + keras.ops.cast(1e-3 * out[..., :WIDTH], h.dtype), total + keras.ops.max(out, axis=-1)

            return keras.ops.fori_loop(0, args.steps, body, (x, keras.ops.zeros(x.shape[:-1])))[1]

        return run

    variables = [v for layer in ours + theirs + [head, keras_head] for v in layer.variables]
    forms = {
        "feed-forward, keras.layers.Dense": feed_forward(theirs, False),
        "feed-forward, keras_tfam Dense (rows copied before the loop)": feed_forward(ours, True),
        "head, keras.layers.ReversibleEmbedding": logits(keras_head),
        "head, keras_tfam TiedEmbedding": logits(head),
    }
    weight_bytes = {
        name: 4 * (sum(np.prod(layer.kernel.shape) for layer in theirs) if "feed" in name else VOCABULARY * WIDTH)
        for name in forms
    }
    print(f"machine: {cpu()}, keras {keras.__version__}, backend {keras.config.backend()}, dtype {args.dtype}")
    print(f"{args.steps} loop steps per call, best of {args.repeats} interleaved series")
    print("| rows | products | ms per step | weight GB/s | Keras' / ours |")
    print("|---:|---|---:|---:|---:|")
    for count in args.rows:
        x = keras.ops.cast(np.random.default_rng(count).normal(size=(count, 1, WIDTH)).astype("float32"), args.dtype)
        compiled = {name: _compile(fn, variables) for name, fn in forms.items()}
        outputs = {name: keras.ops.convert_to_numpy(keras.ops.cast(fn(x), "float32")) for name, fn in compiled.items()}
        names = list(forms)
        for keras_name, our_name in (names[:2], names[2:]):
            ours_out, keras_out = outputs[our_name], outputs[keras_name]
            if args.dtype == "float32":
                np.testing.assert_allclose(ours_out, keras_out, rtol=1e-3, atol=1e-3)
            else:  # 384 16-bit roundings in another order drift apart element by element, not as a whole
                drift = np.linalg.norm(ours_out - keras_out) / np.linalg.norm(keras_out)
                assert drift < 2e-2, f"{our_name}: {drift:.3f} of {keras_name}'s norm apart"
        calls = {name: lambda fn=fn: keras.ops.convert_to_numpy(fn(x)) for name, fn in compiled.items()}
        best = best_interleaved(calls, args.repeats, per_call=args.steps)
        for keras_name, our_name in (names[:2], names[2:]):
            for name in (keras_name, our_name):
                ratio = f"{best[keras_name] / best[name]:.2f}x" if name == our_name else ""
                rate = weight_bytes[name] / best[name] / 1e9
                print(f"| {count} | {name} | {best[name] * 1e3:.2f} | {rate:.1f} | {ratio} |")


def _compile(fn, variables):
    """`fn` compiled as the generator compiles its loop (`keras_tfam.generation.compile_function`: XLA on
    TensorFlow, `jax.jit` with the weights passed in on JAX)."""
    from keras_tfam.generation.generator import compile_function

    return compile_function(fn, types.SimpleNamespace(variables=variables))


if __name__ == "__main__":
    main()
