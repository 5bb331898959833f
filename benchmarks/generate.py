"""Greedy generation tokens/s: keras_tfam GPT2LM.generate vs keras_hub GPT2CausalLM.generate.

    python benchmarks/generate.py [--batch 4 --prompt 32 --new 256]

Config of the issue: 4 layers, width 256, 4 heads, vocabulary 8192, 512 positions.
Both models hold the same weights (copied from the keras-hub backbone); the
outputs must be identical. Each generate call is warmed up once (compilation),
then timed as the median of a few calls. Prints tokens/s (new tokens only) and
the ratio ours / keras-hub, and a floor: the decoding loop with only the
model's matmuls (no attention over the cache, norms, activations or
embeddings), which bounds what any implementation of this model can reach
here in float32.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from timing import add_smoke, machine, median_seconds, smoke_settings  # noqa: E402

from keras_tfam.models import GPT2LM  # noqa: E402

CONFIG = dict(vocabulary_size=8192, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024)
SMOKE_CONFIG = dict(vocabulary_size=128, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=64)


def matmul_floor_seconds(batch, new, width=256, layers=4, vocab=8192):
    """Seconds for `new` greedy steps of the model's matmuls alone, in one XLA loop.

    Per step and layer: the fused query/key/value projection, the output
    projection and the two feed-forward products on one position per row; then
    the tied head and an argmax. Every weight matrix is read once per step, as
    in the real model.
    """
    shapes = [(width, 3 * width), (width, width), (width, 4 * width), (4 * width, width)]
    weights = [[tf.random.normal(shape, stddev=0.05) for shape in shapes] for _ in range(layers)]
    head = tf.random.normal((width, vocab), stddev=0.05)

    @tf.function(jit_compile=True)
    def loop(hidden):
        def body(i, hidden, tokens):
            x = hidden
            for qkv, out, up, down in weights:
                x = x + (x @ qkv)[:, :width] @ out
                x = x + tf.nn.relu(x @ up) @ down
            token = tf.argmax(x @ head, axis=-1, output_type=tf.int32)
            return i + 1, hidden + tf.cast(token[:, None], tf.float32) * 1e-9, tokens + token

        return tf.while_loop(lambda i, *_: i < new, body, (0, hidden, tf.zeros((batch,), tf.int32)))[2]

    hidden = tf.random.normal((batch, width))
    return median_seconds(lambda: loop(hidden).numpy(), warmup=1, repeats=3)


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[4, 1])
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), batch=[1], prompt=4, new=4, repeats=1)
    config = SMOKE_CONFIG if args.smoke else CONFIG
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(**config, max_sequence_length=512, dropout=0.0)
    theirs = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    theirs.compile(sampler="greedy")
    ours = GPT2LM.from_keras_hub(backbone)
    print(f"machine: {machine()}")
    print(
        f"config: {config['num_layers']} layers, width {config['hidden_dim']}, {config['num_heads']} heads, "
        f"vocab {config['vocabulary_size']}; prompt {args.prompt}, {args.new} new tokens, greedy"
    )
    for batch in args.batch:
        vocabulary = config["vocabulary_size"]
        prompts = np.random.default_rng(batch).integers(0, vocabulary, size=(batch, args.prompt)).astype("int32")
        length = args.prompt + args.new
        padded = np.zeros((batch, length), "int32")
        padded[:, : args.prompt] = prompts
        mask = np.zeros((batch, length), bool)
        mask[:, : args.prompt] = True
        inputs = {"token_ids": padded, "padding_mask": mask}

        def run_theirs():
            return np.asarray(theirs.generate(inputs, stop_token_ids=None)["token_ids"])

        def run_ours():
            return ours.generate(prompts, max_new_tokens=args.new)

        same = np.array_equal(run_ours(), run_theirs())
        t_floor = matmul_floor_seconds(batch, args.new, config["hidden_dim"], config["num_layers"], vocabulary)
        t_theirs = median_seconds(run_theirs, warmup=0, repeats=args.repeats)
        t_ours = median_seconds(run_ours, warmup=0, repeats=args.repeats)
        tokens = batch * args.new
        print(
            f"batch {batch}: keras_tfam {tokens / t_ours:9.1f} tokens/s  keras-hub {tokens / t_theirs:8.1f} tokens/s  "
            f"speed-up {t_theirs / t_ours:6.1f}x  identical outputs: {same}"
        )
        print(
            f"batch {batch}: matmuls only (floor) {tokens / t_floor:9.1f} tokens/s = "
            f"{t_theirs / t_floor:.1f}x keras-hub; keras_tfam at {100 * t_floor / t_ours:.0f}% of the floor"
        )
        if not same:
            raise SystemExit("outputs differ")


if __name__ == "__main__":
    main()
