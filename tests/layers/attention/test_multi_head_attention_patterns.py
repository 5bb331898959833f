"""MultiHeadAttention with attention patterns: banded compute, dense patterns, ring caches."""

import numpy as np
import pytest
from harness import LayerHarness
from reference import attention, dense, rotary

from keras_tfam.layers import ALiBiBias, LinearAttention, MultiHeadAttention, RelativePositionBias, RotaryEmbedding
from keras_tfam.layers.attention.patterns import (
    BigBird,
    Blockwise,
    DilatedWindow,
    HeadPatterns,
    SlidingWindow,
    Strided,
    interleave,
)
from keras_tfam.layers.position.alibi_bias import alibi_slopes

rng = np.random.default_rng(0)
W = 4


class TestSlidingWindowAttentionHarness(LayerHarness):
    # 10 positions, window 3: banded compute (blocks of 3 queries over 6 keys).
    layer_cls = MultiHeadAttention
    init_kwargs = {
        "num_heads": 4,
        "key_dim": 4,
        "num_key_value_heads": 2,
        "position": RotaryEmbedding(),
        "pattern": SlidingWindow(3),
    }
    call_kwargs = {"use_causal_mask": True}

    def make_inputs(self):
        return {"query": rng.normal(size=(2, 10, 16)).astype("float32")}


class TestPerHeadPatternHarness(LayerHarness):
    # A dilated window for heads 0-1 and BigBird for heads 2-3: a dense per-head mask.
    layer_cls = MultiHeadAttention
    init_kwargs = {
        "num_heads": 4,
        "key_dim": 4,
        "dropout": 0.1,
        "pattern": HeadPatterns(
            [DilatedWindow(2, dilation=2), BigBird(2, num_random_blocks=1, num_global_blocks=1, seed=4)]
        ),
    }

    def make_inputs(self):
        return {"query": rng.normal(size=(2, 8, 16)).astype("float32")}


def numpy_layer(layer, x, mask):
    """The layer's forward pass in NumPy, from its weights, positions written out (rotary, ALiBi)."""
    wq, bq, wk, bk, wv, bv, wo, bo = [np.asarray(w, np.float64) for w in layer.get_weights()]
    b, t, _ = x.shape
    q = dense(x, wq, bq).reshape(b, t, layer.num_heads, -1)
    k = dense(x, wk, bk).reshape(b, t, layer.num_key_value_heads, -1)
    v = dense(x, wv, bv).reshape(b, t, layer.num_key_value_heads, -1)
    bias = None
    if isinstance(layer.position, RotaryEmbedding):
        q, k = rotary(q, range(t)), rotary(k, range(t))
    elif isinstance(layer.position, ALiBiBias):
        i, j = np.meshgrid(np.arange(t), np.arange(t), indexing="ij")
        bias = (-alibi_slopes(layer.num_heads)[:, None, None] * np.abs(i - j))[None]
    out, _ = attention(q, k, v, mask, bias)
    return dense(out.reshape(b, t, -1), wo, bo)


def window_mask(length, window, causal):
    i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    return (i - j < window) & (i - j >= 0) if causal else np.abs(i - j) < window


@pytest.mark.parametrize("length", [1, W - 1, W, W + 1, 3 * W + 5])
@pytest.mark.parametrize(
    "position, causal, how",
    [(None, True, "pattern"), ("rotary", True, "window"), ("alibi", False, "pattern"), ("alibi", True, "window")],
    ids=["plain-causal-pattern", "rotary-causal-window", "alibi-bidirectional-pattern", "alibi-causal-window"],
)
def test_banded_layer_equals_numpy_attention(length, position, causal, how, kernels_run):
    scheme = {"rotary": RotaryEmbedding(), "alibi": ALiBiBias(4), None: None}[position]
    pattern = SlidingWindow(W) if how == "pattern" else None
    layer = MultiHeadAttention(
        4, 4, num_key_value_heads=2, position=scheme, pattern=pattern, bias_initializer="random_normal"
    )
    x = rng.normal(size=(2, length, 16)).astype("float32")
    padding = np.ones((2, length), bool)
    padding[1, length // 2 + 1 :] = False
    call = {"window": W} if how == "window" else {}
    out = layer(x, query_mask=padding, value_mask=padding, use_causal_mask=causal, **call)
    assert kernels_run == ["banded" if length > W else "dense"]  # "auto": banded when the band is narrower
    mask = window_mask(length, W, causal)[None] & padding[:, None, :] & padding[:, :, None]
    np.testing.assert_allclose(out, numpy_layer(layer, x, mask), atol=1e-5)


@pytest.mark.parametrize(
    "pattern",
    [Strided(3), Blockwise(3, [1, 0]), BigBird(3, 1, num_global_blocks=1, seed=2)],
    ids=["strided", "blockwise", "big_bird"],
)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_patterns_inside_attention_equal_numpy_masked_attention(pattern, causal):
    length = 18
    x = rng.normal(size=(2, length, 16)).astype("float32")
    if causal and pattern.depends_on_length:
        # BigBird's non-causal random blocks depend on the length: a causal call cannot decode them.
        with pytest.raises(ValueError, match="depends on the sequence's length"):
            MultiHeadAttention(4, 4, pattern=pattern)(x, use_causal_mask=True)
        pattern = BigBird(3, 1, num_global_blocks=1, seed=2, causal=True)
    layer = MultiHeadAttention(4, 4, num_key_value_heads=2, pattern=pattern, position=RotaryEmbedding())
    out = layer(x, use_causal_mask=causal)
    positions = np.arange(length)
    allowed = np.asarray(pattern.mask(positions, positions))
    if causal:
        allowed = allowed & np.tril(np.ones((length, length), bool))
    np.testing.assert_allclose(out, numpy_layer(layer, x, np.broadcast_to(allowed, (2, length, length))), atol=1e-5)


def test_pattern_per_head_group_equals_numpy():
    length = 12
    pattern = HeadPatterns([SlidingWindow(2), Strided(4, subset=2)])
    layer = MultiHeadAttention(4, 4, pattern=pattern)
    x = rng.normal(size=(1, length, 16)).astype("float32")
    out = layer(x, use_causal_mask=True)
    causal = np.tril(np.ones((length, length), bool))
    i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    per_head = np.stack([np.abs(i - j) < 2] * 2 + [(i - j) % 4 == 0] * 2)[None] & causal  # heads 0-1, 2-3
    np.testing.assert_allclose(out, numpy_layer(layer, x, per_head), atol=1e-5)


def test_interleaved_strided_layers_connect_every_causal_pair():
    # Two layers, A(1) then A(2) (Child et al.'s interleaving): output i depends on every input j <= i.
    n, stride = 16, 4
    layers = [MultiHeadAttention(2, 4, pattern=p) for p in interleave([Strided(stride, 1), Strided(stride, 2)], 2)]

    def run(x, stack):
        for layer in stack:
            x = x + layer(x, use_causal_mask=True)
        return np.asarray(x)

    x = rng.normal(size=(1, n, 8)).astype("float32")
    base = {name: run(x, stack) for name, stack in (("both", layers), ("first", layers[:1]))}
    reached = {name: np.zeros((n, n), bool) for name in base}
    for j in range(n):
        changed = x.copy()
        changed[0, j] += 1.0
        for name, stack in (("both", layers), ("first", layers[:1])):
            reached[name][:, j] = np.abs(run(changed, stack) - base[name])[0].max(-1) > 1e-6
    np.testing.assert_array_equal(reached["both"], np.tril(np.ones((n, n), bool)))
    assert not reached["first"][15, 0]  # one local layer alone does not reach that far


@pytest.mark.parametrize("dtype", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_banded_with_padded_rows(dtype):
    length = 3 * W + 5
    x = rng.normal(size=(2, length, 16)).astype("float32")
    padding = np.ones((2, length), bool)
    padding[1, 9:] = False
    layer = MultiHeadAttention(4, 4, position=ALiBiBias(4), pattern=SlidingWindow(W), dtype=dtype)
    out = np.asarray(layer(x, query_mask=padding, value_mask=padding, use_causal_mask=True)).astype("float32")
    assert np.all(np.isfinite(out))
    reference = MultiHeadAttention(4, 4, position=ALiBiBias(4), pattern=SlidingWindow(W))
    reference.build(x.shape)
    reference.set_weights(layer.get_weights())
    expected = np.asarray(reference(x, query_mask=padding, value_mask=padding, use_causal_mask=True))
    np.testing.assert_allclose(out, expected, atol=0.05 if dtype == "mixed_bfloat16" else 5e-3)


def test_banded_dropout_only_in_training():
    x = rng.normal(size=(2, 3 * W, 16)).astype("float32")
    layer = MultiHeadAttention(4, 4, dropout=0.5, pattern=SlidingWindow(W))
    np.testing.assert_allclose(layer(x, use_causal_mask=True), layer(x, use_causal_mask=True, training=False))
    assert not np.allclose(layer(x, use_causal_mask=True, training=True), layer(x, use_causal_mask=True))


def test_linear_attention_with_a_local_pattern_equals_the_masked_kernel():
    # Katharopoulos et al.'s elu kernel restricted to the window, computed banded.
    length = 3 * W + 5
    x = rng.normal(size=(2, length, 8)).astype("float32")
    layer = LinearAttention(2, 4, pattern=SlidingWindow(W), bias_initializer="random_normal")
    out = np.asarray(layer(x, use_causal_mask=True))
    wq, bq, wk, bk, wv, bv, wo, bo = [np.asarray(w, np.float64) for w in layer.get_weights()]
    phi = lambda a: np.where(a > 0, a + 1.0, np.exp(a))  # noqa: E731
    q, k, v = (dense(x, w, b).reshape(2, length, 2, -1) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    kernel = np.einsum("btnh,bsnh->bnts", phi(q), phi(k)) * window_mask(length, W, True)
    expected = np.einsum("bnts,bsnv->btnv", kernel, v) / kernel.sum(-1).transpose(0, 2, 1)[..., None]
    np.testing.assert_allclose(out, dense(expected.reshape(2, length, -1), wo, bo), rtol=1e-4, atol=1e-5)


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
@pytest.mark.parametrize("how", ["pattern", "window"])
def test_ring_cache_decoding_equals_the_full_computation(position, how):
    # 3w + 5 tokens one at a time through a ring of w slots: the step where the
    # length first equals w (index w - 1), the first wrap (index w) and two more wraps.
    length = 3 * W + 5
    layer = MultiHeadAttention(
        4, 4, num_key_value_heads=2, position=position, pattern=SlidingWindow(W) if how == "pattern" else None
    )
    window = {"window": W} if how == "window" else {}
    x = rng.normal(size=(2, length, 16)).astype("float32")
    full = np.asarray(layer(x, use_causal_mask=True, **window))
    cache = layer.init_cache(2, length, **window)
    assert tuple(cache.shape) == (2, 2, W, 2, 4)
    for index in range(length):
        out, cache = layer(
            x[:, index : index + 1], cache=cache, cache_update_index=index, use_causal_mask=True, **window
        )
        np.testing.assert_allclose(out[:, 0], full[:, index], atol=1e-5, err_msg=f"step {index}")
    # Several tokens at once, across a wrap: a prefill of w + 2, then the rest in chunks of 5.
    cache = layer.init_cache(2, length, **window)
    outputs = []
    for start, stop in ((0, W + 2), (W + 2, W + 7), (W + 7, length)):
        out, cache = layer(x[:, start:stop], cache=cache, cache_update_index=start, use_causal_mask=True, **window)
        outputs.append(np.asarray(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5)


def test_ring_cache_memory_does_not_grow_with_the_length():
    layer = MultiHeadAttention(4, 8, pattern=SlidingWindow(16))
    layer.build((1, 1, 32))
    cache = layer.init_cache(1, 100_000)
    assert tuple(cache.shape) == (1, 2, 16, 4, 8)
    assert layer.resize_cache(cache, 200_000) is cache
    short = layer.init_cache(1, 10)  # grows up to the window, before it wraps
    assert tuple(layer.resize_cache(short, 1000).shape) == (1, 2, 16, 4, 8)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"`pattern` has 3 head groups, which must divide num_heads=4"):
        MultiHeadAttention(4, 4, pattern=HeadPatterns([SlidingWindow(2)] * 3))
    with pytest.raises(ValueError, match="Received: pattern='dilated'"):
        MultiHeadAttention(4, 4, pattern={"name": "dilated", "window": 3})
    layer = MultiHeadAttention(2, 4, pattern=Blockwise(4, [1, 0]))
    divide = "`block_size`=4 must divide the sequence length. Received: sequence length 10"
    with pytest.raises(ValueError, match=divide):
        layer(np.zeros((1, 10, 8), "float32"))
    layer = MultiHeadAttention(2, 4, pattern=SlidingWindow(6))
    x = np.zeros((1, 1, 8), "float32")
    with pytest.raises(ValueError, match="Received: window=0"):
        layer(np.zeros((1, 5, 8), "float32"), window=0)
    with pytest.raises(ValueError, match=r"`cache` must have shape.*Received: cache.shape=\(1, 2, 6, 1, 4\)"):
        layer(x, cache=np.zeros((1, 2, 6, 1, 4), "float32"), cache_update_index=0)
    small = layer.init_cache(1, 4)  # 4 slots: cannot wrap a window of 6
    with pytest.raises(ValueError, match="ring cache must hold the whole window.*4 slots for window=6"):
        layer(x, cache=small, cache_update_index=4)
