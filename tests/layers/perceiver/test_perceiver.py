import keras
import numpy as np
import pytest
from backend import build_optimizer
from harness import LayerHarness
from reference import dense, gelu, layer_norm, multi_head_attention

from keras_tfam.layers import CrossAttentionBlock, PerceiverDecoder, PerceiverEncoder

rng = np.random.default_rng(0)


class TestCrossAttentionBlockHarness(LayerHarness):
    layer_cls = CrossAttentionBlock
    init_kwargs = {"num_heads": 2}

    def make_inputs(self):
        return {
            "query": rng.normal(size=(2, 4, 8)).astype("float32"),
            "value": rng.normal(size=(2, 9, 3)).astype("float32"),
            "value_mask": np.array([[1] * 9, [1] * 5 + [0] * 4], bool),
        }


class TestPerceiverEncoderHarness(LayerHarness):
    layer_cls = PerceiverEncoder
    init_kwargs = {"num_latents": 4, "latent_dim": 8, "num_heads": 2, "num_self_attention_layers": 1}

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 11, 3)).astype("float32")}


class TestPerceiverDecoderHarness(LayerHarness):
    layer_cls = PerceiverDecoder
    init_kwargs = {"num_heads": 2, "use_query_residual": False}

    def make_inputs(self):
        return {
            "queries": rng.normal(size=(2, 3, 6)).astype("float32"),
            "latents": rng.normal(size=(2, 5, 8)).astype("float32"),
        }


def test_cross_attention_block_matches_numpy():
    q = rng.normal(size=(2, 4, 8)).astype("float32")
    x = rng.normal(size=(2, 9, 3)).astype("float32")
    block = CrossAttentionBlock(2)
    out = np.asarray(block(q, x))
    ln = lambda layer, h: layer_norm(h, *layer.get_weights(), 1e-5)  # noqa: E731
    hidden = q + multi_head_attention(
        ln(block.query_norm, q), ln(block.value_norm, x), block.attention.get_weights(), 2, 2
    )
    (w1, b1), (w2, b2) = block.mlp.intermediate_dense.get_weights(), block.mlp.output_dense.get_weights()
    expected = hidden + dense(gelu(dense(ln(block.mlp_norm, hidden), w1, b1)), w2, b2)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_encoder_is_invariant_to_input_permutations_and_padding():
    encoder = PerceiverEncoder(num_latents=6, latent_dim=16, num_heads=2, num_self_attention_layers=2)
    x = rng.normal(size=(2, 13, 3)).astype("float32")
    perm = rng.permutation(13)
    np.testing.assert_allclose(encoder(x), encoder(x[:, perm]), rtol=1e-4, atol=1e-5)
    padded = np.concatenate([x, rng.normal(size=(2, 5, 3)).astype("float32")], axis=1)
    mask = np.array([[1] * 13 + [0] * 5] * 2, bool)
    np.testing.assert_allclose(encoder(padded, mask=mask), encoder(x), rtol=1e-4, atol=1e-5)


@pytest.mark.training
def test_perceiver_io_learns_a_set_majority():
    """Sets of 1..31 (odd) numbers in [0, 1]: is the majority above 0.5? Accuracy >= 95%."""
    keras.utils.set_random_seed(0)
    data = np.random.default_rng(2)

    def sets(count):
        lengths = 2 * data.integers(0, 16, size=count) + 1
        values = data.random((count, 31, 1)).astype("float32")
        mask = np.arange(31)[None] < lengths[:, None]
        above = ((values[..., 0] > 0.5) & mask).sum(1)
        return values, mask, (2 * above > lengths).astype("float32")

    values = keras.Input((31, 1))
    mask = keras.Input((31,), dtype="bool")
    features = keras.layers.Dense(32, activation="relu")(values)
    latents = PerceiverEncoder(num_latents=8, latent_dim=32, num_heads=4, num_self_attention_layers=1)(
        features, mask=mask
    )
    query = keras.layers.Lambda(lambda t: keras.ops.zeros((keras.ops.shape(t)[0], 1, 32)))(latents)
    decoded = PerceiverDecoder(num_heads=1)(query, latents)
    output = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(decoded))
    model = keras.Model([values, mask], output)
    model.compile(
        keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(2e-3, 1024)),
        "binary_crossentropy",
        metrics=["accuracy"],
        jit_compile=True,
    )
    build_optimizer(model)
    x, m, y = sets(8192)
    model.fit([x, m], y, batch_size=64, epochs=8, verbose=0)
    x, m, y = sets(2048)
    accuracy = float(np.mean((model.predict([x, m], verbose=0)[:, 0] > 0.5) == y))
    assert accuracy >= 0.95, accuracy


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: num_latents=0"):
        PerceiverEncoder(0, 8)
    with pytest.raises(ValueError, match="width=6, num_heads=4"):
        CrossAttentionBlock(4)(np.zeros((1, 2, 6), "float32"), np.zeros((1, 3, 2), "float32"))
