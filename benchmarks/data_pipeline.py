"""Tokens/s delivered by the WikiText training stream vs tokens/s that training consumes.

    python benchmarks/data_pipeline.py [--data-dir ../shared/data/wikitext-2 --split valid]

For the word and BPE tokenizers: the one-time tokenization speed of the split, and the
tokens/s the cached, shuffled, batched, prefetched training stream delivers after warm-up
(batch 16 x 128, as gpt2_tiny trains). Next to them, the training tokens/s of gpt2_tiny
(`fit`, XLA) measured in the same run on the same batches; the ratio is stream / training
(the issue's target: at least 50x, so training is never input-bound).
"""

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from timing import SMOKE_SIZES, add_smoke, machine, small_wikitext, smoke_folder  # noqa: E402

from pipelines.config import TrainConfig  # noqa: E402
from pipelines.data.lm_stream import lm_dataset, tokenize_lines  # noqa: E402
from pipelines.data.tokenizers import train_tokenizer  # noqa: E402
from pipelines.data.wikitext import find_split, read_lines  # noqa: E402
from pipelines.training import build_model, build_optimizer  # noqa: E402


def stream_rate(dataset, batches=2000):
    iterator = iter(dataset)
    for _ in range(50):  # warm-up: fills the cache and the prefetch buffer
        next(iterator)
    start = time.perf_counter()
    tokens = 0
    for _ in range(batches):
        inputs, _, _ = next(iterator)
        tokens += int(np.prod(inputs.shape))
    return tokens / (time.perf_counter() - start)


def training_rate(tokens, vocabulary_size, start_id, steps=12, sizes=None):
    config = TrainConfig(max_steps=steps, model_options={"dropout": 0.0, **(sizes or {})}).validate()
    model = build_model(config, vocabulary_size)
    model.compile(
        build_optimizer(config), keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True
    )
    data = lm_dataset(tokens, 128, 16, start_id, shuffle=True, seed=0, drop_remainder=True, repeat=True)
    times = []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter())

    model.fit(data, steps_per_epoch=steps, epochs=1, shuffle=False, verbose=0, callbacks=[Timer()])
    return 16 * 128 * (len(times) - 3) / (times[-1] - times[2])


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.path.join("..", "shared", "data", "wikitext-2"))
    parser.add_argument("--split", default="valid")
    add_smoke(parser)
    args = parser.parse_args()
    if args.smoke:
        args.data_dir = small_wikitext(os.path.join(smoke_folder("data_pipeline"), "wikitext-2"))
    batches, steps, sizes = (10, 5, SMOKE_SIZES) if args.smoke else (2000, 12, None)
    lines = read_lines(find_split(args.data_dir, args.split))
    print(f"machine: {machine()}")
    print(f"split: {args.split} ({len(lines)} lines); stream: batch 16 x 128, shuffled, cached, prefetched")
    for kind, size in (("word", None), ("bpe", 8192)):
        tokenizer = train_tokenizer(kind, lines, size)
        start = time.perf_counter()
        tokens = tokenize_lines(tokenizer, lines)
        tokenize_rate = tokens.size / (time.perf_counter() - start)
        dataset = lm_dataset(tokens, 128, 16, tokenizer.eos_id, shuffle=True, seed=0, drop_remainder=True, repeat=True)
        delivered = stream_rate(dataset, batches)
        trained = training_rate(tokens, tokenizer.vocabulary_size, tokenizer.eos_id, steps, sizes)
        print(
            f"{kind:5} vocab {tokenizer.vocabulary_size:6}: tokenize {tokenize_rate:12,.0f} tok/s (once)  "
            f"stream {delivered:14,.0f} tok/s  gpt2_tiny training {trained:8,.0f} tok/s  "
            f"stream/training {delivered / trained:8,.0f}x"
        )


if __name__ == "__main__":
    main()
