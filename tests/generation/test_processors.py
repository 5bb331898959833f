"""Logits processors, stop sequences, log-probabilities and streaming against their definitions.

Each processor is checked against a few lines of NumPy from its definition (transformers' for the options it
has, OpenAI's for the presence and frequency penalties, Nguyen et al. for min-p); the loop's outputs against
invariants: log-probabilities equal the full pass's log-softmax, streamed chunks equal one `generate` call.
(`test_processors_vs_transformers.py` compares whole generations with transformers' `generate`.)
"""

import keras
import numpy as np
import pytest

from keras_tfam.generation import (
    DecodeContext,
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    NoRepeatNGram,
    OccurrencePenalty,
    RepetitionPenalty,
    SuppressTokens,
)
from keras_tfam.generation.samplers import min_p_filter
from keras_tfam.models import GPT2LM

rng = np.random.default_rng(0)
VOCABULARY = 12


def context_and_logits(rows=3, length=10, index=7):
    tokens = rng.integers(0, VOCABULARY, (rows, length)).astype("int32")
    tokens[0, :6] = [1, 2, 3, 1, 2, 3]  # n-grams that repeat
    lengths = np.array([2, 4, 7][:rows], "int32")
    logits = rng.normal(size=(rows, VOCABULARY)).astype("float32") * 3
    return DecodeContext(tokens, np.int32(index), lengths), logits


def run(processor, logits, context):
    return keras.ops.convert_to_numpy(processor(keras.ops.convert_to_tensor(logits), context))


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_ids_seen_so_far():
    context, logits = context_and_logits()
    expected = logits.copy()
    for r in range(len(logits)):
        for token in set(context.tokens[r, : context.index].tolist()):
            value = logits[r, token]
            expected[r, token] = value / 1.7 if value > 0 else value * 1.7
    np.testing.assert_allclose(run(RepetitionPenalty(1.7), logits, context), expected, rtol=1e-6)


def test_presence_and_frequency_penalties_count_the_generated_tokens_only():
    context, logits = context_and_logits()
    expected = logits.copy()
    for r in range(len(logits)):
        generated = context.tokens[r, context.prompt_lengths[r] : context.index].tolist()
        for token in set(generated):
            expected[r, token] -= generated.count(token) * 0.4 + 0.9
    np.testing.assert_allclose(run(OccurrencePenalty(presence=0.9, frequency=0.4), logits, context), expected, 1e-6)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_no_repeat_ngram_bans_the_ids_that_would_repeat_an_ngram(size):
    context, logits = context_and_logits(index=6)
    expected = logits.copy()
    for r in range(len(logits)):
        sequence = context.tokens[r, : context.index].tolist()
        prefix = tuple(sequence[len(sequence) - size + 1 :]) if size > 1 else ()
        for j in range(len(sequence) - size + 1):
            if tuple(sequence[j : j + size - 1]) == prefix:
                expected[r, sequence[j + size - 1]] = -np.inf
    assert np.isinf(expected).any()
    np.testing.assert_array_equal(run(NoRepeatNGram(size), logits, context), expected)


def test_min_new_tokens_bans_the_stop_ids_until_that_many_new_tokens():
    context, logits = context_and_logits(index=7)  # rows have 5, 3 and 0 new tokens
    banned = run(MinNewTokens(4, np.array([3, 5], "int32")), logits, context)
    for r, new in enumerate([5, 3, 0]):
        expected = logits[r].copy()
        if new < 4:
            expected[[3, 5]] = -np.inf
        np.testing.assert_array_equal(banned[r], expected)


def test_logit_bias_and_suppressed_ids():
    context, logits = context_and_logits()
    biased = run(LogitBias({2: 1.5, 7: -3.0}), logits, context)
    expected = logits.copy()
    expected[:, 2] += 1.5
    expected[:, 7] -= 3.0
    np.testing.assert_allclose(biased, expected, rtol=1e-6)
    suppressed = run(SuppressTokens([0, 9]), logits, context)
    assert np.isneginf(suppressed[:, [0, 9]]).all()
    np.testing.assert_array_equal(np.delete(suppressed, [0, 9], axis=1), np.delete(logits, [0, 9], axis=1))


def test_min_p_keeps_the_tokens_at_least_min_p_times_as_likely_as_the_most_likely():
    logits = rng.normal(size=(4, 30)).astype("float32") * 2
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    expected = np.where(probabilities < 0.2 * probabilities.max(-1, keepdims=True), -np.inf, logits)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(min_p_filter(logits, 0.2)), expected)


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(3)
    return GPT2LM(vocabulary_size=40, num_layers=2, num_heads=2, hidden_dim=16, max_sequence_length=64)


PROMPTS = [[5, 7, 9, 11], [3], [8, 8]]


def test_logprobs_are_the_full_pass_log_softmax_at_the_chosen_tokens(model):
    result = model.generate(PROMPTS, max_new_tokens=6, repetition_penalty=2.0, return_logprobs=True)
    for b, prompt in enumerate(PROMPTS):
        row = result["token_ids"][b : b + 1, : len(prompt) + 6]
        logits = keras.ops.convert_to_numpy(model(row)).astype(np.float64)[0]
        shifted = logits - logits.max(-1, keepdims=True)
        log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        positions = np.arange(len(prompt), len(prompt) + 6)
        expected = log_softmax[positions - 1, row[0, positions]]
        np.testing.assert_allclose(result["logprobs"][b], expected, atol=1e-4)
    np.testing.assert_array_equal(result["num_generated"], [6, 6, 6])


def test_a_stop_sequence_ends_a_row_after_the_token_that_completes_it(model):
    plain = model.generate(PROMPTS, max_new_tokens=10)
    first = plain[0, 4:6].tolist()  # row 0's first two new tokens
    result = model.generate(PROMPTS, max_new_tokens=10, stop_sequences=[first, [39, 38, 37]], return_logprobs=True)
    assert result["token_ids"][0, :6].tolist() == plain[0, :6].tolist()
    assert (result["token_ids"][0, 6:] == 0).all() and result["num_generated"][0] == 2
    for b, prompt in enumerate(PROMPTS[1:], start=1):  # a row ends at its first completion, if any
        new = plain[b, len(prompt) : len(prompt) + 10].tolist()
        ends = [i + 2 for i in range(9) if new[i : i + 2] == first]
        count = ends[0] if ends else 10
        assert result["num_generated"][b] == count
        assert result["token_ids"][b, len(prompt) : len(prompt) + count].tolist() == new[:count]


def test_a_stop_sequence_counts_generated_tokens_only(model):
    plain = model.generate([[5, 7, 9, 11]], max_new_tokens=6)
    straddling = [11, int(plain[0, 4])]  # the prompt's last token and the first new one
    stopped = model.generate([[5, 7, 9, 11]], max_new_tokens=6, stop_sequences=[straddling], return_logprobs=True)
    new = plain[0, 4:].tolist()
    ends = [i + 2 for i in range(5) if new[i : i + 2] == straddling]
    count = ends[0] if ends else 6
    assert stopped["num_generated"][0] == count
    np.testing.assert_array_equal(stopped["token_ids"][0, 4 : 4 + count], plain[0, 4 : 4 + count])


class BanLastToken(LogitsProcessor):
    def __call__(self, logits, context):
        last = keras.ops.take(context.tokens, context.index - 1, axis=1)
        return keras.ops.where(keras.ops.arange(logits.shape[-1])[None, :] == last[:, None], float("-inf"), logits)


def test_a_users_processor_sees_the_tokens_so_far(model):
    tokens = model.generate(PROMPTS, max_new_tokens=8, logits_processor=[BanLastToken()])
    for b, prompt in enumerate(PROMPTS):
        row = tokens[b, len(prompt) - 1 : len(prompt) + 8]
        assert (row[1:] != row[:-1]).all()


@pytest.mark.parametrize("options", [{}, {"sampler": "top_p", "seed": 4}, {"stop_token_ids": [3], "min_new_tokens": 2}])
def test_streamed_chunks_concatenated_are_one_generate_call(model, options):
    full = model.generate(PROMPTS, max_new_tokens=11, repetition_penalty=1.3, **options)
    chunks = list(model.stream(PROMPTS, max_new_tokens=11, chunk_size=4, repetition_penalty=1.3, **options))
    assert all(chunk.shape[1] <= 4 for chunk in chunks)
    streamed = np.concatenate(chunks, axis=1)
    for b, prompt in enumerate(PROMPTS):
        new = full[b, len(prompt) : len(prompt) + 11]
        np.testing.assert_array_equal(streamed[b], new[: streamed.shape[1]])
        assert (new[streamed.shape[1] :] == 0).all()  # the stream ends only when every row has stopped


@pytest.mark.parametrize(
    "options, message",
    [
        ({"repetition_penalty": 0}, "`repetition_penalty` must be a finite number > 0. Received: repetition_penalty=0"),
        ({"min_p": 1.5, "sampler": "top_k"}, "`min_p` must be a finite number in [0, 1]. Received: min_p=1.5"),
        ({"min_p": 0.1}, "`min_p` filters what a keras_tfam sampler draws"),
        ({"no_repeat_ngram_size": -2}, "`no_repeat_ngram_size` must be a positive integer"),
        ({"min_new_tokens": 2.5}, "`min_new_tokens` must be a positive integer"),
        ({"logit_bias": {40: 1.0}}, "`logit_bias` must hold token ids in [0, 40)"),
        ({"logit_bias": {3: float("nan")}}, "`logit_bias` must be a finite number"),
        ({"suppress_token_ids": [-1]}, "`suppress_token_ids` must hold token ids in [0, 40)"),
        ({"stop_sequences": [[]]}, "`stop_sequences` must be a list of non-empty lists of token ids"),
        ({"stop_sequences": [[3, 99]]}, "`stop_sequences` must hold token ids in [0, 40)"),
        ({"frequency_penalty": "high"}, "`frequency_penalty` must be a finite number"),
        ({"logits_processor": [len]}, "`logits_processor` must be a keras_tfam.generation.LogitsProcessor"),
    ],
)
def test_bad_options_are_refused_in_one_line_naming_the_option(model, options, message):
    with pytest.raises(ValueError) as error:
        model.generate([[1, 2]], max_new_tokens=2, **options)
    assert message in str(error.value) and "\n" not in str(error.value)
