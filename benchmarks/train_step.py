"""Training tokens/s of `fit`: keras_tfam GPT2LM vs keras_hub GPT2Backbone + tied head.

    python benchmarks/train_step.py [--batch 16 --length 256 --steps 20]

Config: 4 layers, width 256, 4 heads, vocabulary 8192, 512 positions, dropout 0,
AdamW, sparse categorical cross-entropy from logits, `jit_compile=True` for both;
the same weights (copied from keras-hub) and the same batches. Also prints the
achieved GFLOP/s (6 x matmul parameters per token + 12 x layers x length x width
for attention, forward and backward) as a share of the float32 matmul peak
measured in the same run, and the same for a floor: the step's matmuls alone
(forward and both backward products of every weight matrix, attention's batched
products), without anything else a training step does.
"""

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from timing import add_smoke, machine, median_seconds, smoke_settings  # noqa: E402

from keras_tfam.models import GPT2LM  # noqa: E402


class StepTimer(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self.start)

    def on_train_begin(self, logs=None):
        self.times = []


def matmul_peak(n=2048):
    a = tf.random.normal((n, n))
    b = tf.random.normal((n, n))
    f = tf.function(lambda: tf.matmul(a, b))
    seconds = median_seconds(lambda: f().numpy(), warmup=2, repeats=10)
    return 2 * n**3 / seconds / 1e9


def matmul_floor_seconds(batch, length, width, layers, heads, vocab):
    """Seconds for the training step's matmuls alone, in one XLA function.

    For every weight `W (din, dout)` applied to `batch * length` rows: `X W`,
    `dY W^T` and `X^T dY`; per layer the six batched attention products
    (scores, weighted values and their four gradients). Each product is
    summed so that XLA cannot drop it.
    """
    rows = batch * length
    shapes = [(width, 3 * width), (width, width), (width, 4 * width), (4 * width, width)] * layers
    shapes.append((width, vocab))  # the tied head
    weights = [tf.random.normal(shape) for shape in shapes]
    activations = {d: tf.random.normal((rows, d)) for shape in shapes for d in shape}
    heads_shape = (batch, heads, length, width // heads)
    q, k, v = (tf.random.normal(heads_shape) for _ in range(3))

    @tf.function(jit_compile=True)
    def step():
        total = 0.0
        for w in weights:
            x, dy = activations[w.shape[0]], activations[w.shape[1]]
            for product in (x @ w, dy @ tf.transpose(w), tf.transpose(x) @ dy):
                total += tf.reduce_sum(product)
        for _ in range(layers):
            scores = tf.matmul(q, k, transpose_b=True)  # also stands for the score gradient
            products = (
                scores,
                scores @ v,
                tf.matmul(q, v, transpose_b=True),  # d(weights) = d(out) v^T
                tf.matmul(scores, q, transpose_a=True),  # d(values) = weights^T d(out)
                scores @ k,  # d(queries)
                tf.matmul(scores, q, transpose_a=True),  # d(keys)
            )
            total += sum(tf.reduce_sum(product) for product in products)
        return total

    return median_seconds(lambda: step().numpy(), warmup=2, repeats=5)


def tokens_per_second(model, x, y, batch):
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    timer = StepTimer()
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[timer], shuffle=False)
    step = float(np.median(timer.times[3:]))  # skip compilation and warm-up steps
    return x.shape[1] * batch / step


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), batch=2, length=8, steps=5)
    keras.utils.set_random_seed(0)
    vocab, layers, heads, width = (128, 1, 2, 16) if args.smoke else (8192, 4, 4, 256)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab,
        num_layers=layers,
        num_heads=heads,
        hidden_dim=width,
        intermediate_dim=4 * width,
        max_sequence_length=512,
        dropout=0.0,
    )
    token_ids = keras.Input((None,), dtype="int32")
    hidden = backbone({"token_ids": token_ids, "padding_mask": keras.ops.ones_like(token_ids)})
    theirs = keras.Model(token_ids, backbone.token_embedding(hidden, reverse=True))
    ours = GPT2LM.from_keras_hub(backbone)
    stream = np.random.default_rng(0).integers(0, vocab, size=(args.batch * args.steps, args.length + 1))
    x, y = stream[:, :-1].astype("int32"), stream[:, 1:].astype("int32")

    size = 64 if args.smoke else 2048
    peak = matmul_peak(size)
    matmul_params = ours.count_params() - 512 * width  # the position table is a lookup
    flops_per_token = 6 * matmul_params + 12 * layers * args.length * width
    print(f"machine: {machine()}")
    print(f"config: {layers} layers, width {width}, vocab {vocab}; batch {args.batch} x {args.length}, AdamW, jit")
    print(f"float32 matmul peak ({size}^3, same run): {peak:.1f} GFLOP/s")
    floor = args.batch * args.length / matmul_floor_seconds(args.batch, args.length, width, layers, heads, vocab)
    gflops = floor * flops_per_token / 1e9
    print(
        f"{'matmuls only':10}  {floor:9.0f} tokens/s  {gflops:6.1f} GFLOP/s  "
        f"{100 * gflops / peak:5.1f}% of peak  (floor)"
    )
    results = {}
    for name, model in (("keras-hub", theirs), ("keras_tfam", ours)):
        results[name] = tokens_per_second(model, x, y, args.batch)
        gflops = results[name] * flops_per_token / 1e9
        print(f"{name:10}  {results[name]:9.0f} tokens/s  {gflops:6.1f} GFLOP/s  {100 * gflops / peak:5.1f}% of peak")
    print(f"ratio keras_tfam / keras-hub: {results['keras_tfam'] / results['keras-hub']:.2f}x")


if __name__ == "__main__":
    main()
