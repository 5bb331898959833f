import numpy as np
import pytest
from attention_checks import dense_weights
from harness import LayerHarness
from reference import multi_head_attention

from keras_tfam.layers import ALiBiBias, TransformerEncoderBlock
from keras_tfam.layers.attention.linformer_attention import LinformerAttention

rng = np.random.default_rng(0)


class TestLinformerAttentionHarness(LayerHarness):
    layer_cls = LinformerAttention
    init_kwargs = {
        "num_heads": 4,
        "key_dim": 4,
        "num_key_value_heads": 2,
        "sequence_length": 8,
        "projected_length": 3,
        "sharing": "none",
    }

    def make_inputs(self):
        return {
            "query": rng.normal(size=(2, 6, 16)).astype("float32"),
            "query_mask": np.array([[1] * 6, [1] * 4 + [0] * 2], bool),
        }


@pytest.mark.parametrize("sharing", ["headwise", "key_value", "none"])
def test_identity_projections_with_k_equal_to_t_are_full_attention(sharing):
    x = rng.normal(size=(2, 7, 16)).astype("float32")
    layer = LinformerAttention(
        4, 4, sequence_length=7, projected_length=7, sharing=sharing, bias_initializer="random_normal"
    )
    layer(x)
    identity = np.eye(7, dtype="float32")
    for projection in {
        id(layer.key_projection): layer.key_projection,
        id(layer.value_projection): layer.value_projection,
    }.values():
        projection.assign(np.broadcast_to(identity, projection.shape))
    expected = multi_head_attention(x, x, dense_weights(layer), 4, 4)
    np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=1e-4, atol=1e-5)


def test_projects_along_the_sequence():
    x = rng.normal(size=(1, 6, 8)).astype("float32")
    layer = LinformerAttention(2, 4, sequence_length=8, projected_length=3)
    out, weights = layer(x, return_attention_scores=True)
    assert weights.shape == (1, 2, 6, 3)  # (T, k) scores
    wq, bq, wk, bk, wv, bv, wo, bo = dense_weights(layer)
    e = np.asarray(layer.key_projection.value, np.float64)[:, :6]  # the first S columns
    f = np.asarray(layer.value_projection.value, np.float64)[:, :6]
    q, k, v = ((x[0] @ w + b).reshape(6, 2, 4) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    k, v = np.einsum("ps,snh->pnh", e, k), np.einsum("ps,snh->pnh", f, v)
    scores = np.einsum("tnh,pnh->ntp", q, k) / 2.0
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    expected = np.einsum("ntp,pnh->tnh", probs, v).reshape(6, 8) @ wo + bo
    np.testing.assert_allclose(np.asarray(out)[0], expected, rtol=1e-4, atol=1e-5)


def test_padded_keys_are_the_shorter_sequence():
    x = rng.normal(size=(1, 8, 8)).astype("float32")
    layer = LinformerAttention(2, 4, sequence_length=8, projected_length=4)
    mask = np.array([[True] * 5 + [False] * 3])
    padded = np.asarray(layer(x, query_mask=mask, value_mask=mask))
    np.testing.assert_allclose(padded[:, :5], np.asarray(layer(x[:, :5])), rtol=1e-5, atol=1e-6)


def test_in_an_encoder_block_padding_changes_nothing_real():
    x = rng.normal(size=(2, 10, 16)).astype("float32")
    block = TransformerEncoderBlock(4, 32, attention=LinformerAttention(4, 4, sequence_length=10, projected_length=4))
    mask = np.array([[True] * 10, [True] * 6 + [False] * 4])
    changed = x.copy()
    changed[1, 6:] = 100.0
    np.testing.assert_allclose(
        np.asarray(block(changed, padding_mask=mask))[1, :6], np.asarray(block(x, padding_mask=mask))[1, :6], atol=1e-5
    )


def test_bad_input():
    layer = LinformerAttention(2, 4, sequence_length=8, projected_length=4)
    with pytest.raises(ValueError, match="Received: a key sequence of length 9"):
        layer(np.zeros((1, 9, 8), "float32"))
    with pytest.raises(ValueError, match="not causal.*Received: use_causal_mask=True"):
        layer(np.zeros((1, 4, 8), "float32"), use_causal_mask=True)
    with pytest.raises(ValueError, match="no `cache`"):
        layer(np.zeros((1, 4, 8), "float32"), cache=np.zeros((1, 2, 4, 2, 4), "float32"))
    with pytest.raises(ValueError, match="Received: projected_length=0"):
        LinformerAttention(2, 4, sequence_length=8, projected_length=0)
    with pytest.raises(ValueError, match="Received: sharing='layerwise'"):
        LinformerAttention(2, 4, sequence_length=8, sharing="layerwise")
    with pytest.raises(ValueError, match="cannot add a score bias"):
        LinformerAttention(2, 4, sequence_length=8, position=ALiBiBias(2))


@pytest.mark.parametrize("projected_length, sequence_length", [(9, 8), (256, 128), (np.int64(5), np.int64(4))])
def test_projected_length_above_the_sequence_length_is_refused(projected_length, sequence_length):
    with pytest.raises(ValueError) as error:
        LinformerAttention(2, 4, sequence_length=sequence_length, projected_length=projected_length)
    message = str(error.value)
    assert "\n" not in message
    assert message.endswith(f"Received: projected_length={int(projected_length)}")
    assert f"`sequence_length`={int(sequence_length)}" in message
    layer = LinformerAttention(2, 4, sequence_length=np.int64(8), projected_length=np.int64(8))  # k = n is fine
    assert (layer.sequence_length, layer.projected_length) == (8, 8) and type(layer.projected_length) is int
