"""GPT2LM with local (sliding-window) layers: GPT-3's alternating dense and banded layers."""

import keras
import numpy as np
import pytest

from keras_tfam.layers.attention.patterns import SlidingWindow
from keras_tfam.models import GPT2LM

rng = np.random.default_rng(0)
W = 5
TINY = dict(vocabulary_size=61, num_layers=2, num_heads=4, hidden_dim=32, max_sequence_length=64, local_window=W)


def tiny(**overrides):
    keras.utils.set_random_seed(1)
    return GPT2LM(**{**TINY, **overrides})


def patterns(model):
    return [block.self_attention_layer.pattern for block in model.transformer_blocks]


def test_which_layers_are_local():
    assert patterns(tiny()) == [None, SlidingWindow(W)]
    assert patterns(tiny(num_layers=3, local_layers="even")) == [SlidingWindow(W), None, SlidingWindow(W)]
    assert patterns(tiny(local_layers="all")) == [SlidingWindow(W)] * 2
    assert patterns(tiny(local_layers=[0])) == [SlidingWindow(W), None]
    assert patterns(tiny(local_window=None)) == [None, None]
    assert {"local_window", "local_layers"} <= set(GPT2LM.OPTIONS)


def test_a_local_layer_sees_only_its_window():
    # One local layer: the logits at i do not depend on tokens at i - W or before.
    model = tiny(num_layers=1, local_layers="all", position="none")
    tokens = rng.integers(0, 61, size=(1, 20))
    changed = tokens.copy()
    changed[0, 3] = (changed[0, 3] + 1) % 61
    difference = np.abs(np.asarray(model(tokens)) - np.asarray(model(changed)))[0].max(-1)
    assert np.all(difference[3 : 3 + W] > 0) and np.all(difference[3 + W :] == 0)


@pytest.mark.parametrize(
    "options",
    [{}, {"position": "rotary", "num_key_value_heads": 2}, {"position": "alibi"}],
    ids=["learned", "rotary", "alibi"],
)
def test_ring_and_full_caches_token_by_token_equal_the_full_pass(options):
    model = tiny(**options)
    length = 3 * W + 5
    tokens = rng.integers(0, 61, size=(2, length)).astype("int32")
    full = np.asarray(model(tokens))
    caches = model.init_cache(2, length)
    assert [tuple(c.shape)[2] for c in caches] == [length, W]  # a full cache, a ring of W slots
    logits = []
    for index in range(length):
        step, caches, _ = model.call_with_cache(tokens[:, index : index + 1], caches, index)
        logits.append(np.asarray(step))
    np.testing.assert_allclose(np.concatenate(logits, axis=1), full, atol=1e-4)


def test_greedy_generation_equals_the_argmax_of_the_full_pass():
    # 3w new tokens through the compiled loop: the local layer's ring wraps three times.
    model = tiny(position="rotary")
    prompts = [[5, 8, 11], [40, 43, 46, 49, 52, 55, 58]]
    generated = model.generate(prompts, max_new_tokens=3 * W)
    logits = np.asarray(model(generated))
    for row, prompt in enumerate(prompts):
        positions = np.arange(len(prompt), len(prompt) + 3 * W)
        chosen = logits[row, positions - 1, generated[row, positions]]
        np.testing.assert_allclose(chosen, logits[row, positions - 1].max(axis=-1), atol=1e-5)


def test_keras_save_load(tmp_path):
    model = tiny(local_layers=[1])
    tokens = rng.integers(0, 61, size=(2, 12))
    path = str(tmp_path / "local.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert patterns(loaded) == patterns(model)
    np.testing.assert_allclose(loaded(tokens), model(tokens), atol=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: local_window=0"):
        tiny(local_window=0)
    with pytest.raises(ValueError, match="Received: local_layers='middle'"):
        tiny(local_layers="middle")
    with pytest.raises(ValueError, match=r"Received: local_layers=\[2\]"):
        tiny(local_layers=[2])
    with pytest.raises(ValueError, match="cannot set what the model sets itself: \\['pattern'\\]"):
        tiny(attention_options={"pattern": {"name": "strided", "stride": 4}})
    model = tiny()
    with pytest.raises(ValueError, match="`cache` must hold one cache per block \\(2\\).*with 1 entries"):
        model.call_with_cache(np.zeros((1, 1), "int32"), model.init_cache(1, 8)[:1], 0)
