"""Speculative decoding with a draft model (and self-speculation through early exit): exact.

References: plain decoding (the same tokens, counts and log-probabilities, greedy and seeded sampling with
processors, rows of different lengths that accept differently), the exact two-token marginal of a tiny
model computed from full passes (the distribution sampled through drafts of another model), and the passes
a perfect draft saves (counted on a wrapper).
"""

import warnings

import keras
import numpy as np
import pytest
from counting_passes import CountingPasses

from keras_tfam.generation import Sampling, TopKSampler
from keras_tfam.generation.decoding import plan_decoding
from keras_tfam.generation.speculative import DraftedDecodingLoop, DraftModel
from keras_tfam.models import GPT2LM, DecoderLM, EarlyExitLM

VOCABULARY = 23
TINY = dict(vocabulary_size=VOCABULARY, num_layers=2, num_heads=2, hidden_dim=16, max_sequence_length=48)
PROMPTS = [[3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [7, 8, 7, 8, 7], [2]]


@pytest.fixture(scope="module")
def models():
    keras.utils.set_random_seed(0)
    llama_like = DecoderLM(
        **TINY, head_dim=8, num_key_value_heads=1, position="rotary", norm="rms", activation="swiglu", use_bias=False,
        tie_embeddings=False,
    )  # fmt: skip
    return {"gpt2": GPT2LM(**TINY), "llama_like": llama_like, "draft": GPT2LM(**dict(TINY, num_layers=1))}


STEERED = dict(sampler="top_k", seed=3, repetition_penalty=1.3, min_new_tokens=2, stop_token_ids=[5])


@pytest.mark.parametrize(
    "name, options, num_tokens",
    [("gpt2", {}, 1), ("gpt2", {}, 4), ("gpt2", STEERED, 3), ("llama_like", STEERED, 2)],
    ids=["gpt2-greedy-1", "gpt2-greedy-4", "gpt2-steered-3", "llama_like-steered-2"],
)
def test_the_tokens_of_plain_decoding(models, name, options, num_tokens):
    model, draft = models[name], models["draft"]
    plain = model.generate(PROMPTS, 20, return_logprobs=True, **options)
    drafted = model.generate(
        PROMPTS, 20, return_logprobs=True, draft_model=draft, num_draft_tokens=num_tokens, **options
    )
    np.testing.assert_array_equal(drafted["token_ids"], plain["token_ids"])
    np.testing.assert_array_equal(drafted["num_generated"], plain["num_generated"])
    np.testing.assert_allclose(drafted["logprobs"], plain["logprobs"], atol=1e-5)


def test_self_speculation_through_early_exit_is_the_backbone():
    keras.utils.set_random_seed(1)
    model = EarlyExitLM(GPT2LM(**dict(TINY, num_layers=3)))
    for layers in (1, 2):
        drafted = model.backbone.generate(PROMPTS, 16, draft_model=model.draft_model(layers), num_draft_tokens=3)
        np.testing.assert_array_equal(drafted, model.backbone.generate(PROMPTS, 16))
    with pytest.raises(ValueError, match=r"`num_layers` must be an integer from 1 to 2.*Received: num_layers=3"):
        model.draft_model(3)


def test_streamed_chunks_are_the_tokens_of_generate(models):
    model, draft = models["gpt2"], models["draft"]
    expected = model.generate(PROMPTS, 12, draft_model=draft, num_draft_tokens=3)
    chunks = np.concatenate(list(model.stream(PROMPTS, 12, chunk_size=5, draft_model=draft, num_draft_tokens=3)), 1)
    for row, prompt in enumerate(PROMPTS):
        assert chunks[row].tolist() == expected[row, len(prompt) : len(prompt) + 12].tolist()


def test_sampled_through_another_models_drafts_the_tokens_follow_the_model():
    """4000 rows, each its own seed, sample two tokens after one prompt through a random draft's greedy
    drafts: their joint frequencies are the target's `p(x1) p(x2 | x1)`, from full passes."""
    keras.utils.set_random_seed(2)
    vocabulary, rows = 5, 4000
    config = dict(vocabulary_size=vocabulary, num_heads=2, hidden_dim=16, max_sequence_length=16)
    target, draft = GPT2LM(num_layers=2, **config), GPT2LM(num_layers=1, **config)
    prompt = [1, 3]
    tokens = np.array([prompt + [0] * 4] * rows, "int32")  # two new tokens and the two a last pass drafts
    plan = plan_decoding(target, tokens.shape[1], len(prompt))
    loop = DraftedDecodingLoop(target, Sampling(TopKSampler(k=vocabulary)), 0, plan, DraftModel(draft, 2))
    lengths = np.full((rows,), len(prompt), "int32")
    seeds = np.arange(rows, dtype="int32")
    state = loop.start(tokens, lengths, np.full((rows,), 2, "int32"), seeds, np.zeros((0,), "int32"))
    sampled = keras.ops.convert_to_numpy(loop.finish(loop.run(state))["token_ids"])[:, 2:4]

    def probabilities(sequences):
        logits = keras.ops.convert_to_numpy(target(np.array(sequences, "int32")))[:, -1]
        e = np.exp(logits - logits.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    first = probabilities([prompt])[0]
    second = probabilities([prompt + [x] for x in range(vocabulary)])
    exact = first[:, None] * second  # (x1, x2)
    counts = np.zeros((vocabulary, vocabulary))
    np.add.at(counts, (sampled[:, 0], sampled[:, 1]), 1)
    frequencies = counts / rows
    bound = 4.5 * np.sqrt(exact * (1 - exact) / rows) + 1e-3  # about 4.5 standard deviations per cell
    assert (np.abs(frequencies - exact) < bound).all(), (frequencies, exact)


@pytest.mark.skipif(keras.config.backend() == "jax", reason="a JAX loop runs traced: its passes are not counted")
def test_a_perfect_draft_verifies_k_plus_one_tokens_a_pass():
    keras.utils.set_random_seed(0)
    model = GPT2LM(**TINY)
    counting = CountingPasses(model)
    prompt = np.array([PROMPTS[0] + [0] * (20 + 4)], "int32")
    plan = plan_decoding(counting, prompt.shape[1], 10)
    loop = DraftedDecodingLoop(counting, Sampling(TopKSampler(k=1)), 0, plan, DraftModel(model, 4))
    state = loop.start(prompt, np.array([10]), np.array([20]), np.int32(0), np.zeros((0,), "int32"))
    drafted = keras.ops.convert_to_numpy(loop.finish(loop.run(state))["token_ids"])
    assert drafted[:, :30].tolist() == model.generate([PROMPTS[0]], 20).tolist()
    assert counting.passes == 1 + 4  # the prefill, then 5 tokens a pass (the last pass's fifth past the 20)


def test_past_the_draft_s_or_the_model_s_context_it_decodes_without_drafts_and_says_so(models):
    model, short_draft = models["gpt2"], GPT2LM(**dict(TINY, max_sequence_length=20))
    with pytest.warns(UserWarning, match=r"\(10 \+ 12 \+ 4\) do not fit the draft model's context \(20 positions\)"):
        drafted = model.generate(PROMPTS, 12, draft_model=short_draft)
    np.testing.assert_array_equal(drafted, model.generate(PROMPTS, 12))
    # 10 + 36 fit the model's 48 positions, not with 4 drafts; 10 + 45 slide its window; 10 + 34 + 4 fit.
    for new_tokens in (36, 45):
        with pytest.warns(UserWarning, match=r"do not fit the model's context \(48 positions\)"):
            drafted = model.generate(PROMPTS, new_tokens, draft_model=models["draft"])
        np.testing.assert_array_equal(drafted, model.generate(PROMPTS, new_tokens))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drafted = model.generate(PROMPTS, 34, draft_model=models["draft"])
    np.testing.assert_array_equal(drafted, model.generate(PROMPTS, 34))


@pytest.mark.parametrize(
    "target, options, expected",
    [
        (None, {"draft_model": GPT2LM(**dict(TINY, vocabulary_size=24))}, "vocabulary \\(23 ids\\).*of 24 ids"),
        (None, {"num_draft_tokens": 3}, "`num_draft_tokens` sets speculative decoding.*draft_model=None"),
        (None, {"draft": True, "prompt_lookup_num_tokens": 2}, "not both"),
        (None, {"draft": True, "num_draft_tokens": 0}, "num_draft_tokens"),
        (None, {"draft": True, "beam_size": 2}, "one hypothesis per prompt"),
        (None, {"draft_model": GPT2LM(**dict(TINY, local_window=3))}, "draft_model whose caches.*GPT2LM"),
        (lambda: EarlyExitLM(GPT2LM(**TINY)), {"draft": True}, "early exits; self-speculation: model.backbone"),
    ],
    ids=["vocabulary", "no_draft", "both", "zero", "beams", "ring_draft", "early_exit_target"],
)
def test_what_it_cannot_draft_for_is_refused_in_one_line(models, target, options, expected):
    options = dict(options)
    if options.pop("draft", False):
        options["draft_model"] = models["draft"]
    model = models["gpt2"] if target is None else target()
    with pytest.raises(ValueError, match=expected) as error:
        model.generate(PROMPTS, 8, **options)
    assert "\n" not in str(error.value)
