"""What the token-ids models are called with: `(batch, length)` integer ids, refused in one line otherwise, in
eager, symbolic and compiled calls alike (the checks are on static shapes and dtypes)."""

import keras
import numpy as np
import pytest
from backend import compiled

from keras_tfam.models import GPT2LM, AttentionPoolingLM, TransformerXLLM
from keras_tfam.models.token_ids import check_token_ids

IDS = np.array([[1, 2, 3, 4]], "int32")


def gpt2(**overrides):
    return GPT2LM(**{"vocabulary_size": 50, "num_layers": 1, "num_heads": 2, "hidden_dim": 16, **overrides})


@pytest.mark.parametrize(
    "ids, message",
    [
        (IDS.astype("float32"), r"must be integer token ids. Received: token_ids.dtype=float32"),
        (IDS == 1, r"must be integer token ids. Received: token_ids.dtype=bool"),
        (IDS[0], r"must be \(batch, length\) token ids.* Received: token_ids.shape=\(4,\)"),
        (IDS[..., None], r"Received: token_ids.shape=\(1, 4, 1\)"),
        (IDS[:, :0], r"at least one row of one id. Received: token_ids.shape=\(1, 0\)"),
        (IDS[:0], r"Received: token_ids.shape=\(0, 4\)"),
    ],
)
def test_a_decoder_lm_refuses_ids_of_another_rank_dtype_or_size(ids, message):
    model = gpt2(max_sequence_length=16)
    with pytest.raises(ValueError, match=message):
        model(ids)
    if len(ids):  # (Keras' predict runs no step on no rows)
        with pytest.raises(ValueError, match=message):
            model.predict(ids, verbose=0)


def test_learned_positions_bound_the_length_in_one_line():
    model = gpt2(max_sequence_length=8)
    np.testing.assert_array_equal(np.asarray(model(np.zeros((1, 8), "int32"))).shape, (1, 8, 50))
    with pytest.raises(ValueError, match=r"at most 8 positions long .* Received: token_ids.shape=\(1, 9\)"):
        model(np.zeros((1, 9), "int32"))
    rotary = gpt2(max_sequence_length=8, position="rotary")  # relative positions: any length
    assert rotary(np.zeros((1, 12), "int32")).shape == (1, 12, 50)


def test_the_checks_hold_in_compiled_and_symbolic_calls_and_accept_every_integer_type():
    model = gpt2(max_sequence_length=16)
    expected = np.asarray(model(IDS))
    for dtype in ("int64", "int16", "uint8"):
        np.testing.assert_array_equal(np.asarray(model(IDS.astype(dtype))), expected)
    np.testing.assert_allclose(np.asarray(compiled(lambda ids: model(ids))(IDS)), expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"Received: token_ids.dtype=float32"):
        compiled(lambda ids: model(ids))(IDS.astype("float32"))
    assert model(keras.Input((None,), dtype="int32")).shape == (None, None, 50)
    with pytest.raises(ValueError, match=r"Received: token_ids.shape=\(None, 4, 2\)"):
        check_token_ids(keras.Input((4, 2), dtype="int32"))
    check_token_ids([[1, 2], [3, 4]])  # nested lists of ids
    check_token_ids({"token_ids": IDS})  # nested inputs are Keras' to check


def test_every_token_ids_model_refuses_float_ids():
    txl = TransformerXLLM(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16, memory_length=4)
    pooling = AttentionPoolingLM(vocabulary_size=50, context_length=8, num_layers=1, num_heads=2, hidden_dim=16)
    for model, length in ((txl, 4), (pooling, 8)):
        with pytest.raises(ValueError, match=r"`token_ids` must be integer token ids"):
            model(np.zeros((1, length), "float32"))
