"""Random features of the softmax kernel: the statistics the Performer paper claims."""

import keras
import numpy as np
import pytest
from harness import LayerHarness

from keras_tfam.layers.attention.feature_maps import (
    EluFeatureMap,
    PositiveRandomFeatures,
    TrigonometricRandomFeatures,
)
from keras_tfam.layers.attention.performer_attention import PerformerAttention
from keras_tfam.layers.attention.seeded_draws import gaussian_matrix

rng = np.random.default_rng(0)
H = 16  # head size
M = 16  # features per estimator
DRAWS = 2000  # independent estimators


class TestPositiveRandomFeaturesHarness(LayerHarness):
    layer_cls = PositiveRandomFeatures
    init_kwargs = {"num_features": 12, "seed": 1, "redraw": 1}

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 5, 2, 4)).astype("float32")}


class TestTrigonometricRandomFeaturesHarness(LayerHarness):
    layer_cls = TrigonometricRandomFeatures
    init_kwargs = {"num_features": 6, "normalize": True, "seed": 2}

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 5, 2, 4)).astype("float32")}


class TestEluFeatureMapHarness(LayerHarness):
    layer_cls = EluFeatureMap

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 5, 2, 4)).astype("float32")}


def _pair(norm, cosine, seed=0):
    """Two vectors of `H` dims whose `H^(-1/4)`-scaled versions have length `norm` and this cosine."""
    directions = np.random.default_rng(seed)
    u = directions.normal(size=H)
    u /= np.linalg.norm(u)
    w = directions.normal(size=H)
    w -= (w @ u) * u
    w /= np.linalg.norm(w)
    scale = norm * H**0.25
    return scale * u, scale * (cosine * u + np.sqrt(1 - cosine**2) * w)


def _estimates(feature_cls, pairs, orthogonal):
    """`(len(pairs), DRAWS)` independent estimates of `exp(q . k / sqrt(H))`, `M` features each.

    One layer with `DRAWS * M` features: consecutive groups of `M = H` rows
    are separate orthogonal blocks, drawn independently, so each group is
    one draw of an `M`-feature estimator. Key features (unstabilised) for both sides.
    """
    x = np.array([[q for q, _ in pairs] + [k for _, k in pairs]], "float32")[:, :, None, :]  # (1, 2P, 1, H)
    features = np.asarray(feature_cls(DRAWS * M, orthogonal=orthogonal, seed=3)(x), np.float64)[0, :, 0]
    n = len(pairs)
    products = features[:n] * features[n:] * DRAWS  # each feature's term, scaled to an M-feature estimator
    if feature_cls is TrigonometricRandomFeatures:  # [sin | cos] halves: one frequency = sin.sin + cos.cos
        products = products[:, : DRAWS * M] + products[:, DRAWS * M :]
    return products.reshape(n, DRAWS, M).sum(-1)


def _softmax_kernel(pairs):
    return np.array([np.exp(q @ k / np.sqrt(H)) for q, k in pairs])


@pytest.mark.parametrize("feature_cls", [PositiveRandomFeatures, TrigonometricRandomFeatures])
@pytest.mark.parametrize("orthogonal", [True, False])
def test_estimator_of_the_softmax_kernel_is_unbiased(feature_cls, orthogonal):
    pairs = [_pair(1.0, cosine, seed) for seed, cosine in enumerate((0.6, 0.0, -0.6))]
    estimates = _estimates(feature_cls, pairs, orthogonal)
    standard_error = estimates.std(axis=1) / np.sqrt(DRAWS)
    z = (estimates.mean(axis=1) - _softmax_kernel(pairs)) / standard_error
    assert np.all(np.abs(z) < 3), z


@pytest.mark.parametrize("feature_cls", [PositiveRandomFeatures, TrigonometricRandomFeatures])
def test_orthogonal_features_have_lower_error_than_iid(feature_cls):
    # Short vectors: the positive estimator's error has a heavy tail where q . k > 0.
    pairs = [_pair(0.7, cosine, seed) for seed, cosine in enumerate((0.6, 0.0, -0.6))]
    target = _softmax_kernel(pairs)[:, None]
    errors = {o: ((_estimates(feature_cls, pairs, o) - target) ** 2).mean(axis=1) for o in (True, False)}
    assert np.all(errors[True] < errors[False]), errors


def test_positive_features_beat_trigonometric_where_the_kernel_is_small():
    # |x| = |y| = 2, cos = -0.9: x . y = -3.6, exp(x . y) = 0.027.
    pair = _pair(2.0, -0.9)
    x, y = (v / H**0.25 for v in pair)
    kernel = np.exp(x @ y)
    # Choromanski et al. 2021, Lemma 2: MSEs of m = M iid features.
    mse_positive = np.exp(np.sum((x + y) ** 2)) * kernel**2 * (1 - np.exp(-np.sum((x + y) ** 2))) / M
    mse_trigonometric = np.exp(np.sum((x + y) ** 2)) / kernel**2 * (1 - np.exp(-np.sum((x - y) ** 2))) ** 2 / (2 * M)
    measured = {
        cls: np.mean((_estimates(cls, [pair], orthogonal=False)[0] - kernel) ** 2)
        for cls in (PositiveRandomFeatures, TrigonometricRandomFeatures)
    }
    np.testing.assert_allclose(measured[PositiveRandomFeatures], mse_positive, rtol=0.2)
    np.testing.assert_allclose(measured[TrigonometricRandomFeatures], mse_trigonometric, rtol=0.2)
    ratio = measured[TrigonometricRandomFeatures] / measured[PositiveRandomFeatures]
    # Measured: 1.68e6 (analytic 1.63e6): trigonometric features are useless here.
    assert ratio > 1e5
    np.testing.assert_allclose(ratio, mse_trigonometric / mse_positive, rtol=0.3)


def test_query_features_differ_by_a_constant_per_query():
    layer = PositiveRandomFeatures(32, seed=0)
    x = rng.normal(size=(2, 3, 2, 8)).astype("float32")
    ratio = np.asarray(layer(x)) / np.asarray(layer(x, query=True))
    np.testing.assert_allclose(ratio, np.broadcast_to(ratio[..., :1], ratio.shape), rtol=1e-5)


def test_orthogonal_draw_has_orthogonal_blocks_of_gaussian_norms():
    w = np.asarray(gaussian_matrix(40, 8, seed=5, orthogonal=True), np.float64)
    for block in (w[:8], w[8:16]):
        gram = block @ block.T
        np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0, atol=1e-4)
    assert not np.allclose(w[:8], w[8:16])  # blocks drawn independently
    np.testing.assert_array_equal(w, np.asarray(gaussian_matrix(40, 8, seed=5, orthogonal=True)))  # seeded


def test_redraw_policy_is_seeded_and_counts_training_calls_only():
    x = rng.normal(size=(1, 2, 1, 4)).astype("float32")
    a, b = PositiveRandomFeatures(8, redraw=2, seed=7), PositiveRandomFeatures(8, redraw=2, seed=7)
    a(x), b(x)
    first = np.asarray(a.projection.value)
    a.advance(training=False)
    a.advance(training=True)
    np.testing.assert_array_equal(a.projection.value, first)  # 1 training call: not due yet
    a.advance(training=True)
    second = np.asarray(a.projection.value)
    assert not np.allclose(second, first)  # redrawn at the 2nd
    for _ in range(2):
        b.advance(training=True)
    np.testing.assert_array_equal(b.projection.value, second)  # same seed, same stream
    assert float(a.steps.value) == 2.0


def test_redraws_inside_a_compiled_fit():
    attention = PerformerAttention(2, 4, num_features=8, redraw=1, seed=0)
    inputs = keras.Input((3, 8))
    model = keras.Model(inputs, attention(inputs, use_causal_mask=True))
    model.compile("sgd", "mse", jit_compile=True)
    layer = attention.phi
    before = np.asarray(layer.projection.value)
    x = rng.normal(size=(4, 3, 8)).astype("float32")
    model.fit(x, np.zeros((4, 3, 8), "float32"), batch_size=2, epochs=1, verbose=0)
    assert float(layer.steps.value) == 2.0  # one count per step
    after = np.asarray(layer.projection.value)
    assert not np.allclose(after, before)
    model.predict(x, verbose=0)  # inference: no redraw
    np.testing.assert_array_equal(layer.projection.value, after)


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: num_features=0"):
        PositiveRandomFeatures(0)
    with pytest.raises(ValueError, match="Received: num_features=-3"):
        TrigonometricRandomFeatures(-3)
    with pytest.raises(ValueError, match="Received: redraw=0"):
        PositiveRandomFeatures(4, redraw=0)
    with pytest.raises(ValueError, match="Received: seed=-1"):
        PositiveRandomFeatures(4, seed=-1)
