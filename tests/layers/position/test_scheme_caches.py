"""Schemes that read the heads or the weights, over KV caches: cached decoding sees the full pass's positions."""

import numpy as np
import pytest

from keras_tfam.layers import (
    AdaptiveSpan,
    ComposedPosition,
    MultiHeadAttention,
    ShawRelativePosition,
    TransformerXLPosition,
)

rng = np.random.default_rng(0)

SCHEMES = {
    "shaw": lambda: ShawRelativePosition(2, embeddings_initializer="random_normal"),
    "transformer_xl": lambda: TransformerXLPosition(2, bias_initializer="random_normal"),
    "xl+span": lambda: ComposedPosition(
        [
            TransformerXLPosition(2, bias_initializer="random_normal"),
            AdaptiveSpan(2, max_span=4, ramp=2, initial_span=2),
        ]
    ),
}


@pytest.mark.parametrize("window", [None, 4], ids=["full-cache", "ring-cache"])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_token_by_token_decoding_equals_the_full_pass(scheme, window):
    # A prefill of 3, then one token at a time; with a window the cache is a ring
    # of 4 slots holding positions out of order (gathered distances, clipping, spans).
    x = rng.normal(size=(2, 9, 8)).astype("float32")
    layer = MultiHeadAttention(2, 4, position=SCHEMES[scheme]())
    full = np.asarray(layer(x, use_causal_mask=True, window=window))
    cache = layer.init_cache(2, 9, window=window)
    out, cache = layer(x[:, :3], cache=cache, cache_update_index=0, use_causal_mask=True, window=window)
    steps = [np.asarray(out)]
    for t in range(3, 9):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t, use_causal_mask=True, window=window)
        steps.append(np.asarray(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


@pytest.mark.parametrize("position", ["shaw", "transformer_xl"])
def test_gpt2_with_the_scheme_generates_its_greedy_continuation(position):
    from keras_tfam.models import GPT2LM

    model = GPT2LM(vocabulary_size=31, num_layers=2, num_heads=2, hidden_dim=16, position=position)
    prompt = [3, 1, 4, 1, 5]
    generated = model.generate([prompt], max_new_tokens=6, jit_compile=False)[0]
    tokens = list(prompt)
    for _ in range(6):
        tokens.append(int(np.argmax(np.asarray(model(np.array([tokens], "int32")))[0, -1])))
    assert list(generated) == tokens
