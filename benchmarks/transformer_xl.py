"""Mini protocol: Transformer-XL with memory vs the same model without, and evaluation speed.

    python benchmarks/transformer_xl.py [--minutes 10 --segment 32 --memory 64 --window-tokens 1024]

"Mini" protocol (not WikiText-2 test perplexity): word-level vocabulary and
training on the WikiText-2 validation split, evaluation on the test split.
Both models are `transformer_xl_tiny` (4 layers, width 256, 4 heads, dropout
0.1) trained on the same stateful stream (16 rows, segments of `--segment`
tokens) for the same wall-clock budget, float32, AdamW, XLA; one keeps a
memory of `--memory` states per layer, the other none (faster per step, it
is also evaluated at the step count the first reached). Each is evaluated
on the whole test split read the way it was trained: segment by segment,
with its memory (none for the second).

Evaluation speed, same model, same attention length `A = memory + segment`:
with memory (segments of `--segment` after the memory, each token computed
once) against re-encoding a sliding window (for each token, one pass over
the `A` tokens ending there, the last position's logits; Al-Rfou et al.'s
evaluation, which Dai et al. compare with: up to 1,800x at paper scale).
Tokens/s over `--window-tokens` test tokens for the sliding window and the
whole test split with memory, both compiled with XLA, after a compiling call.
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

from keras_tfam.models import TransformerXLLM  # noqa: E402
from pipelines.data.lm_stream import context_windows, stateful_lm_dataset, tokenize_lines  # noqa: E402
from pipelines.data.tokenizers import WordTokenizer  # noqa: E402
from pipelines.data.wikitext import count_words, find_split, read_lines  # noqa: E402

BATCH = 16


class Budget(keras.callbacks.Callback):
    """Stops training after `seconds` of steps (the first, compiling step excluded); keeps the weights
    after step `snapshot_at`, if it comes."""

    def __init__(self, seconds, snapshot_at=None):
        super().__init__()
        self.seconds = seconds
        self.snapshot_at = snapshot_at
        self.snapshot = None

    def on_train_begin(self, logs=None):
        self.start, self.steps = None, 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps == self.snapshot_at:
            self.snapshot = self.model.get_weights()
        if self.start is None:
            self.start = time.perf_counter()
        elif time.perf_counter() - self.start > self.seconds:
            self.model.stop_training = True


def train(vocabulary, tokens, eos, memory, segment, seconds, snapshot_at=None, **sizes):
    keras.utils.set_random_seed(0)
    model = TransformerXLLM.from_preset(
        "transformer_xl_tiny", vocabulary_size=vocabulary, memory_length=memory, context_length=segment, **sizes
    )
    model.build((BATCH, segment))
    schedule = keras.optimizers.schedules.CosineDecay(0.0, 2000, warmup_target=1e-3, warmup_steps=100, alpha=0.1)
    optimizer = keras.optimizers.AdamW(schedule, weight_decay=0.1, global_clipnorm=1.0)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    budget = Budget(seconds, snapshot_at)
    data = stateful_lm_dataset(tokens, segment, BATCH, eos, repeat=True)
    model.fit(data, steps_per_epoch=1_000_000, epochs=1, shuffle=False, callbacks=[budget], verbose=0)
    return model, budget.steps, budget.snapshot


def evaluate_with_memory(model, tokens, eos, segment):
    """`(total NLL, tokens, seconds)` over the whole stream, the memory carried from batch to batch."""

    @tf.function(jit_compile=True)
    def step(inputs, targets, weights, memory):
        logits, memory, _ = model.call_with_cache(inputs, memory)
        nll = keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True)
        return tf.reduce_sum(nll * weights), tf.reduce_sum(weights), memory

    batches = list(stateful_lm_dataset(tokens, segment, BATCH, eos))
    step(*batches[0], model.init_cache(BATCH))  # compile
    memory, total, count = model.init_cache(BATCH), 0.0, 0.0
    start = time.perf_counter()
    for inputs, targets, weights in batches:
        nll, n, memory = step(inputs, targets, weights, memory)
        total, count = total + float(nll), count + float(n)
    return total, count, time.perf_counter() - start


def evaluate_sliding_window(model, tokens, eos, length, batch=64):
    """`(total NLL, tokens, seconds)`: each token predicted from the `length` tokens before it, re-encoded."""
    windows, targets = context_windows(tokens, length, eos)

    @tf.function(jit_compile=True)
    def step(windows, targets):
        hidden, _ = model.hidden_states(windows)  # no memory: the window alone
        logits = model.logits(hidden[:, -1])
        return tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True))

    usable = len(targets) // batch * batch
    step(windows[:batch], targets[:batch])  # compile
    total, start = 0.0, time.perf_counter()
    for i in range(0, usable, batch):
        total += float(step(windows[i : i + batch], targets[i : i + batch]))
    return total, usable, time.perf_counter() - start


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.path.join("..", "shared", "data", "wikitext-2"))
    parser.add_argument("--minutes", type=float, default=10.0, help="training budget of each model")
    parser.add_argument("--segment", type=int, default=32)
    parser.add_argument("--memory", type=int, default=64)
    parser.add_argument("--window-tokens", type=int, default=1024)
    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), minutes=0.001, segment=8, memory=8, window_tokens=128)
    sizes = SMOKE_SIZES if args.smoke else {}
    if args.smoke:
        args.data_dir = small_wikitext(smoke_folder("transformer_xl"))
    train_lines = read_lines(find_split(args.data_dir, "valid"))
    test_lines = read_lines(find_split(args.data_dir, "test"))
    tokenizer = WordTokenizer.train(train_lines)
    train_tokens = tokenize_lines(tokenizer, train_lines)
    test_tokens = tokenize_lines(tokenizer, test_lines)
    words = count_words(test_lines)
    vocabulary, eos = tokenizer.vocabulary_size, tokenizer.eos_id
    print(f"machine: {machine()}")
    print(
        f"mini protocol: train on valid ({train_tokens.size} tokens), evaluate on test ({test_tokens.size} tokens, "
        f"{words} words); transformer_xl_tiny, segments of {args.segment}, batch {BATCH}, "
        f"{args.minutes} min of training each"
    )

    def report(label, steps, result):
        nll, count, seconds = result
        print(
            f"{label}: {steps:5} steps ({steps * BATCH * args.segment} training tokens)  test loss "
            f"{nll / count:.4f} nats/token  word perplexity {math.exp(nll / words):8.2f}  "
            f"(evaluated with memory: {count / seconds:8.0f} tokens/s)"
        )

    # The same wall-clock budget for both; the model without memory (faster per
    # step) is also evaluated at the step count the model with memory reached.
    model, steps, _ = train(vocabulary, train_tokens, eos, args.memory, args.segment, args.minutes * 60, **sizes)
    nll_memory, count_memory, seconds_memory = evaluate_with_memory(model, test_tokens, eos, args.segment)
    report(f"memory {args.memory:4}, {args.minutes} min", steps, (nll_memory, count_memory, seconds_memory))
    reference, reference_steps, snapshot = train(
        vocabulary, train_tokens, eos, 0, args.segment, args.minutes * 60, snapshot_at=steps, **sizes
    )
    report(
        f"memory    0, {args.minutes} min",
        reference_steps,
        evaluate_with_memory(reference, test_tokens, eos, args.segment),
    )
    if snapshot is not None:
        reference.set_weights(snapshot)
        report("memory    0, equal steps", steps, evaluate_with_memory(reference, test_tokens, eos, args.segment))

    length = args.memory + args.segment
    subset = test_tokens[: args.window_tokens]
    nll_window, count_window, seconds_window = evaluate_sliding_window(model, subset, eos, length)
    rate_memory, rate_window = count_memory / seconds_memory, count_window / seconds_window
    print(
        f"evaluation, attention length {length}: with memory {rate_memory:9.0f} tokens/s (whole test split, "
        f"loss {nll_memory / count_memory:.4f}); re-encoding a sliding window {rate_window:7.1f} tokens/s "
        f"(first {count_window} test tokens, loss {nll_window / count_window:.4f}); speed-up "
        f"{rate_memory / rate_window:.1f}x"
    )


if __name__ == "__main__":
    main()
