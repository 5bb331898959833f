import keras
import numpy as np
import pytest
from harness import LayerHarness

from keras_tfam.layers import RotaryEmbedding
from keras_tfam.layers.attention.performer_attention import PerformerAttention
from keras_tfam.layers.blocks.reversible_block import ReversibleBlock
from keras_tfam.layers.blocks.reversible_stack import ReversibleStack

rng = np.random.default_rng(0)


class TestReversibleBlockHarness(LayerHarness):
    layer_cls = ReversibleBlock
    init_kwargs = {"num_heads": 2, "intermediate_dim": 16, "use_causal_mask": True, "position": RotaryEmbedding()}

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 5, 16)).astype("float32")}


class TestReversibleStackHarness(LayerHarness):
    layer_cls = ReversibleStack

    @property
    def init_kwargs(self):
        return {"blocks": [ReversibleBlock(2, 16, use_causal_mask=True, norm="rms") for _ in range(2)]}

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 5, 8)).astype("float32")}


def test_inverse_recovers_the_inputs():
    block = ReversibleBlock(2, 16, use_causal_mask=True)
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(block.inverse(block(x))), x, atol=1e-5)


def _blocks():
    return [
        ReversibleBlock(2, 32, use_causal_mask=True, position=RotaryEmbedding()),
        ReversibleBlock(
            2,
            16,
            norm="rms",
            activation="swiglu",
            use_causal_mask=True,
            attention=PerformerAttention(2, 8, num_features=16, seed=0),
        ),
    ]


def _one_sgd_step(reversible, x, y, initial=None):
    """Weights before and after one SGD step of learning rate 1 (after = before - gradient), and which are trainable."""
    stack = ReversibleStack(_blocks(), reversible=reversible)
    inputs = keras.Input(x.shape[1:])
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(stack(inputs)))
    if initial is not None:
        model.set_weights(initial)
    # Compiled on JAX (eager JAX is slow), a plain graph on TensorFlow (XLA compiles slowly; the harness has it).
    model.compile(keras.optimizers.SGD(1.0), "mse", jit_compile=keras.config.backend() == "jax")
    before = model.get_weights()
    model.train_on_batch(x, y)
    trainable = {id(w) for w in model.trainable_weights}
    return before, model.get_weights(), [id(w) in trainable for w in model.weights]


def test_gradients_equal_those_of_stored_activations():
    x = rng.normal(size=(2, 8, 16)).astype("float32")
    y = rng.normal(size=(2, 8, 3)).astype("float32")
    initial, stored, trainable = _one_sgd_step(False, x, y)
    _, recomputed, _ = _one_sgd_step(True, x, y, initial)
    changed = [bool(np.any(a != b)) for a, b in zip(initial, stored)]
    assert changed == trainable  # every trainable weight of the blocks and the head has a gradient
    for before, a, b in zip(initial, stored, recomputed):
        np.testing.assert_allclose(b - before, a - before, atol=1e-5)  # the gradients


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: dropout=0.1"):
        ReversibleBlock(2, 8, dropout=0.1)
    with pytest.raises(ValueError, match="Received: norm_position='post'"):
        ReversibleBlock(2, 8, norm_position="post")
    with pytest.raises(ValueError, match="Received: blocks=\\[\\]"):
        ReversibleStack([])
