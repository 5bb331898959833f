"""DecoderLM's Llama-family options against NumPy: Gemma's RMSNorm gain and embedding scale, the untied
head, head size independent of the width; bad values are one-line errors naming the argument."""

import keras
import numpy as np
import pytest

from keras_tfam.layers import RMSNorm
from keras_tfam.models import DecoderLM


def test_gemma_rms_norm_multiplies_by_one_plus_its_weight():
    x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
    norm = RMSNorm(epsilon=1e-6, scale_offset=1.0)
    norm.build(x.shape)
    weight = np.linspace(-0.5, 0.5, 8).astype("float32")
    norm.scale.assign(weight)
    expected = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * (1 + weight)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(norm(x)), expected, rtol=1e-5, atol=1e-6)
    assert RMSNorm.from_config(norm.get_config()).scale_offset == 1.0


def test_embedding_scale_untied_head_and_wide_heads():
    model = DecoderLM(
        40,
        1,
        2,
        16,
        head_dim=24,
        position="rotary",
        norm="gemma_rms",
        activation="geglu_tanh",
        tie_embeddings=False,
        embedding_scale=4.0,
        use_bias=False,
    )
    ids = np.array([[3, 7, 1]])
    embedded = keras.ops.convert_to_numpy(model.embed(ids))
    table = keras.ops.convert_to_numpy(model.token_embedding.embeddings)
    np.testing.assert_allclose(embedded, 4.0 * table[ids], rtol=1e-6)
    attention = model.transformer_blocks[0].self_attention_layer
    assert tuple(attention.query_dense.kernel.shape) == (16, 48)  # 2 heads x 24, wider than the model
    hidden = np.random.default_rng(1).normal(size=(1, 3, 16)).astype("float32")
    head = keras.ops.convert_to_numpy(model.output_head.kernel)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model.logits(hidden)), hidden @ head, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(head_dim=0), r"`head_dim` must be a positive integer.*head_dim=0"),
        (
            dict(embedding_scale=-1.0),
            r"`embedding_scale` must be a finite number > 0\. Received: embedding_scale=-1\.0",
        ),
        (dict(tie_embeddings="no"), r"`tie_embeddings` must be True or False\. Received: tie_embeddings='no'"),
        (dict(position_options={"max_wavelength": 5e5}), r"position='learned' takes none"),
        (dict(position="rotary", position_options={"theta": 5e5}), r"`position_options` do not fit position='rotary'"),
        (dict(norm="gemma"), r"`norm` must be one of \('layer', 'rms', 'gemma_rms', 'scale'\)"),
    ],
)
def test_bad_options_are_named(arguments, message):
    with pytest.raises(ValueError, match=message):
        DecoderLM(**{"vocabulary_size": 20, "num_layers": 1, "num_heads": 2, "hidden_dim": 8, **arguments})
