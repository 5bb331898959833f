"""Prompt lookup decoding: drafts copied from the tokens so far, verified several at a pass, exactly.

References: plain decoding (the same tokens, counts and log-probabilities, greedy and seeded sampling, with
processors and stop ids, rows of different lengths), transformers' lookup rule in a few lines of Python (the
drafts), and the passes a drafted loop saves over a text that repeats itself (counted on a wrapper).
"""

import keras
import numpy as np
import pytest
from counting_passes import CountingPasses
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_tfam.generation import GreedySampler, Sampling
from keras_tfam.generation.decoding import DecodingLoop, plan_decoding
from keras_tfam.generation.speculative import DraftedDecodingLoop, PromptLookup
from keras_tfam.models import GPT2LM, DecoderLM, EarlyExitLM

VOCABULARY = 23
TINY = dict(vocabulary_size=VOCABULARY, num_layers=2, num_heads=2, hidden_dim=16, max_sequence_length=48)
PROMPTS = [[3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [7, 8, 7, 8, 7]]


def lookup_reference(row, index, num_tokens, max_ngram):
    """transformers' `PromptLookupCandidateGenerator` on one row's tokens so far: for n from `max_ngram` down,
    the continuation of the earliest occurrence of the last n tokens that has one; -1 past it."""
    tokens = list(row[:index])
    for n in range(max_ngram, 0, -1):
        if n > len(tokens):
            continue
        ngram = tokens[-n:]
        for start in range(len(tokens) - n):
            if tokens[start : start + n] == ngram:
                copied = tokens[start + n : start + n + num_tokens]
                return copied + [-1] * (num_tokens - len(copied))
    return [-1] * num_tokens


@settings(max_examples=60, deadline=None, database=None)
@given(
    rows=st.lists(st.lists(st.integers(0, 3), min_size=12, max_size=12), min_size=1, max_size=3),
    index=st.integers(1, 12),
    num_tokens=st.integers(1, 4),
    max_ngram=st.integers(1, 3),
)
def test_drafts_are_transformers_lookup(rows, index, num_tokens, max_ngram):
    tokens = np.array(rows, "int32")
    drafts = keras.ops.convert_to_numpy(PromptLookup(num_tokens, max_ngram).draft(tokens, np.int32(index)))
    assert drafts.tolist() == [lookup_reference(row, index, num_tokens, max_ngram) for row in rows]


def llama_like():
    return DecoderLM(
        **TINY, head_dim=8, num_key_value_heads=1, position="rotary", norm="rms", activation="swiglu", use_bias=False,
        tie_embeddings=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def models():
    keras.utils.set_random_seed(0)
    return {"gpt2": GPT2LM(**TINY), "llama_like": llama_like()}


# Sampled with every processor and stop kind at once: each position's token is chosen as plain decoding does.
STEERED = dict(
    sampler="top_k", seed=3, repetition_penalty=1.3, no_repeat_ngram_size=3, min_new_tokens=2, stop_token_ids=[5],
    stop_sequences=[[4, 4, 4]],
)  # fmt: skip


@pytest.mark.parametrize(
    "name, options, num_tokens",
    [("gpt2", {}, 1), ("gpt2", {}, 4), ("gpt2", STEERED, 3), ("llama_like", STEERED, 3)],
    ids=["gpt2-greedy-1", "gpt2-greedy-4", "gpt2-steered-3", "llama_like-steered-3"],
)
def test_the_tokens_of_plain_decoding(models, name, options, num_tokens):
    model = models[name]
    plain = model.generate(PROMPTS, 20, return_logprobs=True, **options)
    drafted = model.generate(PROMPTS, 20, return_logprobs=True, prompt_lookup_num_tokens=num_tokens, **options)
    np.testing.assert_array_equal(drafted["token_ids"], plain["token_ids"])
    np.testing.assert_array_equal(drafted["num_generated"], plain["num_generated"])
    np.testing.assert_allclose(drafted["logprobs"], plain["logprobs"], atol=1e-5)


def test_streamed_chunks_are_the_tokens_of_generate(models):
    model = models["gpt2"]
    expected = model.generate(PROMPTS, 12, prompt_lookup_num_tokens=3)
    chunks = list(model.stream(PROMPTS, 12, chunk_size=5, prompt_lookup_num_tokens=3))
    lengths = [len(p) for p in PROMPTS]
    for row, length in enumerate(lengths):
        assert np.concatenate(chunks, axis=1)[row].tolist() == expected[row, length : length + 12].tolist()


@pytest.mark.skipif(keras.config.backend() == "jax", reason="a JAX loop runs traced: its passes are not counted")
def test_a_text_that_repeats_itself_takes_fewer_passes():
    keras.utils.set_random_seed(0)
    counting = CountingPasses(GPT2LM(**TINY))
    prompt = np.array([PROMPTS[0] + [0] * (20 + 4)], "int32")  # 20 new tokens, and the 4 a last pass drafts
    plan = plan_decoding(counting, prompt.shape[1], 10)

    def run(loop):
        counting.passes = 0
        state = loop.start(prompt, np.array([10]), np.array([20]), np.int32(0), np.zeros((0,), "int32"))
        return keras.ops.convert_to_numpy(loop.finish(loop.run(state))["token_ids"]), counting.passes

    search = Sampling(GreedySampler())
    plain, plain_passes = run(DecodingLoop(counting, search, 0, plan))
    drafted, drafted_passes = run(DraftedDecodingLoop(counting, search, 0, plan, PromptLookup(4)))
    assert drafted[:, :30].tolist() == plain[:, :30].tolist()
    assert plain_passes == 1 + 20  # the prefill, then a pass per new token
    assert drafted_passes < plain_passes / 2, (drafted_passes, plain)


def test_past_the_model_s_context_it_decodes_without_drafts_and_says_so():
    model = GPT2LM(**TINY)
    with pytest.warns(UserWarning, match=r"not fit the model's context \(48 positions\): this call decodes without"):
        drafted = model.generate(PROMPTS, 40, prompt_lookup_num_tokens=3)
    np.testing.assert_array_equal(drafted, model.generate(PROMPTS, 40))


@pytest.mark.parametrize(
    "make, options, expected",
    [
        (lambda: GPT2LM(**TINY), {"beam_size": 2}, "one hypothesis per prompt"),
        (lambda: GPT2LM(**TINY, attention="linear", position="none"), {}, "slot of its own"),
        (lambda: GPT2LM(**TINY, local_window=3), {}, "slot of its own"),
        (lambda: EarlyExitLM(GPT2LM(**TINY), threshold=1.0), {}, "early exits"),
    ],
    ids=["beams", "recurrent", "ring", "early_exit"],
)
def test_what_it_cannot_draft_for_is_refused_in_one_line(make, options, expected):
    options = {"max_new_tokens": 8, **options}
    with pytest.raises(ValueError, match=expected) as error:
        make().generate(PROMPTS, prompt_lookup_num_tokens=3, **options)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens=None"):
        GPT2LM(**TINY).generate(PROMPTS, 4, max_matching_ngram_size=2)
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        GPT2LM(**TINY).generate(PROMPTS, 4, prompt_lookup_num_tokens=0)
