"""Training tokens/s of `fit`: keras_tfam GPT2LM vs keras_hub GPT2Backbone + tied head.

    python benchmarks/train_step.py [--batch 16 --length 256 --steps 20]

Config: 4 layers, width 256, 4 heads, vocabulary 8192, 512 positions, dropout 0,
AdamW, sparse categorical cross-entropy from logits, `jit_compile=True` for both;
the same weights (copied from keras-hub) and the same batches. Also prints the
achieved GFLOP/s (6 x matmul parameters per token + 12 x layers x length x width
for attention, forward and backward) as a share of the float32 matmul peak
measured in the same run.
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
from timing import machine, median_seconds  # noqa: E402

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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    vocab, layers, width = 8192, 4, 256
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab, num_layers=layers, num_heads=4, hidden_dim=width, intermediate_dim=4 * width,
        max_sequence_length=512, dropout=0.0,
    )
    token_ids = keras.Input((None,), dtype="int32")
    hidden = backbone({"token_ids": token_ids, "padding_mask": keras.ops.ones_like(token_ids)})
    theirs = keras.Model(token_ids, backbone.token_embedding(hidden, reverse=True))
    ours = GPT2LM.from_keras_hub(backbone)
    stream = np.random.default_rng(0).integers(0, vocab, size=(args.batch * args.steps, args.length + 1))
    x, y = stream[:, :-1].astype("int32"), stream[:, 1:].astype("int32")

    peak = matmul_peak()
    matmul_params = ours.count_params() - 512 * width  # the position table is a lookup
    flops_per_token = 6 * matmul_params + 12 * layers * args.length * width
    print(f"machine: {machine()}")
    print(f"config: {layers} layers, width {width}, vocab {vocab}; batch {args.batch} x {args.length}, AdamW, jit")
    print(f"float32 matmul peak (2048^3, same run): {peak:.1f} GFLOP/s")
    results = {}
    for name, model in (("keras-hub", theirs), ("keras_tfam", ours)):
        results[name] = tokens_per_second(model, x, y, args.batch)
        gflops = results[name] * flops_per_token / 1e9
        print(f"{name:10}  {results[name]:9.0f} tokens/s  {gflops:6.1f} GFLOP/s  {100 * gflops / peak:5.1f}% of peak")
    print(f"ratio keras_tfam / keras-hub: {results['keras_tfam'] / results['keras-hub']:.2f}x")


if __name__ == "__main__":
    main()
