"""Narrow weights inside a decoding loop on XLA's CPU backend: which forms read fewer bytes than float32.

    python benchmarks/experiments/weight_rows.py [--repeats 5] [--steps 32]

Decoding one sequence multiplies a single row by every weight, once per step, inside a compiled loop.
XLA's CPU backend has no bfloat16, float16 or int8 matrix-vector kernel: it converts the weights to
float32 for its dot. A loop-invariant conversion is hoisted out of the loop (the loop then reads a
float32 copy), so each narrow form below takes the cast inside the loop the way
`keras_tfam.engine.xla_cpu.rows_product` does: the weights stored as rows `(N, K)`, a zero computed from
the input added to them, and the product `x @ rows^T`, into which XLA fuses the cast.

The products are GPT-2 small's feed-forward matrices (12 layers of 768 x 3072 and 3072 x 768, each
feeding the next), one row, 32 steps of a `tf.while_loop` per call, interleaved so the machine's drift
hits every form alike:

- `float32`: the float32 product of `(K, N)` weights (what float32 decoding runs);
- `float32 rows` / `float32 rows, XLA's dot`: the same weights stored as rows `(N, K)`, through the row form
  below (a zero added) and through XLA's plain product `x @ rows^T`;
- `bfloat16, Keras' layout`: bfloat16 weights `(K, N)` and bfloat16 compute (what `with_dtype` runs);
- `bfloat16 rows` / `float16 rows` / `int8 rows`: the narrow weights as rows, cast inside the loop;
- `bfloat16 bits as rows`: bfloat16 rows kept as `uint16` and widened by a 16-bit shift, bitcast to
  float32 (bfloat16 is float32's upper half), inside the loop (what `keras_tfam.engine.xla_cpu.rows_product` does
  with bfloat16 rows, where `keras_tfam.cpu.bfloat16_rows_pay`).

It prints milliseconds per step and the weight bytes read per second at each form's own width (the
row forms are what a narrow path could read; `bfloat16, Keras' layout` is counted at two bytes though
its loop reads float32 copies), best of `--repeats` series, the machine first.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/timing.py

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main():
    from timing import loop_arguments

    args = loop_arguments(__doc__.splitlines()[0])
    import numpy as np
    import tensorflow as tf
    from timing import FEED_FORWARD_LAYERS, FEED_FORWARD_SHAPES, cpu, feed_forward_kernels, time_feed_forward_forms

    rng = np.random.default_rng(0)
    kernels = feed_forward_kernels(rng)

    def rows_of(kernel, dtype):
        if dtype == "int8":
            scale = np.abs(kernel).max(axis=0) / 127
            return tf.Variable(np.round(kernel / scale).T.astype("int8")), tf.Variable(scale.astype("float32"))
        return tf.Variable(tf.cast(np.ascontiguousarray(kernel.T), dtype)), None

    def rows_product(x, rows, scale):
        vector = x / (1 + x * 0)  # element by element: keeps the producers of `x` out of the fused product
        zero = tf.cast(vector[0, 0] * 0, rows.dtype)  # makes the cast loop-variant
        product = tf.matmul(vector, tf.cast(rows + zero, "float32"), transpose_b=True)
        return product if scale is None else product * scale

    def bits_product(x, bits):
        vector = x / (1 + x * 0)
        zero = tf.cast(vector[0, 0] * 0, tf.uint16)
        wide = tf.bitwise.left_shift(tf.cast(bits + zero, tf.uint32), 16)  # exact: bfloat16's 16 bits, then zeros
        return tf.matmul(vector, tf.bitcast(wide, tf.float32), transpose_b=True)

    def as_bits():
        weights = [tf.Variable(tf.bitcast(tf.cast(np.ascontiguousarray(k.T), "bfloat16"), tf.uint16)) for k in kernels]
        return lambda x, i: bits_product(x, weights[i])

    def plain(dtype):
        weights = [tf.Variable(tf.cast(k, dtype)) for k in kernels]  # variables: XLA folds no cast of them
        return lambda x, i: tf.cast(tf.matmul(tf.cast(x, dtype), weights[i]), "float32")

    def as_rows(dtype):
        weights = [rows_of(k, dtype) for k in kernels]
        return lambda x, i: rows_product(x, *weights[i])

    def as_rows_dot():
        weights = [tf.Variable(np.ascontiguousarray(k.T)) for k in kernels]
        return lambda x, i: tf.matmul(x, weights[i], transpose_b=True)

    forms = {
        "float32": (plain("float32"), 4),
        "float32 rows": (as_rows("float32"), 4),
        "float32 rows, XLA's dot": (as_rows_dot(), 4),
        "bfloat16, Keras' layout": (plain("bfloat16"), 2),
        "bfloat16 rows": (as_rows("bfloat16"), 2),
        "bfloat16 bits as rows": (as_bits(), 2),
        "float16 rows": (as_rows("float16"), 2),
        "int8 rows": (as_rows("int8"), 1),
    }

    _, best = time_feed_forward_forms(
        {name: product for name, (product, _) in forms.items()}, rng, args.repeats, args.steps
    )
    elements = sum(k * n for k, n in FEED_FORWARD_SHAPES)
    print(f"machine: {cpu()}")
    print(
        f"{FEED_FORWARD_LAYERS} x (768 x 3072, 3072 x 768), one row, {args.steps} loop steps per call, "
        f"best of {args.repeats}"
    )
    print("| weights | ms per step | GB/s at its width | float32 / it |")
    print("|---|---:|---:|---:|")
    for name, (_, width) in forms.items():
        print(
            f"| {name} | {best[name] * 1e3:.2f} | {elements * width / best[name] / 1e9:.1f} | "
            f"{best['float32'] / best[name]:.2f}x |"
        )


if __name__ == "__main__":
    main()
