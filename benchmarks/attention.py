"""Forward+backward time of keras_tfam MultiHeadAttention vs keras.layers.MultiHeadAttention.

    python benchmarks/attention.py [--batch 8 --length 512 --width 512 --heads 8] [--jit]

Same shapes, same float32 inputs, both wrapped in one tf.function (XLA on with
--jit); prints the median step time of each and the ratio ours / Keras
(below 1.0 means keras_tfam is faster).
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from timing import add_smoke, machine, median_seconds, smoke_settings  # noqa: E402

import keras_tfam  # noqa: E402


def step_fn(layer, x, causal, jit):
    @tf.function(jit_compile=jit)
    def step():
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, x, use_causal_mask=causal)
            loss = tf.reduce_sum(tf.square(y))
        grads = tape.gradient(loss, [x] + layer.trainable_variables)
        return loss, grads

    return lambda: [g.numpy() for g in step()[1][:1]]


def main():

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--jit", action="store_true", help="compile both with XLA")
    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), batch=1, length=8, width=16, heads=2, repeats=1)
    keras.utils.set_random_seed(0)
    x = tf.random.normal((args.batch, args.length, args.width))
    head = args.width // args.heads
    print(f"machine: {machine()}")
    print(f"shapes: B={args.batch} T={args.length} d={args.width} heads={args.heads} jit={args.jit}")
    for causal in (False, True):
        ours = keras_tfam.layers.MultiHeadAttention(args.heads, head)
        theirs = keras.layers.MultiHeadAttention(args.heads, head)
        ours(x, x)
        theirs(x, x)
        t_ours = median_seconds(step_fn(ours, x, causal, args.jit), repeats=args.repeats)
        t_theirs = median_seconds(step_fn(theirs, x, causal, args.jit), repeats=args.repeats)
        print(
            f"causal={causal!s:5}  keras_tfam {t_ours * 1e3:8.2f} ms  keras {t_theirs * 1e3:8.2f} ms  "
            f"ratio ours/keras {t_ours / t_theirs:.3f}"
        )


if __name__ == "__main__":
    main()
