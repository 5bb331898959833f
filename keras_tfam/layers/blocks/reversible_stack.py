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

    Examples:
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
    """`f(x, *trainable_values)` running `blocks`, with a gradient that recomputes (RevNet's backward).

    For each block, last first, from its outputs `(y1, y2)` and their
    gradients `(dy1, dy2)`: `G` is recomputed at `y1` with its VJP, giving
    `x2 = y2 - G(y1)` and `dz1 = dy1 + G'(y1)^T dy2`; then `F` at `x2`,
    giving `x1 = y1 - F(x2)`, `dx1 = dz1` and `dx2 = dy2 + F'(x2)^T dz1`.
    One recomputation of each branch, and nothing stored but the outputs.
    """
    index = {id(v): i for i, v in enumerate(trainable)}

    def scope(values):
        return keras.StatelessScope(state_mapping=frozen + list(zip(trainable, values)))

    def branch_vjp(branch, layers, inputs, cotangent, values, grads):
        """`branch(inputs)`, accumulating its weights' gradients into `grads`; returns the output and input gradient."""
        positions = [index[id(v)] for layer in layers for v in layer.trainable_variables]

        def run_branch(inputs, *branch_values):
            current = list(values)
            for i, value in zip(positions, branch_values):
                current[i] = value
            with scope(current):
                return branch(inputs, training)

        outputs, (input_grad, *weight_grads) = vjp(run_branch, [inputs] + [values[i] for i in positions], cotangent)
        for i, g in zip(positions, weight_grads):
            grads[i] = grads[i] + g
        return ops.stop_gradient(outputs), input_grad

    @ops.custom_gradient
    def run(x, *values):
        with scope(values):
            for block in blocks:
                x = block(x, training=training)
        outputs = x

        def gradient(*args, upstream=None, variables=None):
            # Keras' portable signature: TensorFlow and JAX pass the upstream gradient alone, PyTorch
            # passes the forward's arguments and `upstream=` by name.
            if upstream is None:
                (upstream,) = args
            grads = [ops.zeros_like(value) for value in values]
            (y1, y2), (dy1, dy2) = ops.split(outputs, 2, axis=-1), ops.split(upstream, 2, axis=-1)
            for block in reversed(blocks):
                feed_forward = (block.feed_forward_norm, block.feed_forward)
                g, from_g = branch_vjp(block.feed_forward_branch, feed_forward, y1, dy2, values, grads)
                x2, dz1 = y2 - g, dy1 + from_g
                attention = (block.attention_norm, block.attention_layer)
                f, from_f = branch_vjp(block.attention_branch, attention, x2, dz1, values, grads)
                (y1, y2), (dy1, dy2) = (y1 - f, x2), (dz1, dy2 + from_f)
            return (ops.concatenate([dy1, dy2], axis=-1), *grads)

        return outputs, gradient

    return run
