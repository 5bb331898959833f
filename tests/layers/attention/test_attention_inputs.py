"""The masks of an attention call: boolean or 0/1, of the shape the call's queries and keys give, refused in
one line naming the mask otherwise (a float mask included: 0 / -1e9 read as booleans inverts causality)."""

import keras
import numpy as np
import pytest
from backend import compiled

from keras_tfam.layers import MultiHeadAttention, TransformerDecoderBlock, TransformerEncoderBlock
from keras_tfam.layers.attention.attention_inputs import check_mask

rng = np.random.default_rng(0)
x = rng.normal(size=(2, 5, 8)).astype("float32")
CAUSAL = np.tril(np.ones((5, 5), bool))[None].repeat(2, 0)


def numpy(value):
    return keras.ops.convert_to_numpy(value)


def layer():
    attention = MultiHeadAttention(2, 4)
    attention(x)
    return attention


def test_an_additive_float_mask_is_refused_and_its_boolean_form_equals_the_causal_call():
    attention = layer()
    additive = np.where(CAUSAL, 0.0, -1e9).astype("float32")
    with pytest.raises(ValueError, match=r"`attention_mask` must be boolean .* Received: attention_mask.dtype=float32"):
        attention(x, attention_mask=additive)
    np.testing.assert_allclose(
        numpy(attention(x, attention_mask=additive == 0)), numpy(attention(x, use_causal_mask=True)), atol=1e-6
    )
    with pytest.raises(ValueError, match=r"`query_mask` must be boolean .*Received: query_mask.dtype=float32"):
        attention(x, query_mask=np.ones((2, 5), "float32"))


def test_masks_of_the_wrong_length_or_batch_name_the_mask_and_both_shapes():
    attention = layer()
    cases = [
        ({"attention_mask": np.ones((2, 5, 4), bool)}, r"`attention_mask` must have shape \(batch=2, query length=5, "),
        ({"attention_mask": np.ones((3, 5, 5), bool)}, r"key length=5\) .* Received: attention_mask.shape=\(3, 5, 5\)"),
        ({"attention_mask": np.ones((5, 5), bool)}, r"Received: attention_mask.shape=\(5, 5\)"),
        ({"query_mask": np.ones((2, 4), bool)}, r"`query_mask` must have shape \(batch=2, query length=5\)"),
        ({"value_mask": np.ones((3, 5), bool)}, r"`value_mask` must have shape \(batch=2, value length=5\)\."),
        ({"key_mask": np.ones((2, 6), bool)}, r"Received: key_mask.shape=\(2, 6\)"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            attention(x, **kwargs)
    # Cross-attention: the keys' length is the source's; a memory's positions come first.
    source = rng.normal(size=(2, 7, 8)).astype("float32")
    assert attention(x, source, value_mask=np.ones((2, 7), bool)).shape == (2, 5, 8)
    with pytest.raises(ValueError, match=r"`value_mask` must have shape \(batch=2, value length=7\)"):
        attention(x, source, value_mask=np.ones((2, 5), bool))
    memory = rng.normal(size=(2, 3, 8)).astype("float32")
    assert attention(x, memory=memory, attention_mask=np.ones((1, 5, 8), bool)).shape == (2, 5, 8)  # broadcasts
    with pytest.raises(ValueError, match=r"`memory_mask` must have shape \(batch=2, memory length=3\)"):
        attention(x, memory=memory, memory_mask=np.ones((2, 4), bool))


def test_integer_masks_read_as_booleans_and_other_integers_are_refused_when_known():
    attention = layer()
    padding = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    expected = numpy(attention(x, query_mask=padding == 1, value_mask=padding == 1))
    np.testing.assert_array_equal(numpy(attention(x, query_mask=padding, value_mask=padding)), expected)
    with pytest.raises(ValueError, match=r"`attention_mask` must be boolean or 0/1 .*values \[-1000000000, 0\]"):
        attention(x, attention_mask=np.where(CAUSAL, 0, -(10**9)))
    # Compiled, the values are not known: the shapes are still checked, and a 0/1 mask gives the eager result.
    run = compiled(lambda q, mask: attention(q, query_mask=mask, value_mask=mask))
    np.testing.assert_allclose(numpy(run(x, padding)), expected, atol=1e-6)
    with pytest.raises(ValueError, match=r"`query_mask` must have shape"):
        run(x, padding[:, :4])


def test_a_symbolic_call_checks_the_static_shapes():
    attention = MultiHeadAttention(2, 4)
    query = keras.Input((5, 8))
    assert attention(query, attention_mask=keras.Input((5, 5), dtype="bool")).shape == (None, 5, 8)
    with pytest.raises(ValueError, match=r"Received: attention_mask.shape=\(\w+, 5, 6\)"):
        attention(query, attention_mask=keras.Input((5, 6), dtype="bool"))


def test_blocks_name_their_own_masks():
    encoder = TransformerEncoderBlock(num_heads=2, intermediate_dim=16)
    encoder(x)
    with pytest.raises(ValueError, match=r"`padding_mask` must have shape \(batch=2, length=5\)"):
        encoder(x, padding_mask=np.ones((2, 6), bool))
    with pytest.raises(ValueError, match=r"`attention_mask` must be boolean"):
        encoder(x, attention_mask=np.zeros((2, 5, 5), "float32"))
    decoder = TransformerDecoderBlock(num_heads=2, intermediate_dim=16)
    source = rng.normal(size=(2, 7, 8)).astype("float32")
    decoder(x, source)
    with pytest.raises(ValueError, match=r"`encoder_padding_mask` must have shape \(batch=2, source=7\)"):
        decoder(x, source, encoder_padding_mask=np.ones((2, 5), bool))
    with pytest.raises(ValueError, match=r"`decoder_attention_mask` must have shape \(batch=2, length=5, keys=5\)"):
        decoder(x, source, decoder_attention_mask=np.ones((2, 5, 7), bool))


def test_check_mask_allows_unknown_sizes_and_broadcast_axes_only_when_asked():
    check_mask("m", np.ones((1, 4), bool), (("batch", None), ("length", 4)))
    check_mask("m", np.ones((1, 4), bool), (("batch", 3), ("length", 4)), broadcast=True)
    with pytest.raises(ValueError, match=r"`m` must have shape \(batch=3, length=4\)\. Received: m.shape=\(1, 4\)"):
        check_mask("m", np.ones((1, 4), bool), (("batch", 3), ("length", 4)))
