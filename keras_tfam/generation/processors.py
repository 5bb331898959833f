"""Logits processors: how the decoding loop steers the next-token logits before a token is chosen.

A processor runs inside the compiled loop, once per step, on the float32
logits `(R, V)` of every row, and sees the tokens so far
(`DecodeContext`). The generator applies them in transformers' order:
`logit_bias`, `repetition_penalty`, presence and frequency penalties,
`no_repeat_ngram_size`, `min_new_tokens`, `suppress_token_ids`, then the
user's own (`logits_processor`); temperature, top-k, top-p and min-p are
the sampler's (`samplers.py`). Settings are Python numbers (baked into the
compiled loop) or, for a serving signature, `(R,)` tensors: one per row.
"""

from typing import Any, NamedTuple

import numpy as np
from keras import ops

from keras_tfam.utils import check_positive_int, check_real, is_integer


class DecodeContext(NamedTuple):
    """What a processor sees of the rows at one decoding step.

    Args:
        tokens: `(R, L)` int32 buffer; row `r`'s tokens so far are
            `tokens[r, :index]`: its prompt `[0, prompt_lengths[r])`, then
            what it generated (padding after a row stopped).
        index: scalar int32, the position whose token is being chosen.
        prompt_lengths: `(R,)` int32.

    Examples:
        >>> context = DecodeContext(np.array([[5, 7, 9, 0]], "int32"), np.int32(3), np.array([2], "int32"))
        >>> keras.ops.convert_to_numpy(context.generated_count())
        array([1], dtype=int32)
    """

    tokens: Any
    index: Any
    prompt_lengths: Any

    def generated_count(self):
        """`(R,)` int32: the tokens each row has generated so far."""
        return ops.maximum(ops.subtract(self.index, self.prompt_lengths), 0)


class LogitsProcessor:
    """Base class: `processor(logits (R, V) float32, context: DecodeContext) -> (R, V) logits`.

    Subclass it for a processor of your own and pass it as
    `generate(..., logits_processor=[...])`; it runs in the compiled loop,
    so write it with `keras.ops`. Processors with equal `cache_key()` share
    a compiled loop (by default, the same object).

    Args:
        None: a subclass takes its own settings.

    Examples:
        >>> class NoSameTokenTwice(LogitsProcessor):  # bans the token just generated
        ...     def __call__(self, logits, context):
        ...         last = keras.ops.take(context.tokens, context.index - 1, axis=1)
        ...         same = keras.ops.arange(logits.shape[-1])[None, :] == last[:, None]
        ...         return keras.ops.where(same, float("-inf"), logits)
        >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)
        >>> tokens = model.generate([[5, 7]], max_new_tokens=8, logits_processor=NoSameTokenTwice())
        >>> bool((tokens[0, 2:] != tokens[0, 1:-1]).all())
        True
    """

    def __call__(self, logits, context):
        raise NotImplementedError

    def cache_key(self):
        return (type(self).__name__, id(self))


def per_row(value):
    """A setting as `(R, 1)` (a `(R,)` tensor, one per row) or as it is (a Python number)."""
    if isinstance(value, (int, float)):
        return value
    return ops.reshape(ops.cast(value, "float32"), (-1, 1))


def token_counts(context, vocabulary_size, generated_only=False):
    """`(R, V)` float32: how often each id occurs in each row's tokens so far (its generated ones only)."""
    tokens = context.tokens
    rows, length = ops.shape(tokens)[0], ops.shape(tokens)[1]
    positions = ops.arange(length)[None, :]
    seen = ops.less(positions, context.index)
    if generated_only:
        seen = ops.logical_and(seen, ops.greater_equal(positions, ops.expand_dims(context.prompt_lengths, 1)))
    seen = ops.broadcast_to(seen, (rows, length))
    row_ids = ops.broadcast_to(ops.arange(rows)[:, None], (rows, length))
    indices = ops.stack([ops.reshape(row_ids, (-1,)), ops.reshape(tokens, (-1,))], axis=1)
    return ops.scatter(indices, ops.reshape(ops.cast(seen, "float32"), (-1,)), (rows, vocabulary_size))


def id_mask(ids, vocabulary_size):
    """`(1 or R, V)` bool: the ids of `(S,)` or per row `(R, S)` `ids` (negative ids are none)."""
    ids = ops.convert_to_tensor(ids, "int32")
    if len(ids.shape) == 1:
        ids = ids[None, :]
    return ops.any(ids[:, :, None] == ops.arange(vocabulary_size, dtype="int32")[None, None, :], axis=1)


class LogitBias(LogitsProcessor):
    """Adds `bias[id]` to the logits of each id (OpenAI's `logit_bias`; transformers' one-token `sequence_bias`).

    Args:
        bias: `{token id: bias}`.

    Examples:
        >>> context = DecodeContext(np.zeros((1, 4), "int32"), np.int32(2), np.array([2]))
        >>> keras.ops.convert_to_numpy(LogitBias({1: 2.0})(np.zeros((1, 3), "float32"), context))
        array([[0., 2., 0.]], dtype=float32)
    """

    def __init__(self, bias):
        self.bias = dict(sorted((int(i), float(b)) for i, b in bias.items()))

    def __call__(self, logits, context):
        dense = np.zeros((logits.shape[-1],), np.float32)
        for token, value in self.bias.items():
            dense[token] = value
        return ops.add(logits, ops.convert_to_tensor(dense[None, :]))

    def cache_key(self):
        return ("logit_bias", tuple(self.bias.items()))


class RepetitionPenalty(LogitsProcessor):
    """The repetition penalty of Keskar et al. (2019), transformers' `repetition_penalty`.

    The logit of an id in the tokens so far (prompt included) is divided by
    `penalty` when positive, multiplied by it when negative.

    Args:
        penalty: `> 0`; 1 changes nothing, more discourages repeats.

    Examples:
        >>> context = DecodeContext(np.array([[0, 2, 0]]), np.int32(2), np.array([2]))  # ids 0 and 2 seen
        >>> keras.ops.convert_to_numpy(RepetitionPenalty(2.0)(np.array([[4.0, 4.0, -4.0]], "float32"), context))
        array([[ 2.,  4., -8.]], dtype=float32)
    """

    def __init__(self, penalty):
        self.penalty = penalty

    def __call__(self, logits, context):
        penalty = per_row(self.penalty)

        def penalized():
            present = token_counts(context, logits.shape[-1]) > 0
            return ops.where(present, ops.where(logits < 0, logits * penalty, logits / penalty), logits)

        if isinstance(self.penalty, (int, float)):
            return penalized()
        # Per-row tensors (a serving signature's): nothing to count when every row's penalty is 1.
        return ops.cond(ops.any(ops.not_equal(penalty, 1.0)), penalized, lambda: logits)

    def cache_key(self):
        return ("repetition_penalty", self.penalty)


class OccurrencePenalty(LogitsProcessor):
    """OpenAI's presence and frequency penalties over the generated tokens.

    Each id's logit less `count * frequency + (count > 0) * presence`,
    `count` its occurrences among the tokens generated so far.

    Args:
        presence: subtracted once from every id already generated.
        frequency: subtracted per occurrence.

    Examples:
        >>> context = DecodeContext(np.array([[0, 1, 1, 0]]), np.int32(3), np.array([1]))  # generated: 1, 1
        >>> penalty = OccurrencePenalty(presence=0.5, frequency=1.0)
        >>> keras.ops.convert_to_numpy(penalty(np.zeros((1, 3), "float32"), context))
        array([[ 0. , -2.5,  0. ]], dtype=float32)
    """

    def __init__(self, presence=0.0, frequency=0.0):
        self.presence, self.frequency = presence, frequency

    def __call__(self, logits, context):
        counts = token_counts(context, logits.shape[-1], generated_only=True)
        penalty = counts * per_row(self.frequency) + ops.cast(counts > 0, "float32") * per_row(self.presence)
        return logits - penalty

    def cache_key(self):
        return ("occurrence_penalty", self.presence, self.frequency)


class NoRepeatNGram(LogitsProcessor):
    """No n-gram of `size` tokens twice in a row's tokens (prompt included); transformers' `no_repeat_ngram_size`.

    An id that would complete an n-gram already there is banned.

    Args:
        size: n, at least 1.

    Examples:
        >>> context = DecodeContext(np.array([[1, 2, 1, 0]]), np.int32(3), np.array([3]))  # 1 2 1: then not 2
        >>> keras.ops.convert_to_numpy(NoRepeatNGram(2)(np.zeros((1, 3), "float32"), context))
        array([[  0.,   0., -inf]], dtype=float32)
    """

    def __init__(self, size):
        self.size = check_positive_int("no_repeat_ngram_size", size)

    def __call__(self, logits, context):
        n, tokens, index = self.size, context.tokens, context.index
        rows, length = ops.shape(tokens)[0], ops.shape(tokens)[1]
        starts = length - n + 1
        if isinstance(starts, int) and starts <= 0:
            return logits
        # Every n-gram start j with its last token before `index`, compared with the n - 1 tokens before it.
        last = ops.slice(tokens, (0, ops.maximum(index - n + 1, 0)), (rows, n - 1)) if n > 1 else None
        match = ops.broadcast_to(ops.less(ops.arange(starts)[None, :] + n - 1, index), (rows, starts))
        for k in range(n - 1):
            shifted = ops.slice(tokens, (0, k), (rows, starts))
            match = ops.logical_and(match, shifted == last[:, k : k + 1])
        completions = ops.slice(tokens, (0, n - 1), (rows, starts))
        row_ids = ops.broadcast_to(ops.arange(rows)[:, None], (rows, starts))
        indices = ops.stack([ops.reshape(row_ids, (-1,)), ops.reshape(completions, (-1,))], axis=1)
        banned = ops.scatter(indices, ops.reshape(ops.cast(match, "float32"), (-1,)), ops.shape(logits)) > 0
        return ops.where(banned, float("-inf"), logits)

    def cache_key(self):
        return ("no_repeat_ngram_size", self.size)


class MinNewTokens(LogitsProcessor):
    """The stop ids banned until a row has generated `count` tokens; transformers' `min_new_tokens`.

    Args:
        count: new tokens before a stop id may be chosen.
        stop_token_ids: `(S,)` ids, or `(R, S)` per row (negative: none).

    Examples:
        >>> context = DecodeContext(np.zeros((1, 5), "int32"), np.int32(3), np.array([2]))  # 1 new token
        >>> keras.ops.convert_to_numpy(MinNewTokens(2, [1])(np.zeros((1, 3), "float32"), context))
        array([[  0., -inf,   0.]], dtype=float32)
    """

    def __init__(self, count, stop_token_ids):
        self.count, self.stop_token_ids = count, stop_token_ids

    def __call__(self, logits, context):
        early = ops.cast(context.generated_count(), "float32")[:, None] < per_row(self.count)
        banned = ops.logical_and(early, id_mask(self.stop_token_ids, logits.shape[-1]))
        return ops.where(banned, float("-inf"), logits)

    def cache_key(self):
        return ("min_new_tokens", self.count, tuple(np.asarray(self.stop_token_ids).reshape(-1).tolist()))


class SuppressTokens(LogitsProcessor):
    """Ids never generated; transformers' `suppress_tokens`.

    Args:
        token_ids: the ids.

    Examples:
        >>> context = DecodeContext(np.zeros((1, 3), "int32"), np.int32(1), np.array([1]))
        >>> keras.ops.convert_to_numpy(SuppressTokens([0])(np.zeros((1, 3), "float32"), context))
        array([[-inf,   0.,   0.]], dtype=float32)
    """

    def __init__(self, token_ids):
        self.token_ids = tuple(sorted(int(i) for i in token_ids))

    def __call__(self, logits, context):
        banned = np.zeros((logits.shape[-1],), bool)
        banned[list(self.token_ids)] = True
        return ops.where(ops.convert_to_tensor(banned[None, :]), float("-inf"), logits)

    def cache_key(self):
        return ("suppress_token_ids", self.token_ids)


def apply_processors(processors, logits, context):
    """`logits` through each processor in turn."""
    for processor in processors:
        logits = processor(logits, context)
    return logits


def _ids(name, values, vocabulary_size):
    values = list(values) if isinstance(values, (list, tuple, np.ndarray)) else [values]
    for value in values:
        if not is_integer(value) or not 0 <= value < vocabulary_size:
            raise ValueError(
                f"`{name}` must hold token ids in [0, {vocabulary_size}) (the model's vocabulary). "
                f"Received: {name}={values!r}"
            )
    return [int(v) for v in values]


def build_processors(
    vocabulary_size,
    stop_token_ids=(),
    logit_bias=None,
    repetition_penalty=None,
    presence_penalty=None,
    frequency_penalty=None,
    no_repeat_ngram_size=None,
    min_new_tokens=None,
    suppress_token_ids=None,
    logits_processor=None,
):
    """The processors of `generate`'s options, checked (one `ValueError` naming a bad option), in order."""
    processors = []
    if logit_bias:
        if not isinstance(logit_bias, dict):
            raise ValueError(f"`logit_bias` must be a dict {{token id: bias}}. Received: logit_bias={logit_bias!r}")
        _ids("logit_bias", list(logit_bias), vocabulary_size)
        for value in logit_bias.values():
            check_real("logit_bias", value, "of any sign", lambda b: True)
        processors.append(LogitBias(logit_bias))
    if repetition_penalty is not None:
        check_real("repetition_penalty", repetition_penalty, "> 0", lambda p: p > 0)
        if repetition_penalty != 1:
            processors.append(RepetitionPenalty(float(repetition_penalty)))
    presence = check_real("presence_penalty", presence_penalty or 0.0, "of any sign", lambda p: True)
    frequency = check_real("frequency_penalty", frequency_penalty or 0.0, "of any sign", lambda p: True)
    if presence or frequency:
        processors.append(OccurrencePenalty(presence, frequency))
    if no_repeat_ngram_size:
        processors.append(NoRepeatNGram(no_repeat_ngram_size))
    if min_new_tokens:
        check_positive_int("min_new_tokens", min_new_tokens)
        if len(stop_token_ids):
            processors.append(MinNewTokens(min_new_tokens, np.asarray(stop_token_ids, np.int32)))
    if suppress_token_ids is not None and len(suppress_token_ids):
        processors.append(SuppressTokens(_ids("suppress_token_ids", suppress_token_ids, vocabulary_size)))
    if logits_processor is not None:
        extra = logits_processor if isinstance(logits_processor, (list, tuple)) else [logits_processor]
        for processor in extra:
            if not isinstance(processor, LogitsProcessor):
                raise ValueError(
                    "`logits_processor` must be a keras_tfam.generation.LogitsProcessor or a list of them. "
                    f"Received: logits_processor={processor!r}"
                )
        processors.extend(extra)
    return tuple(processors)


def stop_sequence_table(stop_sequences, vocabulary_size):
    """`(N, S)` int32: each stop sequence right-aligned, `-1` before it; `None` for none."""
    if stop_sequences is None or not len(stop_sequences):
        return None
    if not isinstance(stop_sequences, (list, tuple)) or not all(
        isinstance(s, (list, tuple, np.ndarray)) and len(s) for s in stop_sequences
    ):
        raise ValueError(
            "`stop_sequences` must be a list of non-empty lists of token ids. "
            f"Received: stop_sequences={stop_sequences!r}"
        )
    sequences = [_ids("stop_sequences", s, vocabulary_size) for s in stop_sequences]
    width = max(map(len, sequences))
    return np.array([[-1] * (width - len(s)) + s for s in sequences], np.int32)


def ends_stop_sequence(tokens, index, prompt_lengths, table):
    """`(R,)` bool: rows whose generated tokens up to `index` (included) end with a row of `table` `(N, S)`."""
    width = table.shape[1]
    table = ops.convert_to_tensor(table, "int32")
    positions = index - width + 1 + ops.arange(width)
    window = ops.take(tokens, ops.maximum(positions, 0), axis=1)  # (R, S)
    generated = ops.greater_equal(positions[None, :], ops.expand_dims(prompt_lengths, 1))
    equal = ops.logical_and(window[:, None, :] == table[None, :, :], generated[:, None, :])
    matched = ops.all(ops.logical_or(equal, table[None, :, :] < 0), axis=-1)
    return ops.any(matched, axis=-1)


__all__ = [
    "DecodeContext",
    "LogitBias",
    "LogitsProcessor",
    "MinNewTokens",
    "NoRepeatNGram",
    "OccurrencePenalty",
    "RepetitionPenalty",
    "SuppressTokens",
]
