"""The named attention kernels (`attention_kernel`): each explicit one is Vaswani et al.'s attention (NumPy) on
every call it accepts and refuses the others in one line; "auto" picks what the shapes call for; a kind that
overrides the dense hook declares its kernels and is never routed past it.

"flash" runs here through the `fused_calls` stand-in (conftest.py): the fused kernel itself needs JAX on a GPU.
"""

import re

import keras
import numpy as np
import pytest
from reference import attention, dense, rotary

from keras_tfam.layers import (
    ALiBiBias,
    DistanceAwareAttention,
    LinearAttention,
    MultiHeadAttention,
    RotaryEmbedding,
)
from keras_tfam.layers.attention.attention_kernels import HOOK_KERNELS, SOFTMAX_KERNELS
from keras_tfam.layers.attention.patterns import SlidingWindow
from keras_tfam.ops.attention import flash_attention_fits

rng = np.random.default_rng(0)
B, T, D, N, K, W = 2, 10, 16, 4, 2, 3


def causal(length):
    return np.tril(np.ones((length, length), bool))[None]


def band(length, window, is_causal):
    i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    return ((i - j < window) & (i >= j) if is_causal else np.abs(i - j) < window)[None]


def alibi(length, heads):
    """Press et al. 2022: head `h` (from 1) adds `-2^(-8h/n) |i - j|` to the scores."""
    slopes = 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)
    i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    return (-slopes[:, None, None] * np.abs(i - j))[None]


PADDING = np.ones((B, T), bool)
PADDING[1, 6:] = False
PADDED = PADDING[:, None, :] & PADDING[:, :, None]
ATTENTION_MASK = rng.random((B, T, T)) < 0.6
ATTENTION_MASK[:, np.arange(T), np.arange(T)] = True

# name: (constructor options, call options, the NumPy mask, the kernels that compute the call)
CASES = {
    "causal": ({}, {"use_causal_mask": True}, causal(T), {"dense", "query_blocks", "flash"}),
    "rotary_causal": (
        {"position": "rotary"},
        {"use_causal_mask": True},
        causal(T),
        {"dense", "query_blocks", "flash"},
    ),
    "causal_window": (
        {},
        {"use_causal_mask": True, "window": W},
        band(T, W, True),
        {"dense", "query_blocks", "banded"},
    ),
    "padded_causal_window": (
        {},
        {"use_causal_mask": True, "window": W, "query_mask": PADDING, "value_mask": PADDING},
        band(T, W, True) & PADDED,
        {"dense", "query_blocks", "banded"},
    ),
    "alibi_causal_window": (
        {"position": "alibi"},
        {"use_causal_mask": True, "window": W},
        band(T, W, True),
        {"dense", "query_blocks", "banded"},
    ),
    "bidirectional_pattern": ({"pattern": SlidingWindow(W)}, {}, band(T, W, False), {"dense", "banded"}),
    "causal_attention_mask": (
        {},
        {"use_causal_mask": True, "attention_mask": ATTENTION_MASK},
        causal(T) & ATTENTION_MASK,
        {"dense", "query_blocks"},
    ),
    "bidirectional": ({}, {}, None, {"dense"}),
}


def make(options, **kwargs):
    options = dict(options)
    position = options.pop("position", None)
    position = {"rotary": RotaryEmbedding(), "alibi": ALiBiBias(N), None: None}[position]
    return MultiHeadAttention(
        N, 4, num_key_value_heads=K, position=position, bias_initializer="random_normal", **options, **kwargs
    )


def numpy_layer(layer, x, mask):
    """The layer's forward pass in NumPy from its weights: Vaswani et al. eq. 1, rotary or ALiBi written out."""
    wq, bq, wk, bk, wv, bv, wo, bo = [np.asarray(w, np.float64) for w in layer.get_weights()]
    length = x.shape[1]
    q = dense(x, wq, bq).reshape(B, length, N, -1)
    k = dense(x, wk, bk).reshape(B, length, K, -1)
    v = dense(x, wv, bv).reshape(B, length, K, -1)
    bias = None
    if isinstance(layer.position, RotaryEmbedding):
        q, k = rotary(q, range(length)), rotary(k, range(length))
    elif isinstance(layer.position, ALiBiBias):
        bias = alibi(length, N)
    out, _ = attention(q, k, v, mask, bias)
    return dense(out.reshape(B, length, -1), wo, bo)


def refusal_line(error, kernel):
    """The one line of the refusal (Keras prints the call's arguments around it in eager mode)."""
    pattern = (
        rf"cannot compute this call with attention_kernel='{kernel}' \([^\n]+\); this call allows attention_kernel "
        rf"in \('auto', 'dense'[^\n]*\)\. Received: attention_kernel='{kernel}'"
    )
    return re.search(pattern, str(error))


@pytest.mark.parametrize("kernel", SOFTMAX_KERNELS)
@pytest.mark.parametrize("case", list(CASES))
def test_an_explicit_kernel_equals_numpy_attention_or_refuses_the_call_in_one_line(
    case, kernel, fused_calls, kernels_run
):
    options, call, mask, accepted = CASES[case]
    layer = make(options, attention_kernel=kernel)
    x = rng.normal(size=(B, T, D)).astype("float32")
    if kernel not in accepted:
        with pytest.raises(ValueError) as error:
            layer(x, **call)
        assert refusal_line(error.value, kernel), str(error.value)
        return
    out = layer(x, **call)
    assert kernels_run == [kernel]
    assert len(fused_calls) == (kernel == "flash")
    np.testing.assert_allclose(out, numpy_layer(layer, x, mask), atol=1e-5)


@pytest.mark.parametrize("kernel", ["query_blocks", "banded", "flash"])
def test_a_cached_call_or_the_weights_are_refused_by_the_block_kernels(kernel, fused_calls):
    layer = make({}, attention_kernel=kernel)
    x = rng.normal(size=(B, 1, D)).astype("float32")
    cache = layer.init_cache(B, 4)
    with pytest.raises(ValueError, match="a cache is given") as error:
        layer(x, cache=cache, cache_update_index=0, use_causal_mask=True)
    assert refusal_line(error.value, kernel)
    with pytest.raises(ValueError, match="return_attention_scores=True") as error:
        layer(
            rng.normal(size=(B, T, D)).astype("float32"), use_causal_mask=True, window=W, return_attention_scores=True
        )
    assert refusal_line(error.value, kernel)


@pytest.mark.skipif(
    flash_attention_fits(keras.ops.ones((1, 4, 2, 8), "bfloat16"), keras.ops.ones((1, 4, 2, 8), "bfloat16")),
    reason="a fused kernel here",
)
def test_flash_without_a_fused_kernel_is_refused_naming_what_it_needs():
    layer = make({}, attention_kernel="flash")
    with pytest.raises(ValueError, match="flash_attention_fits needs JAX on a GPU") as error:
        layer(rng.normal(size=(B, T, D)).astype("float32"), use_causal_mask=True)
    assert refusal_line(error.value, "flash")


@pytest.mark.parametrize(
    "cls, value",
    [
        (MultiHeadAttention, "eager"),
        (MultiHeadAttention, None),
        (LinearAttention, "flash"),
        (DistanceAwareAttention, "dense"),
    ],
)
def test_an_unknown_or_undeclared_kernel_is_refused_at_construction(cls, value):
    with pytest.raises(ValueError) as error:
        cls(N, 4, attention_kernel=value)
    message = str(error.value)
    assert "\n" not in message
    assert "`attention_kernel` must be one of ('auto'" in message and message.endswith(
        f"Received: attention_kernel={value!r}"
    ), message


# (length, constructor options, call options, the kernel "auto" ran before it was named), on the shapes of
# the suite's other tests: query blocks from 128 causal positions on, banded when the band is narrower than
# the sequence, dense otherwise and for cached calls, the weights or a memory.
AUTO_CASES = [
    (130, {}, {"use_causal_mask": True}, "query_blocks"),
    (160, {"position": "alibi"}, {"use_causal_mask": True}, "query_blocks"),
    (127, {}, {"use_causal_mask": True}, "dense"),
    (130, {}, {"use_causal_mask": True, "return_attention_scores": True}, "dense"),
    (130, {}, {}, "dense"),
    (3 * W + 5, {}, {"use_causal_mask": True, "window": W}, "banded"),
    (W, {}, {"use_causal_mask": True, "window": W}, "dense"),
    (1, {"pattern": SlidingWindow(W)}, {"use_causal_mask": True}, "dense"),
    (3 * W + 5, {"pattern": SlidingWindow(W), "position": "alibi"}, {}, "banded"),
    (3 * W + 5, {}, {"use_causal_mask": True, "window": W, "attention_mask": np.ones((B, 14, 14), bool)}, "dense"),
    (130, {}, {"use_causal_mask": True, "window": 200}, "query_blocks"),
]


@pytest.mark.parametrize("length, options, call, kernel", AUTO_CASES)
def test_auto_runs_the_kernel_it_ran_before(length, options, call, kernel, kernels_run):
    make(options)(rng.normal(size=(B, length, D)).astype("float32"), **call)
    assert kernels_run == [kernel]


def test_auto_runs_flash_on_plain_causal_self_attention_only(fused_calls, kernels_run):
    layer = make({})
    x = rng.normal(size=(B, T, D)).astype("float32")
    layer(x, use_causal_mask=True)
    layer(x, use_causal_mask=True, window=3)
    layer(x, use_causal_mask=True, query_mask=PADDING)
    assert kernels_run == ["flash", "banded", "dense"]


def test_auto_decodes_with_the_dense_kernel(kernels_run):
    layer = make({})
    cache = layer.init_cache(B, 4)
    layer(rng.normal(size=(B, 2, D)).astype("float32"), cache=cache, cache_update_index=0, use_causal_mask=True)
    assert kernels_run == ["dense"]


class DoubledHeads(MultiHeadAttention):
    """Softmax attention with its heads doubled: a kind that replaces the dense hook."""

    attention_kernels = HOOK_KERNELS

    def _compute_attention(self, query, key, value, attention_mask, bias, training, return_attention_scores):
        outputs, weights = super()._compute_attention(
            query, key, value, attention_mask, bias, training, return_attention_scores
        )
        return 2.0 * outputs, weights


@pytest.mark.parametrize(
    "length, call, kernel",
    [
        (T, {"use_causal_mask": True}, "dense"),
        (130, {"use_causal_mask": True}, "query_blocks"),
        (3 * W + 5, {"use_causal_mask": True, "window": W}, "banded"),
    ],
)
def test_a_kind_replacing_the_dense_hook_is_never_routed_past_it(length, call, kernel, fused_calls, kernels_run):
    layer = DoubledHeads(N, 4, num_key_value_heads=K, bias_initializer="random_normal")
    x = rng.normal(size=(B, length, D)).astype("float32")
    out = layer(x, **call)
    assert kernels_run == [kernel] and fused_calls == []  # a fused kernel was there to take
    wq, bq, wk, bk, wv, bv, wo, bo = [np.asarray(w, np.float64) for w in layer.get_weights()]
    heads, _ = attention(
        dense(x, wq, bq).reshape(B, length, N, -1),
        dense(x, wk, bk).reshape(B, length, K, -1),
        dense(x, wv, bv).reshape(B, length, K, -1),
        band(length, call.get("window", length), True),
    )
    np.testing.assert_allclose(out, dense(2.0 * heads.reshape(B, length, -1), wo, bo), atol=1e-5)
    with pytest.raises(ValueError, match="attention_kernel` must be one of"):
        DoubledHeads(N, 4, attention_kernel="flash")


def test_a_kind_replacing_the_dense_hook_must_declare_its_kernels():
    with pytest.raises(TypeError, match="overrides `_compute_attention`: declare the named kernels"):

        class Undeclared(MultiHeadAttention):
            def _compute_attention(self, query, key, value, attention_mask, bias, training, return_attention_scores):
                return super()._compute_attention(
                    query, key, value, attention_mask, bias, training, return_attention_scores
                )


def test_linear_attention_runs_a_named_kernel_in_its_windowed_form_only(kernels_run):
    layer = LinearAttention(N, 4, attention_kernel="banded")
    x = rng.normal(size=(B, 3 * W + 5, D)).astype("float32")
    windowed = layer(x, use_causal_mask=True, window=W)
    assert kernels_run == ["banded"]
    dense_layer = LinearAttention(N, 4, attention_kernel="dense")
    dense_layer(x, use_causal_mask=True, window=W)
    dense_layer.set_weights(layer.get_weights())
    np.testing.assert_allclose(windowed, dense_layer(x, use_causal_mask=True, window=W), atol=1e-5)
    with pytest.raises(ValueError, match=r"in its windowed form only .* Received: attention_kernel='banded'"):
        layer(x, use_causal_mask=True)


def test_the_kernel_is_in_the_config_and_older_configs_load():
    layer = make({}, attention_kernel="query_blocks")
    config = layer.get_config()
    assert config["attention_kernel"] == "query_blocks"
    assert MultiHeadAttention.from_config(config).attention_kernel == "query_blocks"
    del config["attention_kernel"]  # a config saved before the kernel was named
    assert MultiHeadAttention.from_config(config).attention_kernel == "auto"
