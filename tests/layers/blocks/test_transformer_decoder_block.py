import numpy as np
import pytest
from block_reference import decoder_block
from harness import LayerHarness

from keras_tfam.layers import (
    ALiBiBias,
    RelativePositionBias,
    RotaryEmbedding,
    TransformerDecoderBlock,
)

rng = np.random.default_rng(0)


class TestDecoderOnlyBlockHarness(LayerHarness):
    layer_cls = TransformerDecoderBlock
    init_kwargs = {
        "num_heads": 2,
        "intermediate_dim": 16,
        "norm_position": "pre",
        "activation": "gelu_tanh",
        "position": ALiBiBias(2),
    }

    def make_inputs(self):
        return {"decoder_sequence": rng.normal(size=(2, 5, 8)).astype("float32")}


class TestCrossAttentionBlockHarness(LayerHarness):
    layer_cls = TransformerDecoderBlock
    init_kwargs = {"num_heads": 2, "intermediate_dim": 16, "num_key_value_heads": 1}

    def make_inputs(self):
        return {
            "decoder_sequence": rng.normal(size=(2, 5, 8)).astype("float32"),
            "encoder_sequence": rng.normal(size=(2, 7, 6)).astype("float32"),
            "encoder_padding_mask": np.array([[1] * 7, [1] * 2 + [0] * 5], bool),
        }


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_matches_numpy_with_cross_attention(norm_position):
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    source = rng.normal(size=(2, 9, 6)).astype("float32")
    source_padding = np.array([[1] * 9, [1] * 4 + [0] * 5], bool)
    block = TransformerDecoderBlock(2, 16, norm_position=norm_position, bias_initializer="random_normal")
    out = np.asarray(block(x, source, encoder_padding_mask=source_padding))
    causal = np.tril(np.ones((1, 5, 5), bool))
    expected = decoder_block(block, x, causal, source, source_padding[:, None, :])
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


POSITIONS = {
    "none": lambda: None,
    "rotary": RotaryEmbedding,
    "alibi": lambda: ALiBiBias(4),
    "relative": lambda: RelativePositionBias(4, bidirectional=False, embeddings_initializer="random_normal"),
}


@pytest.mark.parametrize("position", list(POSITIONS))
def test_cache_equals_full_pass(position):
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    block = TransformerDecoderBlock(4, 32, num_key_value_heads=2, norm_position="pre", position=POSITIONS[position]())
    full = np.asarray(block(x))
    cache = np.zeros((2, 2, 8, 2, 4), "float32")
    out, cache = block(x[:, :2], self_attention_cache=cache, self_attention_cache_update_index=0)
    outs = [np.asarray(out)]
    for t in range(2, 6):
        out, cache = block(x[:, t : t + 1], self_attention_cache=cache, self_attention_cache_update_index=t)
        outs.append(np.asarray(out))
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, atol=1e-5)


def test_cached_cross_attention_decoding():
    x = rng.normal(size=(2, 4, 8)).astype("float32")
    source = rng.normal(size=(2, 7, 8)).astype("float32")
    block = TransformerDecoderBlock(2, 16)
    full = np.asarray(block(x, source))
    cross = block.cross_attention_layer.compute_key_value_cache(source)
    cache = np.zeros((2, 2, 4, 2, 4), "float32")
    outs = []
    for t in range(4):
        out, cache = block(
            x[:, t : t + 1],
            cross_attention_cache=cross,
            self_attention_cache=cache,
            self_attention_cache_update_index=t,
        )
        outs.append(np.asarray(out))
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, atol=1e-5)


def test_causality():
    x = rng.normal(size=(1, 7, 8)).astype("float32")
    block = TransformerDecoderBlock(2, 16, position=RotaryEmbedding())
    base = np.asarray(block(x))
    changed = x.copy()
    changed[:, 4:] += 1.0
    np.testing.assert_allclose(np.asarray(block(changed))[:, :4], base[:, :4], atol=1e-6)


def test_source_mismatch_errors():
    block = TransformerDecoderBlock(2, 16)
    block(np.zeros((1, 3, 8), "float32"))
    with pytest.raises(ValueError, match="built without cross-attention"):
        block(np.zeros((1, 3, 8), "float32"), np.zeros((1, 4, 8), "float32"))
    block = TransformerDecoderBlock(2, 16)
    block(np.zeros((1, 3, 8), "float32"), np.zeros((1, 4, 8), "float32"))
    with pytest.raises(ValueError, match="Received: encoder_sequence=None"):
        block(np.zeros((1, 3, 8), "float32"))


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("with_source", [False, True])
def test_the_symbolic_output_is_what_the_call_returns(policy, with_source):
    # `compute_output_spec` answers without tracing `call`: the shape and dtype must be the call's own.
    import keras

    keras.config.set_dtype_policy(policy)
    block = TransformerDecoderBlock(2, 16, norm_position="pre")
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    source = rng.normal(size=(2, 3, 6)).astype("float32") if with_source else None
    symbolic = block(keras.KerasTensor((None, 5, 8)), keras.KerasTensor((None, 3, 6)) if with_source else None)
    real = block(x, source)
    assert symbolic.shape == (None, 5, 8) and tuple(real.shape) == (2, 5, 8)
    assert keras.backend.standardize_dtype(symbolic.dtype) == keras.backend.standardize_dtype(real.dtype)


def test_a_symbolic_call_with_a_cache_returns_the_cache_too():
    import keras

    block = TransformerDecoderBlock(2, 16, norm_position="pre")
    block.build((None, 1, 8))
    outputs, cache = block(
        keras.KerasTensor((2, 1, 8)),
        self_attention_cache=keras.KerasTensor((2, 2, 4, 2, 4)),
        self_attention_cache_update_index=0,
    )
    assert outputs.shape == (2, 1, 8) and cache.shape == (2, 2, 4, 2, 4)
