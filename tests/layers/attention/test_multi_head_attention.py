import keras
import numpy as np
import pytest
from backend import compiled
from harness import LayerHarness
from reference import attention, dense, multi_head_attention, rotary

from keras_tfam.layers import (
    ALiBiBias,
    MultiHeadAttention,
    RelativePositionBias,
    RotaryEmbedding,
    alibi_slopes,
)

rng = np.random.default_rng(0)


class TestSelfAttentionHarness(LayerHarness):
    layer_cls = MultiHeadAttention
    init_kwargs = {"num_heads": 4, "key_dim": 4, "num_key_value_heads": 2, "position": RotaryEmbedding()}
    call_kwargs = {"use_causal_mask": True}

    def make_inputs(self):
        return {"query": rng.normal(size=(2, 6, 16)).astype("float32")}


class TestCrossAttentionHarness(LayerHarness):
    layer_cls = MultiHeadAttention
    init_kwargs = {
        "num_heads": 2,
        "key_dim": 8,
        "value_dim": 4,
        "output_dim": 12,
        "position": RelativePositionBias(2, embeddings_initializer="random_normal"),
    }

    def make_inputs(self):
        return {
            "query": rng.normal(size=(2, 3, 16)).astype("float32"),
            "value": rng.normal(size=(2, 7, 10)).astype("float32"),
            "value_mask": np.array([[1] * 7, [1] * 4 + [0] * 3], bool),
        }


def as_float32(tensor):
    return keras.ops.convert_to_numpy(keras.ops.cast(tensor, "float32"))


def _weights(layer):
    return [np.asarray(w, np.float64) for w in layer.get_weights()]


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_self_attention_matches_numpy_with_masks(num_kv_heads):
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    padding = np.array([[1] * 6, [1] * 4 + [0] * 2], bool)
    layer = MultiHeadAttention(4, 4, num_key_value_heads=num_kv_heads, bias_initializer="random_normal")
    out = layer(x, query_mask=padding, value_mask=padding, use_causal_mask=True)
    mask = np.tril(np.ones((6, 6), bool))[None] & padding[:, None, :] & padding[:, :, None]
    expected = multi_head_attention(x, x, _weights(layer), 4, num_kv_heads, mask)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    # Padded query rows see no key: only the output projection's bias remains.
    np.testing.assert_allclose(np.asarray(out)[1, 4:], np.broadcast_to(_weights(layer)[-1], (2, 16)), atol=1e-6)


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_long_causal_self_attention_in_query_blocks_matches_numpy(num_kv_heads):
    # From 128 positions on, causal self-attention runs in 4 query blocks (here
    # uneven: 130 positions), with padding, an explicit mask and ALiBi sliced per block.
    length = 130
    x = rng.normal(size=(2, length, 16)).astype("float32")
    padding = np.ones((2, length), bool)
    padding[1, 100:] = False
    extra = rng.random((2, length, length)) > 0.2
    layer = MultiHeadAttention(4, 4, num_key_value_heads=num_kv_heads, position=ALiBiBias(4))
    out = layer(x, query_mask=padding, value_mask=padding, attention_mask=extra, use_causal_mask=True)
    mask = np.tril(np.ones((length, length), bool))[None] & padding[:, None, :] & padding[:, :, None] & extra
    i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    bias = (-alibi_slopes(4)[:, None, None] * np.abs(i - j))[None]
    expected = multi_head_attention(x, x, _weights(layer), 4, num_kv_heads, mask, bias)
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_cross_attention_different_lengths():
    q = rng.normal(size=(2, 3, 16)).astype("float32")
    src = rng.normal(size=(2, 9, 10)).astype("float32")
    mask = rng.random((2, 3, 9)) > 0.4
    layer = MultiHeadAttention(2, 8)
    out = layer(q, src, attention_mask=mask)
    assert out.shape == (2, 3, 16)
    np.testing.assert_allclose(out, multi_head_attention(q, src, _weights(layer), 2, 2, mask), atol=1e-5)


def test_separate_key_input():
    q = rng.normal(size=(1, 3, 8)).astype("float32")
    k = rng.normal(size=(1, 5, 6)).astype("float32")
    v = rng.normal(size=(1, 5, 7)).astype("float32")
    layer = MultiHeadAttention(2, 4)
    out = layer(q, v, key=k)
    wq, bq, wk, bk, wv, bv, wo, bo = _weights(layer)
    heads = lambda a: a.reshape(1, a.shape[1], 2, -1)  # noqa: E731
    o, _ = attention(heads(dense(q, wq, bq)), heads(dense(k, wk, bk)), heads(dense(v, wv, bv)))
    np.testing.assert_allclose(out, dense(o.reshape(1, 3, -1), wo, bo), atol=1e-5)


def test_rotary_and_alibi_inside_attention_match_numpy():
    x = rng.normal(size=(1, 5, 8)).astype("float32")
    layer = MultiHeadAttention(2, 4, position=RotaryEmbedding())
    out = layer(x, use_causal_mask=True)
    wq, bq, wk, bk, wv, bv, wo, bo = _weights(layer)
    q = rotary(dense(x, wq, bq).reshape(1, 5, 2, 4), range(5))
    k = rotary(dense(x, wk, bk).reshape(1, 5, 2, 4), range(5))
    v = dense(x, wv, bv).reshape(1, 5, 2, 4)
    causal = np.tril(np.ones((1, 5, 5), bool))
    o, _ = attention(q, k, v, causal)
    np.testing.assert_allclose(out, dense(o.reshape(1, 5, 8), wo, bo), atol=1e-5)

    layer = MultiHeadAttention(2, 4, position=ALiBiBias(2))
    out = layer(x, use_causal_mask=True)
    i, j = np.meshgrid(np.arange(5), np.arange(5), indexing="ij")
    bias = (-alibi_slopes(2)[:, None, None] * np.abs(i - j))[None]
    expected = multi_head_attention(x, x, _weights(layer), 2, 2, causal, bias)
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_keras_mask_from_embedding_is_used():
    tokens = np.array([[3, 4, 5, 0, 0], [1, 2, 3, 4, 5]])
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    layer = MultiHeadAttention(2, 4)
    padding = tokens != 0
    x = embedding(tokens)
    implicit = layer(x)
    explicit = layer(np.asarray(x), query_mask=padding, value_mask=padding)
    np.testing.assert_allclose(implicit, explicit, atol=1e-6)
    # Padded keys change nothing for real queries.
    changed = np.asarray(x).copy()
    changed[0, 3:] = 100.0
    np.testing.assert_allclose(
        np.asarray(layer(changed, query_mask=padding, value_mask=padding))[0, :3],
        np.asarray(explicit)[0, :3],
        atol=1e-5,
    )
    # The mask passes on: a masked mean after the layer averages the real positions only.
    inputs = keras.Input((5,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(layer(embedding(inputs)))
    mean = np.asarray(keras.Model(inputs, pooled)(tokens))
    real = padding[..., None]
    np.testing.assert_allclose(mean, (np.asarray(explicit) * real).sum(1) / real.sum(1), atol=1e-5)


@pytest.mark.parametrize(
    "position",
    [
        None,
        RotaryEmbedding(),
        ALiBiBias(4),
        RelativePositionBias(4, bidirectional=False, embeddings_initializer="random_normal"),
    ],
    ids=["none", "rotary", "alibi", "relative"],
)
def test_token_by_token_cache_equals_full_causal_pass(position):
    x = rng.normal(size=(2, 7, 16)).astype("float32")
    layer = MultiHeadAttention(4, 4, num_key_value_heads=2, position=position)
    full = keras.ops.convert_to_numpy(layer(x, use_causal_mask=True))
    cache = np.zeros((2, 2, 10, 2, 4), "float32")
    # Prefill 3 tokens, then one at a time.
    out, cache = layer(x[:, :3], cache=cache, cache_update_index=0, use_causal_mask=True)
    steps = [keras.ops.convert_to_numpy(out)]
    for t in range(3, 7):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t, use_causal_mask=True)
        steps.append(keras.ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_cache_in_compiled_function_with_tensor_index():
    x = rng.normal(size=(1, 4, 8)).astype("float32")
    layer = MultiHeadAttention(2, 4, position=RotaryEmbedding())
    full = np.asarray(layer(x, use_causal_mask=True))

    @compiled
    def step(token, cache, index):
        return layer(token, cache=cache, cache_update_index=index, use_causal_mask=True)

    cache = keras.ops.zeros((1, 2, 4, 2, 4))
    outs = []
    for t in range(4):
        out, cache = step(x[:, t : t + 1], cache, np.int32(t))
        outs.append(np.asarray(out))
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, atol=1e-5)


def test_precomputed_cross_attention_cache():
    q = rng.normal(size=(2, 3, 16)).astype("float32")
    src = rng.normal(size=(2, 9, 10)).astype("float32")
    layer = MultiHeadAttention(2, 8)
    expected = layer(q, src)
    out, cache = layer(q, cache=layer.compute_key_value_cache(src))
    np.testing.assert_allclose(out, expected, atol=1e-6)
    assert cache.shape == (2, 2, 9, 2, 8)


def test_causality():
    x = rng.normal(size=(1, 8, 16)).astype("float32")
    layer = MultiHeadAttention(4, 4, position=RotaryEmbedding())
    base = np.asarray(layer(x, use_causal_mask=True))
    changed = x.copy()
    changed[:, 5:] = rng.normal(size=(1, 3, 16))
    out = np.asarray(layer(changed, use_causal_mask=True))
    np.testing.assert_allclose(out[:, :5], base[:, :5], atol=1e-6)
    assert not np.allclose(out[:, 5:], base[:, 5:])


def test_mixed_float16_fully_masked_rows():
    x = rng.normal(size=(2, 5, 16)).astype("float32") * 50
    layer = MultiHeadAttention(4, 4, dtype="mixed_float16")
    mask = np.zeros((2, 5, 5), bool)
    mask[0] = np.tril(np.ones((5, 5), bool))
    out = np.asarray(layer(x, attention_mask=mask)).astype("float32")
    assert np.all(np.isfinite(out))
    # Row with no key: only the output bias remains.
    np.testing.assert_allclose(out[1], np.broadcast_to(np.asarray(layer.output_dense.bias), (5, 16)), atol=1e-3)


@pytest.mark.parametrize("dtype", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_query_blocks_with_padded_rows(dtype):
    # 160 positions (query blocks) in half precision; the padded rows see no key.
    # Its own generator: the inputs do not depend on which tests ran before.
    x = np.random.default_rng(160).normal(size=(2, 160, 16)).astype("float32")
    padding = np.ones((2, 160), bool)
    padding[1, 90:] = False
    layer = MultiHeadAttention(4, 4, dtype=dtype)
    out = np.asarray(layer(x, query_mask=padding, value_mask=padding, use_causal_mask=True)).astype("float32")
    assert np.all(np.isfinite(out))
    reference = MultiHeadAttention(4, 4)
    reference.build(x.shape)
    reference.set_weights(layer.get_weights())
    expected = np.asarray(reference(x, query_mask=padding, value_mask=padding, use_causal_mask=True))
    # bfloat16 keeps 8 significant bits: a few roundings through the projections give a few percent.
    tolerance = {"rtol": 0.03, "atol": 0.05} if dtype == "mixed_bfloat16" else {"atol": 5e-3}
    np.testing.assert_allclose(out, expected, **tolerance)


def test_dropout_only_in_training():
    x = rng.normal(size=(2, 5, 16)).astype("float32")
    layer = MultiHeadAttention(4, 4, dropout=0.5)
    np.testing.assert_allclose(layer(x), layer(x, training=False))
    assert not np.allclose(layer(x, training=True), layer(x))


def test_return_attention_scores():
    x = rng.normal(size=(2, 5, 16)).astype("float32")
    layer = MultiHeadAttention(4, 4)
    out, weights = layer(x, use_causal_mask=True, return_attention_scores=True)
    assert weights.shape == (2, 4, 5, 5)
    assert np.all(np.asarray(weights)[:, :, 0, 1:] == 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_heads": 0, "key_dim": 4}, "Received: num_heads=0"),
        ({"num_heads": 4, "key_dim": 0}, "Received: key_dim=0"),
        ({"num_heads": 4, "key_dim": 4, "num_key_value_heads": 3}, "num_heads=4, num_key_value_heads=3"),
        ({"num_heads": 4, "key_dim": 4, "dropout": 1.0}, "Received: dropout=1.0"),
        ({"num_heads": 4, "key_dim": 4, "position": "rope"}, "Received: position='rope'"),
        ({"num_heads": 4, "key_dim": 4, "position": ALiBiBias(8)}, "8 heads.*num_heads=4"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(**kwargs)


def test_resize_cache_grows_and_keeps_the_written_positions():
    layer = MultiHeadAttention(2, 4)
    cache = rng.normal(size=(1, 2, 3, 2, 4)).astype("float32")
    grown = np.asarray(layer.resize_cache(cache, 5))
    np.testing.assert_array_equal(grown[:, :, :3], cache)
    np.testing.assert_array_equal(grown[:, :, 3:], 0.0)
    with pytest.raises(ValueError, match="only grows a cache. Received: max_length=2 for a cache of 3"):
        layer.resize_cache(cache, 2)


def test_bad_call_arguments():
    layer = MultiHeadAttention(2, 4)
    with pytest.raises(ValueError, match=r"`query` must have rank 3.*Received: query.shape=\(2, 8\)"):
        layer(np.zeros((2, 8), "float32"))
    layer = MultiHeadAttention(2, 4)
    layer(np.zeros((1, 3, 8), "float32"))
    with pytest.raises(ValueError, match=r"`cache` must have shape.*Received: cache.shape=\(1, 2, 5, 2, 8\)"):
        layer(np.zeros((1, 1, 8), "float32"), cache=np.zeros((1, 2, 5, 2, 8), "float32"), cache_update_index=0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_cache_holds_the_bits_of_what_a_float_cache_holds(dtype):
    """init_cache's 16-bit cache keeps its dtype; inside the XLA-CPU engine it holds the bits (XLA backends), and
    against a cache of the float dtype itself: a prefill, steps one by one, and a window whose ring wraps within one
    call; the outputs and the keys and values read back are bit for bit the same, and the steps equal the full pass."""
    from keras_tfam.engine.xla_cpu import XLA_CPU
    from keras_tfam.layers.attention.caches import KeyValueCache

    x = rng.normal(size=(2, 7, 16)).astype("float32")
    layer = MultiHeadAttention(4, 4, num_key_value_heads=2, position=RotaryEmbedding(), dtype=dtype)
    full = as_float32(layer(x, use_causal_mask=True))
    assert keras.backend.standardize_dtype(layer.init_cache(2, 7, dtype).dtype) == dtype  # as users see it
    for window, calls in [(None, [(0, 3), (3, 4), (4, 5), (5, 6), (6, 7)]), (3, [(0, 2), (2, 5), (5, 7)])]:
        with XLA_CPU.decoding():
            bits = layer.init_cache(2, 7, dtype, window=window)
            held = dtype if keras.backend.backend() == "torch" else {"bfloat16": "uint16", "float16": "int16"}[dtype]
            assert keras.backend.standardize_dtype(bits.dtype) == held
            floats = keras.ops.zeros(bits.shape, dtype)
            for start, end in calls:
                options = {"cache_update_index": start, "use_causal_mask": True, "window": window}
                out, bits = layer(x[:, start:end], cache=bits, **options)
                same, floats = layer(x[:, start:end], cache=floats, **options)
                np.testing.assert_array_equal(as_float32(out), as_float32(same))
                if window is None:
                    np.testing.assert_allclose(as_float32(out), full[:, start:end], atol=0.05)
            for read, expected in zip(KeyValueCache.keys_values(bits), KeyValueCache.keys_values(floats)):
                assert keras.backend.standardize_dtype(read.dtype) == dtype
                np.testing.assert_array_equal(as_float32(read), as_float32(expected))


@pytest.mark.skipif(keras.backend.backend() not in ("tensorflow", "jax"), reason="XLA's loops")
def test_a_bfloat16_cache_is_written_in_place_in_a_decoding_loop():
    """XLA's CPU backend widens a bfloat16 dynamic-update-slice to float32 (a copy of the whole cache each step);
    inside the XLA-CPU engine the cache init_cache makes is written as its bits, in place: no float32 update of the
    cache in the loop."""
    import re

    from backend import optimized_hlo

    from keras_tfam.engine.xla_cpu import XLA_CPU

    layer = MultiHeadAttention(2, 4, dtype="bfloat16")
    layer.build((1, 1, 8))

    class Loop(keras.layers.Layer):
        def __init__(self, user_cache=False):
            super().__init__()
            self.attention, self.user_cache = layer, user_cache

        def call(self, x):
            cache = layer.init_cache(1, 6, "bfloat16")
            if self.user_cache:  # a caller's own cache, of the float dtype itself: what the test guards against
                cache = keras.ops.zeros(cache.shape, "bfloat16")

            def step(i, state):
                x, cache = state
                out, cache = self.attention(x, cache=cache, cache_update_index=i, use_causal_mask=True)
                return keras.ops.cast(out, x.dtype), cache

            return keras.ops.fori_loop(0, 6, step, (x, cache))[0]

    x = keras.ops.cast(rng.normal(size=(1, 1, 8)).astype("float32"), "bfloat16")
    widened = r"f32\[1,2,6,2,4\]\{[0-9,]*\} dynamic-update-slice\("
    loop, user_loop = Loop(), Loop(user_cache=True)
    loop.build(x.shape)
    user_loop.build(x.shape)
    with XLA_CPU.decoding():
        assert not re.search(widened, optimized_hlo(loop, x))
        assert re.search(r"u16\[1,2,6,2,4\]\{[0-9,]*\} dynamic-update-slice\(", optimized_hlo(loop, x))
        assert re.search(widened, optimized_hlo(user_loop, x))
