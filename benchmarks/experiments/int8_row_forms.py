"""Forms of the one-row int8 product inside a decoding loop, on XLA's CPU backend: which reads weights fastest.

    python benchmarks/experiments/int8_row_forms.py [--repeats 5] [--steps 32]

Decoding one sequence multiplies one row by every int8 weight matrix at each step
(`keras_tfam.engine.xla_cpu.rows_product`, what `quantize("int8")` layers run for one row in the XLA-CPU
engine). The forms below compute
the same integer sums for GPT-2 small's 24 feed-forward matrices (int8 rows `(N, K)` with per-row scales,
the row quantized per row as Keras' int8 `Dense` does), one row, in one `tf.while_loop`:

- `float sums` (the library's): the rows widened to float32 inside the fused product, a zero computed
  from the input added to them so that XLA keeps the widening in the loop;
- `integer matrix-vector product`: XLA's `int32` product of the rows and the quantized row;
- `int16 products, int32 sums` / `int32 products and sums`: the products and their sums element by
  element in integers (exact, and no float rounding at all);
- `zero as a slice offset`: the float form with the zero as the offset of a `dynamic-slice` of the rows
  instead of an add to each weight.

It prints each form's largest difference from the first (0 where the sums are exact) and milliseconds
per step, best of `--repeats` interleaved series.
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

    def quantized(kernel):
        scale = np.abs(kernel).max(axis=0) / 127
        return tf.Variable(np.round(kernel / scale).T.astype("int8")), tf.Variable(scale.astype("float32"))

    weights = [quantized(kernel) for kernel in feed_forward_kernels(rng)]

    def quantize_row(x):
        scale = tf.reduce_max(tf.abs(x), axis=-1, keepdims=True) / 127
        return tf.round(x / scale), scale

    def float_sums(x, i):
        rows, scale = weights[i]
        q, x_scale = quantize_row(x)
        vector = q / (1 + q * 0)  # element by element: keeps the quantizer out of the fused product
        zero = tf.cast(vector[0, 0] * 0, tf.int8)
        return tf.matmul(vector, tf.cast(rows + zero, "float32"), transpose_b=True) * scale * x_scale

    def slice_offset(x, i):
        rows, scale = weights[i]
        q, x_scale = quantize_row(x)
        vector = q / (1 + q * 0)
        zero = tf.cast(vector[0, 0] * 0, tf.int32)
        moved = tf.slice(rows, tf.stack([zero, zero]), rows.shape)
        return tf.matmul(vector, tf.cast(moved, "float32"), transpose_b=True) * scale * x_scale

    def integer_product(x, i):
        rows, scale = weights[i]
        q, x_scale = quantize_row(x)
        sums = tf.linalg.matvec(tf.cast(rows, tf.int32), tf.cast(q[0], tf.int32))[None, :]
        return tf.cast(sums, "float32") * scale * x_scale

    def element_sums(dtype):
        def product(x, i):
            rows, scale = weights[i]
            q, x_scale = quantize_row(x)
            vector = tf.cast(q, dtype)
            vector = vector // (1 + vector * 0)
            zero = tf.cast(vector[0, 0] * 0, tf.int8)
            sums = tf.reduce_sum(tf.cast(tf.cast(rows + zero, dtype) * vector, tf.int32), axis=-1)[None, :]
            return tf.cast(sums, "float32") * scale * x_scale

        return product

    forms = {
        "float sums (the library's)": float_sums,
        "integer matrix-vector product": integer_product,
        "int16 products, int32 sums": element_sums(tf.int16),
        "int32 products and sums": element_sums(tf.int32),
        "zero as a slice offset": slice_offset,
    }

    outputs, best = time_feed_forward_forms(forms, rng, args.repeats, args.steps)
    first = outputs[next(iter(forms))]
    elements = sum(k * n for k, n in FEED_FORWARD_SHAPES)
    print(f"machine: {cpu()}")
    print(
        f"{FEED_FORWARD_LAYERS} x (768 x 3072, 3072 x 768) int8, one row, {args.steps} loop steps per call, "
        f"best of {args.repeats}"
    )
    print("| form | largest difference from the first | ms per step | G weights/s |")
    print("|---|---:|---:|---:|")
    for name in forms:
        difference = float(np.abs(outputs[name] - first).max())
        print(f"| {name} | {difference:.3g} | {best[name] * 1e3:.2f} | {elements / best[name] / 1e9:.1f} |")


if __name__ == "__main__":
    main()
