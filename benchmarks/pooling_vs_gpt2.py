"""Mini protocol: the attention-pooling LM vs the GPT-2 decoder, same budget.

    python benchmarks/pooling_vs_gpt2.py [--minutes 3 --eval-tokens 20000]

"Mini" protocol (not WikiText-2 test perplexity): word-level vocabulary and
training on the validation split, evaluation on the first `--eval-tokens`
tokens of the test split. Both models: 4 layers, width 256, 4 heads, float32,
AdamW, XLA, the same wall-clock budget of training. GPT-2 learns from every
position of 128-token blocks; the pooling LM predicts one token per 128-token
window. Reports word-level perplexity (= token perplexity here) on the same
test tokens, every one of them predicted with (up to) 128 tokens of context.
"""

import argparse
import math
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from timing import SMOKE_SIZES, add_smoke, machine, small_wikitext, smoke_folder, smoke_settings  # noqa: E402

from keras_tfam.models import GPT2LM, AttentionPoolingLM  # noqa: E402
from pipelines.data.lm_stream import context_windows, lm_dataset, tokenize_lines  # noqa: E402
from pipelines.data.tokenizers import WordTokenizer  # noqa: E402
from pipelines.data.wikitext import find_split, read_lines  # noqa: E402

CONTEXT = 128
SIZES = {"num_layers": 4, "num_heads": 4, "hidden_dim": 256}


class Budget(keras.callbacks.Callback):
    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def on_train_begin(self, logs=None):
        self.start, self.steps = time.perf_counter(), 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if time.perf_counter() - self.start > self.seconds:
            self.model.stop_training = True


def compile_model(model, steps):
    schedule = keras.optimizers.schedules.CosineDecay(0.0, steps, warmup_target=1e-3, warmup_steps=100, alpha=0.1)
    optimizer = keras.optimizers.AdamW(schedule, weight_decay=0.1, global_clipnorm=1.0)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)


def nll_of_windows(model, windows, targets, gpt2):
    if gpt2:  # only the last position's logits: the hidden states, then the tied head
        hidden = keras.Model(model.input, model.final_norm.output)

        @tf.function
        def logits_of(x):
            return model.logits(hidden(x, training=False)[:, -1])
    else:
        logits_of = tf.function(lambda x: model(x, training=False))
    total = 0.0
    for start in range(0, len(targets), 256):
        logits = logits_of(windows[start : start + 256])
        nll = keras.losses.sparse_categorical_crossentropy(targets[start : start + 256], logits, from_logits=True)
        total += float(tf.reduce_sum(nll))
    return total


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.path.join("..", "shared", "data", "wikitext-2"))
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--eval-tokens", type=int, default=20000)
    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), minutes=0.001, eval_tokens=64)
    sizes = SMOKE_SIZES if args.smoke else SIZES
    if args.smoke:
        args.data_dir = small_wikitext(smoke_folder("pooling_vs_gpt2"))
    train_lines = read_lines(find_split(args.data_dir, "valid"))
    test_lines = read_lines(find_split(args.data_dir, "test"))
    tokenizer = WordTokenizer.train(train_lines)
    train_tokens = tokenize_lines(tokenizer, train_lines)
    test_tokens = tokenize_lines(tokenizer, test_lines)[: args.eval_tokens]
    windows, targets = context_windows(test_tokens, CONTEXT, tokenizer.eos_id)
    vocabulary = tokenizer.vocabulary_size
    budget = args.minutes * 60
    print(f"machine: {machine()}")
    print(
        f"mini protocol: train on valid ({train_tokens.size} tokens), evaluate on the first {targets.size} test tokens"
    )
    results = {}

    keras.utils.set_random_seed(0)
    gpt2 = GPT2LM(vocabulary, **sizes, max_sequence_length=CONTEXT)
    compile_model(gpt2, 2000)
    data = lm_dataset(
        train_tokens, CONTEXT, 16, tokenizer.eos_id, shuffle=True, seed=0, drop_remainder=True, repeat=True
    )
    timer = Budget(budget)
    gpt2.fit(
        data.map(lambda x, y, w: (x, y, w)),
        steps_per_epoch=100000,
        epochs=1,
        shuffle=False,
        callbacks=[timer],
        verbose=0,
    )
    results["GPT-2 decoder"] = (timer.steps, timer.steps * 16 * CONTEXT, nll_of_windows(gpt2, windows, targets, True))

    keras.utils.set_random_seed(0)
    pooling = AttentionPoolingLM(vocabulary, context_length=CONTEXT, **sizes)
    compile_model(pooling, 2000)
    train_windows, train_targets = context_windows(train_tokens, CONTEXT, tokenizer.eos_id)
    stream = (
        tf.data.Dataset.from_tensor_slices((train_windows, train_targets))
        .shuffle(len(train_targets), seed=0)
        .repeat()
        .batch(16)
    )
    timer = Budget(budget)
    pooling.fit(stream, steps_per_epoch=100000, epochs=1, shuffle=False, callbacks=[timer], verbose=0)
    results["attention pooling"] = (timer.steps, timer.steps * 16, nll_of_windows(pooling, windows, targets, False))

    for name, (steps, predicted, nll) in results.items():
        print(
            f"{name:18} {steps:6} steps  {predicted:9} training targets  "
            f"test word perplexity {math.exp(nll / targets.size):9.1f}"
        )


if __name__ == "__main__":
    main()
