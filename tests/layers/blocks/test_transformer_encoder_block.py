import keras
import numpy as np
import pytest
from block_reference import encoder_block
from harness import LayerHarness

from keras_tfam.layers import MultiHeadAttention, RotaryEmbedding, TransformerEncoderBlock

rng = np.random.default_rng(0)


class TestEncoderBlockHarness(LayerHarness):
    layer_cls = TransformerEncoderBlock
    init_kwargs = {
        "num_heads": 2,
        "intermediate_dim": 16,
        "norm": "rms",
        "norm_position": "pre",
        "position": RotaryEmbedding(),
    }

    def make_inputs(self):
        return {
            "inputs": rng.normal(size=(2, 5, 8)).astype("float32"),
            "padding_mask": np.array([[1] * 5, [1] * 3 + [0] * 2], bool),
        }


class TestEncoderBlockInjectedAttentionHarness(LayerHarness):
    layer_cls = TransformerEncoderBlock
    init_kwargs = {
        "num_heads": 2,
        "intermediate_dim": 16,
        "norm": "scale",
        "attention": MultiHeadAttention(4, 3, num_key_value_heads=1),
    }

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 5, 8)).astype("float32")}


@pytest.mark.parametrize("norm", ["layer", "rms", "scale"])
@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_matches_numpy(norm, norm_position):
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    padding = np.array([[1] * 6, [1] * 4 + [0] * 2], bool)
    block = TransformerEncoderBlock(2, 16, norm=norm, norm_position=norm_position, bias_initializer="random_normal")
    out = np.asarray(block(x, padding_mask=padding))
    mask = padding[:, None, :] & padding[:, :, None]
    np.testing.assert_allclose(out, encoder_block(block, x, mask), rtol=1e-4, atol=1e-4)


def test_injected_attention_is_the_one_used():
    attention = MultiHeadAttention(4, 3)
    block = TransformerEncoderBlock(2, 16, attention=attention)
    x = rng.normal(size=(1, 4, 8)).astype("float32")
    block(x)
    assert block.attention_layer is attention
    np.testing.assert_allclose(block(x), encoder_block(block, x, None), rtol=1e-4, atol=1e-4)


def test_keras_mask_equals_explicit_padding():
    tokens = np.array([[1, 2, 3, 0], [4, 5, 6, 7]])
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    block = TransformerEncoderBlock(2, 16)
    x = embedding(tokens)
    np.testing.assert_allclose(block(x), block(np.asarray(x), padding_mask=tokens != 0), atol=1e-6)


def test_permutation_equivariant_without_positions():
    x = rng.normal(size=(1, 6, 8)).astype("float32")
    block = TransformerEncoderBlock(2, 16)
    perm = rng.permutation(6)
    np.testing.assert_allclose(np.asarray(block(x))[:, perm], block(x[:, perm]), atol=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: norm_position='middle'"):
        TransformerEncoderBlock(2, 8, norm_position="middle")
    with pytest.raises(ValueError, match="Received: norm='batch'"):
        TransformerEncoderBlock(2, 8, norm="batch")
    with pytest.raises(ValueError, match="hidden size=10, num_heads=4"):
        TransformerEncoderBlock(4, 8)(np.zeros((1, 2, 10), "float32"))
    with pytest.raises(ValueError, match="give the position scheme to the injected `attention`"):
        TransformerEncoderBlock(2, 8, attention=MultiHeadAttention(2, 4), position=RotaryEmbedding())
    with pytest.raises(ValueError, match="Received: attention='linear'"):
        TransformerEncoderBlock(2, 8, attention="linear")
