import math

import keras
import numpy as np
import pytest
from gradients import gradient
from harness import LayerHarness
from reference_memory import span_mask as reference_span_mask

from keras_tfam.layers import AdaptiveSpan, ComposedPosition, MultiHeadAttention, TransformerXLPosition, span_mask

rng = np.random.default_rng(0)


def _heads(t=6, s=6, heads=2):
    return [rng.normal(size=(2, n, heads, 4)).astype("float32") for n in (t, s, s)]


class TestAdaptiveSpanHarness(LayerHarness):
    layer_cls = AdaptiveSpan
    # Distances 0..5, spans of 2 tokens, a ramp of 2: distance 3 lies inside the ramp.
    init_kwargs = {"num_heads": 2, "max_span": 4, "ramp": 2, "initial_span": 2}

    def make_inputs(self):
        query, key, value = _heads()
        return {"query": query, "key": key, "value": value, "attention_mask": np.tril(np.ones((2, 6, 6), bool))}


class TestComposedPositionHarness(LayerHarness):
    layer_cls = ComposedPosition

    @property
    def init_kwargs(self):
        return {
            "schemes": [
                TransformerXLPosition(2, bias_initializer="random_normal"),
                AdaptiveSpan(2, max_span=4, ramp=2, initial_span=2),
            ]
        }

    def make_inputs(self):
        query, key, value = _heads()
        return {"query": query, "key": key, "value": value, "attention_mask": np.tril(np.ones((2, 6, 6), bool))}


def test_mask_is_the_papers_ramp():
    distances = np.arange(12)[None, :] - np.zeros((1, 1))
    spans = np.array([0.0, 2.5, 7.0], "float32")
    np.testing.assert_allclose(
        span_mask(distances, spans, 4), [reference_span_mask(distances, z, 4) for z in spans], atol=1e-6
    )


def test_attention_is_the_renormalised_masked_softmax():
    # Sukhbaatar et al. eq. 2: a_ij = m(i - j) exp(s_ij) / sum_k m(i - k) exp(s_ik).
    q, k, v = _heads(t=7, s=7, heads=3)
    layer = AdaptiveSpan(3, max_span=8, ramp=2)
    layer.build()
    layer.span_fractions.assign(np.array([0.1, 0.3, 1.0], "float32"))
    causal = np.tril(np.ones((2, 7, 7), bool))
    out = np.asarray(layer(q, k, v, attention_mask=causal))
    scores = np.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(4)
    distance = np.arange(7)[:, None] - np.arange(7)[None, :]
    mask = np.stack([reference_span_mask(distance, z, 2) for z in (0.8, 2.4, 8.0)])[None] * causal[:, None]
    weights = mask * np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(out, np.einsum("bnts,bsnh->btnh", weights, v), atol=1e-5)


def test_spans_covering_the_sequence_equal_unmasked_attention():
    x = rng.normal(size=(2, 8, 8)).astype("float32")
    xl = TransformerXLPosition(2, bias_initializer="random_normal")
    spanned = MultiHeadAttention(2, 4, position=ComposedPosition([xl, AdaptiveSpan(2, max_span=16, initial_span=7)]))
    out = spanned(x, use_causal_mask=True)
    plain = MultiHeadAttention(2, 4, position=TransformerXLPosition(2))
    plain(x)
    pairs = [(plain.position, xl)] + [
        (getattr(plain, name), getattr(spanned, name))
        for name in ("query_dense", "key_dense", "value_dense", "output_dense")
    ]
    for target, source in pairs:
        target.set_weights(source.get_weights())
    np.testing.assert_allclose(out, plain(x, use_causal_mask=True), atol=1e-5)
    # And with memory: spans >= memory + segment change nothing either.
    memory = rng.normal(size=(2, 5, 8)).astype("float32")
    spanned.position.schemes[1].span_fractions.assign(np.full((2,), 12 / 16, "float32"))
    np.testing.assert_allclose(
        spanned(x, memory=memory, use_causal_mask=True), plain(x, memory=memory, use_causal_mask=True), atol=1e-5
    )


def test_span_gradient_is_non_zero_only_inside_the_ramp():
    # d m_z(x) / dz = 1 / R inside the ramp z < x < z + R, else 0 (no distance on its ends).
    spans = keras.Variable(np.array([3.5], "float32"))
    distances = np.arange(10)
    for x in distances:
        grad = gradient(lambda: keras.ops.sum(span_mask(np.array([[x]]), spans.value, 4)), spans)[0]
        expected = 0.25 if 3.5 < x < 7.5 else 0.0
        assert grad == pytest.approx(expected, abs=1e-7), x
    # Through attention: a head whose ramp holds no key (span >= the distances)
    # gets no gradient; a head whose ramp holds keys does.
    q, k, v = _heads(t=6, s=6)
    layer = AdaptiveSpan(2, max_span=8, ramp=2)
    layer.build()
    layer.span_fractions.assign(np.array([6 / 8, 2 / 8], "float32"))
    causal = np.tril(np.ones((2, 6, 6), bool))
    grad = gradient(lambda: keras.ops.sum(layer(q, k, v, attention_mask=causal) ** 2), layer.span_fractions)
    assert grad[0] == 0.0 and abs(grad[1]) > 1e-4


def test_l1_penalty_is_added_once_per_call():
    # 128 causal positions run in 4 query blocks: the penalty still counts once.
    span = AdaptiveSpan(2, max_span=64, initial_span=16, span_penalty=1e-2)
    layer = MultiHeadAttention(2, 4, position=ComposedPosition([TransformerXLPosition(2), span]))
    x = rng.normal(size=(1, 128, 8)).astype("float32")
    layer(x, use_causal_mask=True)
    assert len(layer.losses) == 1
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.losses[0]), 1e-2 * 32.0, rtol=1e-6)
    layer(x, use_causal_mask=True)
    assert len(layer.losses) == 1


def test_spans_train_and_stay_in_range():
    # Attention that must reach 5 tokens back: spans of 2 (ramp to 6) grow.
    inputs = keras.Input((12, 8))
    position = ComposedPosition([TransformerXLPosition(2), AdaptiveSpan(2, max_span=8, ramp=4, initial_span=2)])
    attention = MultiHeadAttention(2, 4, position=position)
    model = keras.Model(inputs, attention(inputs, use_causal_mask=True))
    x = rng.normal(size=(64, 12, 8)).astype("float32")
    y = np.zeros_like(x)
    y[:, 5:] = x[:, :-5]
    model.compile(keras.optimizers.Adam(0.05), "mse")
    model.fit(x, y, batch_size=16, epochs=8, verbose=0)
    spans = keras.ops.convert_to_numpy(position.schemes[1].spans())
    assert np.all(spans >= 0) and np.all(spans <= 8)
    assert spans.max() > 3.0


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: initial_span=-1"):
        AdaptiveSpan(2, max_span=8, initial_span=-1)
    with pytest.raises(ValueError, match="Received: initial_span=9"):
        AdaptiveSpan(2, max_span=8, initial_span=9)
    with pytest.raises(ValueError, match="Received: max_span=-8"):
        AdaptiveSpan(2, max_span=-8)
    with pytest.raises(ValueError, match="Received: ramp=0"):
        AdaptiveSpan(2, max_span=8, ramp=0)
    with pytest.raises(ValueError, match="Received: span_penalty=-0.1"):
        AdaptiveSpan(2, max_span=8, span_penalty=-0.1)
    with pytest.raises(ValueError, match="different numbers of heads"):
        ComposedPosition([TransformerXLPosition(2), AdaptiveSpan(4, max_span=8)])
