import numpy as np
import pytest
from harness import LayerHarness
from reference import rotary

from keras_tfam.layers import RotaryEmbedding
from keras_tfam.layers.position.rope_scaling import inverse_frequencies

rng = np.random.default_rng(0)


class TestRotaryHarness(LayerHarness):
    layer_cls = RotaryEmbedding
    mixed_precision_tolerance = 5e-3

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 6, 3, 8)).astype("float32")}


def test_matches_paper_rotation():
    x = rng.normal(size=(2, 5, 3, 8)).astype("float32")
    np.testing.assert_allclose(RotaryEmbedding()(x), rotary(x, range(5)), atol=1e-5)
    np.testing.assert_allclose(RotaryEmbedding()(x, start_index=7), rotary(x, range(7, 12)), atol=1e-5)


def test_half_pairing_is_a_permutation_of_interleaved():
    x = rng.normal(size=(1, 5, 2, 8)).astype("float32")
    # Interleave the halves: feature i pairs with i + d/2 in "half" layout.
    order = np.stack([np.arange(4), np.arange(4) + 4], axis=-1).reshape(-1)
    half = np.asarray(RotaryEmbedding(pairing="half")(x))
    interleaved = np.asarray(RotaryEmbedding()(x[..., order]))
    np.testing.assert_allclose(half[..., order], interleaved, atol=1e-6)


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_dot_product_depends_only_on_relative_position(pairing):
    rope = RotaryEmbedding(pairing=pairing)
    q = rng.normal(size=(1, 1, 1, 16)).astype("float32")
    k = rng.normal(size=(1, 1, 1, 16)).astype("float32")

    def score(m, n):
        return float(np.sum(np.asarray(rope(q, start_index=m)) * np.asarray(rope(k, start_index=n))))

    for m, n in [(0, 3), (5, 8), (40, 43)]:
        np.testing.assert_allclose(score(m, n), score(0, 3), rtol=1e-4)
    assert abs(score(0, 3) - score(0, 4)) > 1e-3


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: pairing='neox'"):
        RotaryEmbedding(pairing="neox")
    with pytest.raises(ValueError, match="even head_dim"):
        RotaryEmbedding()(np.zeros((1, 2, 1, 5), "float32"))


def _half_rotation(x, positions, frequencies, factor=1.0):
    """Hugging Face's rotate-half form, in NumPy: `x * cos + rotate_half(x) * sin` with `cat(f, f)` angles."""
    angles = positions[:, None] * frequencies[None, :]
    cos = np.cos(np.concatenate([angles, angles], -1))[None, :, None, :] * factor
    sin = np.sin(np.concatenate([angles, angles], -1))[None, :, None, :] * factor
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def test_dynamic_ntk_scaling_keeps_the_frequencies_within_the_context_and_raises_the_base_past_it():
    dim, theta, factor, context = 16, 10000.0, 2.0, 8
    rope = RotaryEmbedding(
        theta,
        pairing="half",
        scaling={"type": "dynamic", "factor": factor, "original_max_position_embeddings": context},
    )
    x = np.random.default_rng(0).normal(size=(1, 12, 2, dim)).astype("float32")
    plain = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    np.testing.assert_allclose(
        rope(x[:, :context]), _half_rotation(x[:, :context], np.arange(context), plain), atol=1e-5
    )
    # 12 positions: base * (factor * 12 / 8 - (factor - 1)) ** (d / (d - 2)) (bloc97 / emozilla).
    base = theta * (factor * 12 / context - (factor - 1)) ** (dim / (dim - 2))
    scaled = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    np.testing.assert_allclose(rope(x), _half_rotation(x, np.arange(12), scaled), atol=1e-5)


def test_yarn_scales_cos_and_sin_by_its_attention_factor():
    dim = 16
    scaling = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    rope = RotaryEmbedding(1e6, pairing="half", scaling=scaling)
    x = np.random.default_rng(1).normal(size=(1, 5, 1, dim)).astype("float32")
    frequencies, factor = inverse_frequencies(1e6, dim, scaling)
    assert factor == pytest.approx(0.1 * np.log(4.0) + 1.0)
    # Ramp: the fastest pairs keep their frequency (extrapolate), the slowest are divided by the factor.
    plain = 1.0 / 1e6 ** (np.arange(0, dim, 2) / dim)
    assert frequencies[0] == pytest.approx(plain[0]) and frequencies[-1] == pytest.approx(plain[-1] / 4.0)
    np.testing.assert_allclose(rope(x), _half_rotation(x, np.arange(5), frequencies, factor), atol=1e-5)
    assert RotaryEmbedding.from_config(rope.get_config()).scaling == scaling


@pytest.mark.parametrize(
    "scaling, message",
    [
        ({"type": "longrope", "factor": 2.0}, r"supported types are \('linear', 'dynamic', 'llama3', 'yarn'\)"),
        ({"type": "llama3", "factor": 8.0}, r"needs \['low_freq_factor', 'high_freq_factor', 'original_max"),
        ({"type": "linear", "factor": -1.0}, r"`factor` must be a positive number\. Received: factor=-1\.0"),
        ({"type": "linear", "factor": 2.0, "beta": 1}, r"unknown key\(s\) \['beta'\]"),
    ],
)
def test_bad_rope_scalings_are_named(scaling, message):
    with pytest.raises(ValueError, match=message):
        RotaryEmbedding(scaling=scaling)
