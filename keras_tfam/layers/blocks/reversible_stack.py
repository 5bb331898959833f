"""A stack of reversible blocks whose backward pass recomputes activations (Reformer)."""

import keras
from keras import ops

from keras_tfam.layers.blocks.reversible_block import ReversibleBlock
from keras_tfam.ops.autodiff import vjp


@keras.saving.register_keras_serializable(package="keras_tfam")
class ReversibleStack(keras.layers.Layer):
    """`ReversibleBlock`s in sequence, trained without storing their activations.

    Kitaev et al. 2020 (Reformer, section 3): the input is duplicated into
    the two streams, the blocks run one after the other, and the gradient
    is one custom gradient over the whole stack that walks the blocks
    backwards, recomputing each block's inputs from its outputs
    (`ReversibleBlock.inverse`) and differentiating the block there. Only
    the stack's output is kept for the backward pass, so activation memory
    does not grow with depth (time: about one more forward pass). The
    gradients equal those of the same blocks with stored activations
    (`reversible=False`) up to float rounding of the reconstruction.

    Sublayers must not update state during training inside the stack (a
    random-feature redraw, routing centroids): the recomputation runs on
    the values of the call.

    Args:
        blocks: a list of `ReversibleBlock`s.
        reversible: `False` runs the same blocks with stored activations
            (the reference).

    Call arguments:
        inputs: `(B, T, D)`.
        training: passed to the blocks.

    Returns:
        `(B, T, 2D)`: the two output streams side by side (Reformer
        concatenates them before its final norm).

    Example:

    >>> stack = ReversibleStack([ReversibleBlock(4, 1024, use_causal_mask=True) for _ in range(12)])
    >>> stack(keras.random.normal((2, 16, 256))).shape
    (2, 16, 512)
    """

    def __init__(self, blocks, reversible=True, **kwargs):
        super().__init__(**kwargs)
        blocks = list(blocks)
        if not blocks or not all(isinstance(block, ReversibleBlock) for block in blocks):
            raise ValueError(f"`blocks` must be a non-empty list of ReversibleBlock. Received: blocks={blocks!r}")
        self.blocks = blocks
        self.reversible = bool(reversible)

    def build(self, inputs_shape):
        shape = tuple(inputs_shape[:-1]) + (2 * inputs_shape[-1],)
        for block in self.blocks:
            if not block.built:
                block.build(shape)
        self.built = True

    def call(self, inputs, training=None):
        x = ops.concatenate([inputs, inputs], axis=-1)
        if not self.reversible:
            for block in self.blocks:
                x = block(x, training=training)
            return x
        trainable = [v for v in self.trainable_variables]
        # The other variables at their values of this call (and, under a
        # backend's stateless training step, its traced values).
        frozen = [(v, v.value) for v in self.variables if not v.trainable]
        return _reversible_run(self.blocks, trainable, frozen, training)(x, *[v.value for v in trainable])

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (2 * inputs_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(blocks=[keras.saving.serialize_keras_object(b) for b in self.blocks], reversible=self.reversible)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["blocks"] = [keras.saving.deserialize_keras_object(b) for b in config["blocks"]]
        return cls(**config)


def _reversible_run(blocks, trainable, frozen, training):
    """`f(x, *trainable_values)` running `blocks`, with a gradient that recomputes (see `ReversibleStack`)."""
    owned = [{id(v) for v in block.trainable_variables} for block in blocks]

    def scope(values):
        return keras.StatelessScope(state_mapping=frozen + list(zip(trainable, values)))

    @ops.custom_gradient
    def run(x, *values):
        with scope(values):
            for block in blocks:
                x = block(x, training=training)
        outputs = x

        def gradient(upstream, variables=None):
            grads = [ops.zeros_like(value) for value in values]
            y, dy = outputs, upstream
            for block, mine in zip(reversed(blocks), reversed(owned)):
                with scope(values):
                    x = ops.stop_gradient(block.inverse(y, training))
                indices = [i for i, v in enumerate(trainable) if id(v) in mine]

                def forward(x, *block_values, indices=indices, block=block):
                    current = list(values)
                    for i, value in zip(indices, block_values):
                        current[i] = value
                    with scope(current):
                        return block(x, training=training)

                _, (dx, *block_grads) = vjp(forward, [x] + [values[i] for i in indices], dy)
                for i, g in zip(indices, block_grads):
                    grads[i] = grads[i] + g
                y, dy = x, dx
            return (dy, *grads)

        return outputs, gradient

    return run
