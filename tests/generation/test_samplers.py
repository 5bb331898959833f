"""Samplers against their definitions: the hash, Gumbel-max sampling frequencies, the filters."""

import keras
import numpy as np
import pytest

from keras_tfam.generation import GreedySampler, RandomSampler, TensorSampler, TopKSampler, TopPSampler, get_sampler
from keras_tfam.generation.generator import compile_function
from keras_tfam.generation.samplers import first_argmax, mix, step_key, top_p_filter, uniform_noise

rng = np.random.default_rng(0)


def lowbias32(x):
    """Wellons' lowbias32 on Python ints (uint32 arithmetic), as signed int32."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    x ^= x >> 16
    return x - (1 << 32) if x >= 1 << 31 else x


def test_hash_is_lowbias32():
    values = np.concatenate([[0, 1, -1, 2**31 - 1, -(2**31)], rng.integers(-(2**31), 2**31, 200)]).astype("int32")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(mix(values)), [lowbias32(int(v)) for v in values])


def test_noise_is_uniform_and_a_function_of_the_key():
    noise = keras.ops.convert_to_numpy(uniform_noise(step_key(7, 3), 400, 500)).ravel()
    assert noise.min() > 0 and noise.max() < 1
    # Kolmogorov-Smirnov distance to U(0, 1): ~0.0019 expected for 200k draws.
    ks = np.max(np.abs(np.sort(noise) - (np.arange(noise.size) + 0.5) / noise.size))
    assert ks < 0.006
    same = keras.ops.convert_to_numpy(uniform_noise(step_key(7, 3), 400, 500)).ravel()
    other = keras.ops.convert_to_numpy(uniform_noise(step_key(7, 4), 400, 500)).ravel()
    np.testing.assert_array_equal(noise, same)
    assert abs(np.corrcoef(noise, other)[0, 1]) < 0.01


def _frequencies(sampler, logits, draws=20000, key=11):
    tokens = keras.ops.convert_to_numpy(sampler(np.repeat(logits[None], draws, axis=0), step_key(key, 0)))
    return np.bincount(tokens, minlength=logits.size) / draws


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_random_sampling_draws_from_the_softmax(temperature):
    logits = np.array([2.0, 1.0, 0.5, -1.0, 0.0], "float32")
    expected = _softmax(logits / temperature)
    frequencies = _frequencies(RandomSampler(temperature), logits)
    # Within 4 standard errors of a frequency from 20000 draws.
    standard_errors = np.sqrt(expected * (1 - expected) / 20000)
    assert np.all(np.abs(frequencies - expected) <= 4 * standard_errors + 1e-4), (frequencies, expected)


def test_top_k_samples_the_renormalised_top_k():
    logits = np.array([2.0, 1.0, 0.5, -1.0, 0.0], "float32")
    expected = np.where(logits >= 0.5, _softmax(logits), 0.0)
    expected /= expected.sum()
    np.testing.assert_allclose(_frequencies(TopKSampler(3), logits), expected, atol=0.012)


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = rng.normal(size=(6, 9)).astype("float32")
    for p in (0.3, 0.75, 0.95, 1.0):
        filtered = keras.ops.convert_to_numpy(top_p_filter(logits, p))
        for row, out in zip(logits, filtered):
            probabilities = _softmax(row)
            order = np.argsort(-probabilities)
            mass_before = np.cumsum(probabilities[order]) - probabilities[order]
            kept = set(order[mass_before < p])
            assert set(np.flatnonzero(np.isfinite(out))) == kept
            np.testing.assert_allclose(out[list(kept)], row[list(kept)])


def test_greedy_takes_the_first_maximum():
    logits = np.array([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 5.0, 0.0]], "float32")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(GreedySampler()(logits, 0)), [1, 0])


def test_first_argmax_is_numpy_s_argmax():
    # Many ties (values from a few levels), rows of one repeated value, of -inf, and with NaNs (NumPy: the first).
    logits = rng.integers(-3, 3, size=(64, 50)).astype("float32")
    logits[1] = 2.0
    logits[2] = -np.inf
    logits[3, [7, 30]] = np.nan
    logits[4, 0], logits[4, 1:] = -np.inf, np.nan
    logits[5, 49] = np.inf
    expected = np.argmax(logits, axis=-1)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(first_argmax(logits)), expected)
    compiled = compile_function(first_argmax, None)  # XLA on TensorFlow and JAX, as in a decoding loop
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(compiled(logits)), expected)
    large = rng.normal(size=(3, 50257)).astype("float32")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(compiled(large)), np.argmax(large, axis=-1))


def test_tensor_sampler_settings_match_the_named_samplers():
    logits = rng.normal(size=(64, 30)).astype("float32")
    key = step_key(5, 2)
    run = lambda sampler: keras.ops.convert_to_numpy(sampler(logits, key))  # noqa: E731
    np.testing.assert_array_equal(run(TensorSampler(0.0, 0, 1.0)), run(GreedySampler()))
    np.testing.assert_array_equal(run(TensorSampler(0.7, 0, 1.0)), run(RandomSampler(0.7)))
    np.testing.assert_array_equal(run(TensorSampler(1.0, 5, 1.0)), run(TopKSampler(5)))
    np.testing.assert_array_equal(run(TensorSampler(1.3, 0, 0.8)), run(TopPSampler(0.8, 1.3)))


def test_bad_sampler_arguments():
    with pytest.raises(ValueError, match="Received: sampler='nucleus'"):
        get_sampler("nucleus")
    with pytest.raises(ValueError, match="Received: temperature=0"):
        RandomSampler(0)
    with pytest.raises(ValueError, match="Received: p=1.5"):
        TopPSampler(1.5)
    with pytest.raises(ValueError, match="Received: k=0"):
        TopKSampler(0)
