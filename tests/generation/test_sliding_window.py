"""Generation past a model's context: ring caches and re-encoded windows against full computations."""

import keras
import numpy as np
import pytest
from backend import forward, jitted_on_jax

from keras_tfam.generation import windowed_logits
from keras_tfam.models import GPT2LM
from keras_tfam.ops import sliding_window_mask

WINDOW = 8
rng = np.random.default_rng(0)


def tiny(**options):
    keras.utils.set_random_seed(1)
    return GPT2LM(
        vocabulary_size=61,
        num_layers=2,
        num_heads=4,
        hidden_dim=32,
        max_sequence_length=64,
        context_length=WINDOW,
        **options,
    )


def masked_full_logits(model, tokens):
    """One pass over the whole sequence, each attention restricted to the last WINDOW positions by a dense mask."""

    @jitted_on_jax
    def logits(tokens):
        hidden = model.embed(tokens, 0)
        for block in model.transformer_blocks:
            if model.attention == "linear":  # no attention_mask argument: the layer's windowed form
                hidden = block(hidden, self_attention_window=WINDOW)
            else:
                hidden = block(hidden, decoder_attention_mask=sliding_window_mask(tokens.shape[1], window=WINDOW))
        return model.logits(model.final_norm(hidden))

    return keras.ops.convert_to_numpy(logits(tokens))


def cropped_logits(model, tokens):
    """nanoGPT's crop: position t predicted from the last WINDOW tokens, re-encoded from position 0.

    Every window in one batch: the first WINDOW positions are one causal pass over the first window.
    """
    batch, length = tokens.shape
    first = forward(model, tokens[:, :WINDOW])
    windows = np.stack([tokens[:, t + 1 - WINDOW : t + 1] for t in range(WINDOW, length)], axis=1)
    last = forward(model, windows.reshape(-1, WINDOW))[:, -1].reshape(batch, length - WINDOW, -1)
    return np.concatenate([first, last], axis=1)


def cropped_greedy(model, prompts, steps):
    """nanoGPT's generation past the context: each token the argmax of a pass over the last WINDOW tokens,
    re-encoded from position 0 (a shorter sequence right-padded to WINDOW: the causal pass ignores it)."""
    rows = [list(prompt) for prompt in prompts]
    for _ in range(steps):
        windows = np.zeros((len(rows), WINDOW), "int32")
        for i, row in enumerate(rows):
            windows[i, : min(len(row), WINDOW)] = row[-WINDOW:]
        logits = forward(model, windows)
        for i, row in enumerate(rows):
            row.append(int(logits[i, min(len(row), WINDOW) - 1].argmax()))
    return rows


RING_VARIANTS = [
    {"position": "rotary"},
    {"position": "alibi", "num_key_value_heads": 2},
    {"position": "relative"},
    {"position": "none"},
    {"attention": "linear", "position": "rotary"},
]
IDS = ["rotary", "alibi-gqa", "relative", "none", "linear"]


@pytest.mark.parametrize("options", RING_VARIANTS, ids=IDS)
def test_ring_cache_decoding_equals_the_windowed_full_pass(options):
    """Over 3 windows + 5 tokens: a prefill that wraps, the step where the length first equals the
    window, the first wrap, single steps after it."""
    model = tiny(**options)
    tokens = rng.integers(0, 61, size=(2, 3 * WINDOW + 5)).astype("int32")
    expected = masked_full_logits(model, tokens)
    cache = model.init_cache(2, tokens.shape[1], window=WINDOW)
    chunks = [(0, 3), (3, WINDOW), (WINDOW, WINDOW + 1)] + [(t, t + 1) for t in range(WINDOW + 1, 2 * WINDOW)]
    chunks += [(2 * WINDOW, 2 * WINDOW + 6), (2 * WINDOW + 6, tokens.shape[1])]
    step = jitted_on_jax(lambda tokens, cache, start: model.call_with_cache(tokens, cache, start, window=WINDOW))
    for start, stop in chunks:
        logits, cache, _ = step(tokens[:, start:stop], cache, start)
        np.testing.assert_allclose(logits, expected[:, start:stop], atol=2e-5, err_msg=f"positions {start}..{stop}")
    assert all(keras.ops.shape(layer)[2] == WINDOW for layer in cache if len(keras.ops.shape(layer)) == 5)


@pytest.mark.parametrize("options", RING_VARIANTS[:2], ids=IDS[:2])
def test_generation_past_the_context_follows_the_windowed_full_pass(options):
    model = tiny(**options)
    prompts = [[5, 8, 11], list(rng.integers(0, 61, size=11))]
    generated = model.generate(prompts, max_new_tokens=3 * WINDOW)
    full = masked_full_logits(model, generated)
    for row, prompt in enumerate(prompts):
        positions = np.arange(len(prompt), len(prompt) + 3 * WINDOW)
        positions = positions[positions < generated.shape[1]]
        chosen = full[row, positions - 1, generated[row, positions]]
        np.testing.assert_allclose(chosen, full[row, positions - 1].max(axis=-1), atol=1e-5)


def test_learned_positions_re_encode_the_window():
    model = tiny()
    prompts = [[5, 8, 11], list(rng.integers(0, 61, size=11))]
    generated = model.generate(prompts, max_new_tokens=3 * WINDOW)
    for row, tokens in enumerate(cropped_greedy(model, prompts, 3 * WINDOW)):
        np.testing.assert_array_equal(generated[row, : len(tokens)], tokens)
    # The teacher-forced scoring of the same rule.
    np.testing.assert_allclose(windowed_logits(model, generated), cropped_logits(model, generated), atol=2e-5)


def test_positions_past_the_context_are_never_used():
    model = tiny()
    prompts = [[5, 8, 11], list(rng.integers(0, 61, size=11))]
    before = model.generate(prompts, max_new_tokens=40, sampler="top_k", seed=3)
    table = model.position_embedding.position_embeddings
    table.assign(np.concatenate([table.numpy()[:WINDOW], np.full((64 - WINDOW, 32), 1e4, "float32")]))
    after = model.generate(prompts, max_new_tokens=40, sampler="top_k", seed=3)
    np.testing.assert_array_equal(before, after)


def test_a_smaller_window_and_overflow_errors():
    model = tiny(position="rotary")
    assert model.max_length == WINDOW and model.sliding_window_cache
    generated = model.generate([[1, 2, 3]], 20, window=4)
    full = windowed_logits(model, generated, window=4)
    np.testing.assert_array_equal(generated[0, 3:], full[0, 2:-1].argmax(-1))
    with pytest.raises(ValueError, match=r"3 \+ max_new_tokens 20 = 23 exceeds the model's context of 8 positions"):
        model.generate([[1, 2, 3]], 20, overflow="error")
    with pytest.raises(ValueError, match="Received: window=9"):
        model.generate([[1, 2, 3]], 20, window=9)
    with pytest.raises(ValueError, match="Received: window=0"):
        model.generate([[1, 2, 3]], 20, window=0)
    with pytest.raises(ValueError, match=r"Received: batch_size=0"):
        windowed_logits(model, generated, window=4, batch_size=0)
