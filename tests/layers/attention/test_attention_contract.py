"""The attention contract, over every registered kind x every option a user sets on it.

Read from the registry at run time: a new kind (one file, `@register_attention`) is covered without
editing this file. Each combination is either refused at construction (a `ValueError` naming the
kind or the value) or honoured identically in the full pass and when decoding:

    full causal pass == token-by-token decoding == prompt prefill + steps   (float32, <= 1e-5)

(1e-5 of the outputs' scale: absolute for outputs up to 1, relative to the largest beyond: kernels
whose normaliser can come near zero, trigonometric random features, amplify float32 rounding of
sums taken in another order over a ring's slots.)

with a call-level `window` too (through a ring cache, or refused in one line). Kinds that are not
causal (Linformer) refuse every decoding argument in one line.
"""

import numpy as np
import pytest
from keras import ops

from keras_tfam.layers.attention.registry import attention_kinds
from keras_tfam.layers.position.registry import ATTENTION_POSITIONS, make_attention_position

NUM_HEADS, KEY_DIM, WIDTH, LENGTH = 2, 4, 8, 8

# Options every kind accepts in its constructor (`BaseAttention`'s), each alone.
COMMON_OPTIONS = {
    "default": {},
    "grouped_query": {"num_key_value_heads": 1},
    "no_bias": {"use_bias": False},
    **{f"position_{name}": {"position": name} for name in ATTENTION_POSITIONS},
    "local_window": {"pattern": {"name": "sliding_window", "window": 3}},
    "strided": {"pattern": {"name": "strided", "stride": 3}},
    "big_bird": {
        "pattern": {"name": "big_bird", "block_size": 2, "num_random_blocks": 1, "num_global_blocks": 1, "causal": True}
    },
    "per_head": {
        "pattern": {
            "name": "per_head",
            "patterns": [{"name": "sliding_window", "window": 2}, {"name": "strided", "stride": 3}],
        }
    },
}


def combinations():
    for kind, cls in attention_kinds().items():
        for e, example in enumerate(cls.example_options):
            for option_name, option in COMMON_OPTIONS.items():
                yield pytest.param(cls, {**example, **option}, id=f"{kind}-{e}-{option_name}")


def build(cls, options):
    """The layer, or the construction's `ValueError` (refused)."""
    options = dict(options)
    if "position" in options:
        options["position"] = make_attention_position(options["position"], NUM_HEADS)
    try:
        return cls(NUM_HEADS, KEY_DIM, **options), None
    except ValueError as error:
        return None, error


def to_numpy(x):
    return np.asarray(ops.convert_to_numpy(x))


def decode(layer, x, prefill, cache, window=None):
    """Causal outputs of `x (B, T, D)` through `cache`: `prefill` positions at once, then one by one."""
    out, cache = layer(x[:, :prefill], cache=cache, cache_update_index=0, use_causal_mask=True, window=window)
    outs = [to_numpy(out)]
    for t in range(prefill, x.shape[1]):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t, use_causal_mask=True, window=window)
        outs.append(to_numpy(out))
    return np.concatenate(outs, axis=1)


def assert_close(decoded, full):
    np.testing.assert_allclose(decoded, full, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(full).max())))


def check_refusal(cls, options, error):
    message = str(error)
    assert "\n" not in message.strip(), message
    assert cls.__name__ in message or "Received" in message, message


@pytest.mark.parametrize("cls, options", list(combinations()))
def test_full_pass_equals_decoding(cls, options):
    layer, error = build(cls, options)
    if error is not None:
        check_refusal(cls, options, error)
        return
    x = np.random.default_rng(0).normal(size=(2, LENGTH, WIDTH)).astype("float32")
    if not cls.supports_causal:
        layer(x)
        for arguments in ({"use_causal_mask": True}, {"cache": np.zeros((2, 2, 4, 1, 4), "float32")}):
            with pytest.raises(ValueError, match=f"{cls.__name__} takes no"):
                layer(x, **arguments)
        return
    full = to_numpy(layer(x, use_causal_mask=True))
    for prefill in (1, 4):
        decoded = decode(layer, x, prefill, layer.init_cache(2, LENGTH))
        assert_close(decoded, full)


@pytest.mark.parametrize("cls, options", [p for p in combinations() if p.id.endswith("-default")])
def test_a_call_window_is_the_same_through_a_ring_cache_or_refused(cls, options):
    layer, error = build(cls, options)
    if error is not None or not cls.supports_causal:
        return
    x = np.random.default_rng(1).normal(size=(2, LENGTH, WIDTH)).astype("float32")
    if not cls.supports_ring_cache:
        with pytest.raises(ValueError, match=f"{cls.__name__} does not decode with a sliding-window"):
            layer.init_cache(2, LENGTH, window=4)
        with pytest.raises(ValueError, match=f"{cls.__name__} takes no `window`"):
            layer(x[:, :1], cache=layer.init_cache(2, LENGTH), cache_update_index=0, window=4)
        return
    if getattr(layer, "is_gated", False):
        with pytest.raises(ValueError, match="no windowed form"):
            layer(x, use_causal_mask=True, window=4)
        return
    full = to_numpy(layer(x, use_causal_mask=True, window=4))
    for prefill in (1, 5):  # 5 > 4: the prefill wraps around the ring
        decoded = decode(layer, x, prefill, layer.init_cache(2, LENGTH, window=4), window=4)
        assert_close(decoded, full)
