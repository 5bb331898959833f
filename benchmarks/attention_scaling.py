"""Forward+backward time and peak memory vs sequence length: softmax vs linear attention.

    python benchmarks/attention_scaling.py [--lengths 512 1024 2048 4096 8192 16384] [--causal]

One attention layer (batch 1, width 256, 4 heads), the loss summed over the
outputs, gradients for the input and all weights, in one XLA-compiled
`tf.function`. keras_tfam's `MultiHeadAttention` (softmax, O(T^2)) against
`LinearAttention` (elu feature map, O(T); causal: chunked prefix sums).
Peak memory is TensorFlow's allocator peak on the device (CPU here) during
the step. Prints time(T) / time(1024) for each, and where linear overtakes
softmax.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from timing import add_smoke, machine, median_seconds, smoke_settings  # noqa: E402

from keras_tfam.layers import LinearAttention, MultiHeadAttention  # noqa: E402


def measure(layer, length, causal, width, repeats):
    x = tf.random.normal((1, length, width))
    layer(x[:, :8], use_causal_mask=causal)

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x, use_causal_mask=causal))
        return tape.gradient(loss, [x] + layer.trainable_variables)

    device = "CPU:0" if not tf.config.list_logical_devices("GPU") else "GPU:0"
    step(x)
    tf.config.experimental.reset_memory_stats(device)
    seconds = median_seconds(lambda: step(x)[0].numpy(), warmup=1, repeats=repeats)
    peak = tf.config.experimental.get_memory_info(device)["peak"]
    return seconds, peak


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), lengths=[16], width=16, heads=2, repeats=1)
    head = args.width // args.heads
    layers = {
        "softmax": MultiHeadAttention(args.heads, head),
        "linear": LinearAttention(args.heads, head, chunk_size=64),
    }
    print(f"machine: {machine()}")
    print(f"batch 1, width {args.width}, {args.heads} heads, causal={args.causal}, fwd+bwd, XLA")
    results = {name: {} for name in layers}
    for length in args.lengths:
        row = [f"T={length:6}"]
        for name, layer in layers.items():
            try:
                seconds, peak = measure(layer, length, args.causal, args.width, args.repeats)
                results[name][length] = seconds
                row.append(f"{name} {seconds * 1e3:9.1f} ms {peak / 2**20:8.1f} MiB")
            except (tf.errors.ResourceExhaustedError, MemoryError):
                row.append(f"{name}   out of memory")
        print("  ".join(row), flush=True)
    for name, times in results.items():
        if 1024 in times:
            ratios = "  ".join(f"{t}: {times[t] / times[1024]:.1f}" for t in sorted(times))
            print(f"{name} time(T)/time(1024): {ratios}")
    faster = [
        t for t in sorted(results["linear"]) if t in results["softmax"] and results["linear"][t] < results["softmax"][t]
    ]
    print(f"linear faster than softmax from T={faster[0]}" if faster else "linear never faster in this range")


if __name__ == "__main__":
    main()
