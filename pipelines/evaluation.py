"""Perplexity: token-level loss, and word perplexity or bits per character, of a model on a stream.

Word-level perplexity is `exp(total NLL / number of words incl. <eos>)`, the
split's total negative log-likelihood (over whatever tokens the tokenizer
makes) divided by its standard word count, so results compare across
word-level and subword tokenizers and with published word-level numbers.
A character-level model is measured in bits per character instead,
`total NLL / characters (incl. one newline per line) / ln 2`, the unit of
the character-level literature.
"""

import math
import sys
import time

import keras
import tensorflow as tf

from pipelines.data.wikitext import count_characters, count_words

#: The quality measures a result may hold besides `loss`, in the order they are shown.
METRICS = ("token_perplexity", "word_perplexity", "bits_per_character")


def text_units(tokenizer_kind, lines):
    """The units a split is measured in: characters for a character-level tokenizer, else words.

    Returns:
        `{"num_characters": n}` or `{"num_words": n}`, keyword arguments of
        `evaluate_perplexity`.
    """
    if tokenizer_kind == "char":
        return {"num_characters": count_characters(lines)}
    return {"num_words": count_words(lines)}


def _weighted_nll(targets, logits, weights):
    nll = keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True)
    weights = tf.cast(weights, tf.float64)
    # Padding (weight 0) is left out, not multiplied by 0: an infinite NLL there (a model giving a
    # token probability 0, as kNN-LM with interpolation 1) would make the sum NaN.
    nll = tf.where(weights > 0, tf.cast(nll, tf.float64), tf.zeros_like(weights))
    return tf.reduce_sum(nll * weights), tf.reduce_sum(weights)


class StreamNLL:
    """The NLL step over a stateful stream: each batch continues the rows of the previous one.

    For models with `stateful_stream` (Transformer-XL): the memory goes from
    batch to batch through `model.call_with_cache`, so every token is
    predicted with the memory of the text before it. `reset()` starts a new
    pass with an empty memory (`evaluate_perplexity` calls it). One device.
    """

    def __init__(self, model):
        self.model = model
        self.memory = None

        @tf.function
        def step(inputs, targets, weights, memory):
            logits, memory, _ = model.call_with_cache(inputs, memory)
            return (*_weighted_nll(targets, logits, weights), memory)

        self._step = step

    def reset(self):
        self.memory = None

    def __call__(self, inputs, targets, weights):
        if self.memory is None:
            self.memory = self.model.init_cache(int(inputs.shape[0]))
        total, count, self.memory = self._step(inputs, targets, weights, self.memory)
        return total, count


def nll_function(model, strategy=None):
    """A compiled `(inputs, targets, weights) -> (sum of NLL, sum of weights)` step.

    A model with `stateful_stream` gets a `StreamNLL` (its memory carried
    from batch to batch).
    """
    if getattr(model, "stateful_stream", False):
        return StreamNLL(model)
    strategy = strategy or tf.distribute.get_strategy()

    def replica_step(inputs, targets, weights):
        return _weighted_nll(targets, model(inputs, training=False), weights)

    @tf.function
    def step(inputs, targets, weights):
        total, count = strategy.run(replica_step, args=(inputs, targets, weights))
        return (
            strategy.reduce(tf.distribute.ReduceOp.SUM, total, axis=None),
            strategy.reduce(tf.distribute.ReduceOp.SUM, count, axis=None),
        )

    return step


class Progress:
    """How far an evaluation is, on one line of a terminal: tokens done, tokens per second, time left.

    The line is redrawn in place (`\\r`) at most every `interval` seconds and
    ended by `close()` with the totals, as Keras' progress bar does for
    `fit`. Commands show it only on a terminal (`show_progress`).

    Args:
        total: the tokens the evaluation will score (`None`: unknown, no
            percentage or time left).
        label: what is measured, first on the line.
        stream: where to write (default `sys.stderr`).
        interval: seconds between redraws.
        clock: a monotonic clock in seconds.
    """

    def __init__(self, total=None, label="eval", stream=None, interval=0.5, clock=time.monotonic):
        self.total = total
        self.label = label
        self.stream = stream or sys.stderr
        self.interval = interval
        self.clock = clock
        self.start = clock()
        self.shown = None
        self.width = 0

    def update(self, done):
        now = self.clock()
        if self.shown is not None and now - self.shown < self.interval:
            return
        self.shown = now
        elapsed = now - self.start
        rate = done / elapsed if elapsed > 0 else 0.0
        if self.total:
            counted = f"{done:,}/{self.total:,} tokens ({100.0 * done / self.total:.0f}%)"
        else:
            counted = f"{done:,} tokens"
        parts = [f"{self.label}: {counted}"]
        if rate > 0:
            parts.append(f"{rate:,.0f} tokens/s")
            if self.total and done < self.total:
                parts.append(f"ETA {_duration((self.total - done) / rate)}")
        self._draw(", ".join(parts))

    def close(self, done):
        elapsed = self.clock() - self.start
        rate = f", {done / elapsed:,.0f} tokens/s" if elapsed > 0 else ""
        self._draw(f"{self.label}: {done:,} tokens in {_duration(elapsed)}{rate}")
        self.stream.write("\n")
        self.stream.flush()

    def _draw(self, line):
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()
        self.width = len(line)


def show_progress(quiet=False, stream=None):
    """Whether to show a `Progress` line: not `quiet`, and `stream` (stderr) is a terminal."""
    stream = stream or sys.stderr
    return not quiet and hasattr(stream, "isatty") and stream.isatty()


def _duration(seconds):
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def evaluate_perplexity(model, dataset, num_words=None, strategy=None, step=None, num_characters=None, progress=None):
    """Token loss and perplexity, and word perplexity or bits per character, of `model` on `dataset`.

    Args:
        model: maps `(B, T)` ids to `(B, T, V)` logits.
        dataset: `(inputs, targets, weights)` batches covering the split once
            (a `stateful_lm_dataset` for a model with `stateful_stream`).
        num_words: words of the split, `<eos>` included (None: no word perplexity).
        num_characters: characters of the split, one newline per line
            included (None: no bits per character).
        progress: a `Progress` told the tokens scored after each batch, or
            `None`.

    Returns:
        dict with `loss` (mean NLL per token, nats), `token_perplexity`,
        `tokens`, `nll`, and `word_perplexity` + `words` or
        `bits_per_character` + `characters`.
    """
    strategy = strategy or tf.distribute.get_strategy()
    step = step or nll_function(model, strategy)
    if hasattr(step, "reset"):  # a stateful stream starts with an empty memory
        step.reset()
    total, count = 0.0, 0.0
    for inputs, targets, weights in strategy.experimental_distribute_dataset(dataset):
        batch_total, batch_count = step(inputs, targets, weights)
        total += float(batch_total)
        count += float(batch_count)
        if progress is not None:
            progress.update(int(count))
    if progress is not None:
        progress.close(int(count))
    if count == 0:
        raise ValueError("The evaluation stream delivered no token")
    result = {"loss": total / count, "token_perplexity": math.exp(min(total / count, 700.0)), "tokens": int(count)}
    if num_words is not None:
        result.update(word_perplexity=math.exp(min(total / num_words, 700.0)), words=int(num_words))
    if num_characters is not None:
        result.update(bits_per_character=total / num_characters / math.log(2), characters=int(num_characters))
    result["nll"] = total
    return result
