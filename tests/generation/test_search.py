"""Beam search inside the compiled loop against exhaustive search, greedy decoding and batch independence."""

import itertools

import keras
import numpy as np
import pytest
from backend import forward

from keras_tfam.generation import BeamSearch, Generator, Sampling
from keras_tfam.generation.decoding import decode, plan_decoding
from keras_tfam.models import GPT2LM

STOP = 1


def tiny(vocabulary_size=5, **options):
    keras.utils.set_random_seed(4)
    model = GPT2LM(vocabulary_size=vocabulary_size, num_layers=2, num_heads=2, hidden_dim=16, **options)
    # Sharper distributions than at initialisation, so rankings are decided by the model.
    model.token_embedding.embeddings.assign(model.token_embedding.embeddings * 60.0)
    return model


def log_probs(model, sequences):
    """Log-softmax (float64) of the full pass over each of `sequences`, all of one length, in one batch."""
    logits = forward(model, np.array(sequences, "int32")).astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def exhaustive(model, prompt, max_new_tokens, length_penalty):
    """The best continuation by `score / ((5 + length) / 6) ** alpha` over all of them."""
    best = None
    vocabulary = model.vocabulary_size
    for length in range(1, max_new_tokens + 1):
        continuations = [
            continuation
            for continuation in itertools.product(range(vocabulary), repeat=length)
            if STOP not in continuation[:-1] and (length == max_new_tokens or continuation[-1] == STOP)
        ]
        tables = log_probs(model, [list(prompt) + list(continuation[:-1]) for continuation in continuations])
        for table, continuation in zip(tables, continuations):
            score = sum(table[len(prompt) - 1 + i, token] for i, token in enumerate(continuation))
            ranked = score / ((5.0 + length) / 6.0) ** length_penalty
            if best is None or ranked > best[0]:
                best = (ranked, continuation)
    return best[1]


@pytest.mark.parametrize("beam_size, max_new_tokens, length_penalty", [(5, 2, 0.0), (25, 3, 0.0), (25, 3, 0.8)])
def test_beam_search_with_every_candidate_kept_is_exhaustive_search(beam_size, max_new_tokens, length_penalty):
    """`beam_size = V` keeps every candidate for 2 tokens; `V^2` for 3."""
    model = tiny()
    prompts = [[2, 3, 4], [4]]
    found = model.generate(
        prompts, max_new_tokens, beam_size=beam_size, length_penalty=length_penalty, stop_token_ids=[STOP]
    )
    for row, prompt in enumerate(prompts):
        best = exhaustive(model, prompt, max_new_tokens, length_penalty)
        generated = list(found[row, len(prompt) : len(prompt) + max_new_tokens])
        assert generated[: len(best)] == list(best)
        assert all(token == 0 for token in generated[len(best) :])


def test_one_beam_is_greedy_decoding():
    model = tiny(vocabulary_size=17)
    prompts = [[2, 3, 4, 5], [6, 7]]
    tokens = np.array([[2, 3, 4, 5, 0, 0, 0, 0, 0, 0], [6, 7, 0, 0, 0, 0, 0, 0, 0, 0]], "int32")
    lengths = np.array([4, 2], "int32")
    plan = plan_decoding(model, 10, 2)
    stop = np.zeros((0,), "int32")
    beam = decode(model, tokens, lengths, 6, BeamSearch(1), 0, stop, 0, plan)["token_ids"]
    greedy = decode(model, tokens, lengths, 6, Sampling("greedy"), 0, stop, 0, plan)["token_ids"]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(beam), keras.ops.convert_to_numpy(greedy))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(greedy)[0, :10], model.generate([prompts[0]], 6)[0])


def test_prompts_of_different_lengths_are_searched_independently():
    model = tiny(vocabulary_size=11)
    prompts = [[2, 3], [4, 5, 6, 7, 8], [9]]
    together = model.generate(prompts, 5, beam_size=3, length_penalty=0.6, stop_token_ids=[STOP])
    for row, prompt in enumerate(prompts):
        alone = model.generate([prompt], 5, beam_size=3, length_penalty=0.6, stop_token_ids=[STOP])
        np.testing.assert_array_equal(together[row, : len(prompt) + 5], alone[0])


def test_bad_search_arguments():
    model = tiny()
    with pytest.raises(ValueError, match="Received: beam_size=0"):
        model.generate([[2]], 3, beam_size=0)
    with pytest.raises(ValueError, match="takes no sampler"):
        model.generate([[2]], 3, beam_size=2, sampler="top_p")
    with pytest.raises(ValueError, match="Received: length_penalty=-1"):
        BeamSearch(2, -1)
    with pytest.raises(ValueError, match="subclass keras_tfam.generation.DecodingModel.*Received: model=Sequential"):
        Generator(keras.Sequential([keras.layers.Dense(3)]))
