"""Universal Transformer (Dehghani et al. 2019): one block applied recurrently, optionally with ACT."""

import keras
from keras import ops

from keras_tfam.layers.adaptive.adaptive_computation_time import AdaptiveComputationTime
from keras_tfam.layers.position.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_tfam.ops import masks as mask_ops
from keras_tfam.utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class UniversalTransformer(keras.layers.Layer):
    """A weight-shared block applied recurrently over depth (Dehghani et al. 2019).

    Step `t = 1 .. max_steps` adds the coordinate embedding `P_t`, the
    sinusoid of each position plus the sinusoid of the step,
    `P_t[i, 2j] = sin(i / 10000^(2j/d)) + sin(t / 10000^(2j/d))` (cosines on
    odd dimensions), and applies the same `block`:

        h_t = block(h_{t-1} + P_t)

    Without `halting` the output is `h_{max_steps}`: a stack of `max_steps`
    copies of one block. With `halting=AdaptiveComputationTime(...)` every
    position halts on its own (Graves 2016): a halted position's state is
    copied unchanged to the later steps, the output is ACT's mean-field sum
    of the states, and the ponder cost goes to `add_loss`. Outside training,
    the steps after every position of the batch has halted are skipped.

    Args:
        block: the recurrent layer, `(B, T, D) -> (B, T, D)`, called as
            `block(x, padding_mask=..., attention_mask=..., use_causal_mask=...,
            training=...)` (a `TransformerEncoderBlock`; with
            `use_causal_mask=True` it is a decoder-only block).
        max_steps: number of recurrent steps (the maximum with ACT).
        halting: an `AdaptiveComputationTime` layer, or `None` for a fixed
            number of steps.
        max_wavelength: base of the coordinate sinusoids.

    Call arguments:
        inputs: `(B, T, D)` embeddings.
        padding_mask: boolean `(B, T)`, `True` = real token; default: the
            Keras mask of `inputs`.
        attention_mask: boolean `(B, T, T)`, `True` = may attend.
        use_causal_mask: causal self-attention in the block.
        return_halting: with ACT, also return the `(B, max_steps, T)` halting
            weights and the `(B, T)` number of steps of every position.
        training: whether dropout is active.

    Returns:
        `(B, T, D)`; `(outputs, weights, steps)` with `return_halting`.

    Examples:
        >>> block = TransformerEncoderBlock(num_heads=8, intermediate_dim=2048)
        >>> ut = UniversalTransformer(block, max_steps=8, halting=AdaptiveComputationTime())
        >>> ut(keras.random.normal((2, 16, 512))).shape
        (2, 16, 512)
    """

    def __init__(self, block, max_steps, halting=None, max_wavelength=10000, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(block, keras.layers.Layer):
            raise ValueError(f"`block` must be a Keras layer. Received: block={block!r}")
        check_positive_int("max_steps", max_steps)
        if halting is not None and not isinstance(halting, AdaptiveComputationTime):
            raise ValueError(
                f"`halting` must be an AdaptiveComputationTime layer or None. Received: halting={halting!r}"
            )
        self.block = block
        self.max_steps = max_steps
        self.halting = halting
        self.max_wavelength = max_wavelength
        self.timing = SinusoidalPositionEncoding(max_wavelength, dtype=self.dtype_policy, name="timing")
        self.supports_masking = True

    def build(self, inputs_shape):
        if not self.block.built:
            self.block.build(inputs_shape)
        if self.halting is not None and not self.halting.built:
            self.halting.build(tuple(inputs_shape[:1]) + (self.max_steps,) + tuple(inputs_shape[1:]))
        self.built = True

    def coordinate_embedding(self, inputs, step):
        """`P_step`: `(B, T, D)` sinusoid of the positions plus that of `step` (from 1)."""
        return self.timing(inputs) + self.timing(inputs[:, :1], start_index=step)

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_halting=False,
        training=None,
    ):
        if padding_mask is None:
            padding_mask = mask_ops.keras_mask(inputs)

        def apply_block(state, step):
            return self.block(
                state + self.coordinate_embedding(state, step),
                padding_mask=padding_mask,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
                training=training,
            )

        if self.halting is None:
            state = inputs
            for step in range(1, self.max_steps + 1):
                state = apply_block(state, step)
            return state

        def act_step(state, act_state, step):
            # A halted position keeps its state (Dehghani et al.: copied to the next step).
            halted = act_state["halted"][..., None]
            state = ops.where(halted, state, apply_block(state, step))
            act_state, weights = self.halting.step(act_state, state, last=step == self.max_steps)
            return state, act_state, weights

        state, act_state = inputs, self.halting.initial_state(inputs)
        all_weights = []
        for step in range(1, self.max_steps + 1):
            if training or step == 1:
                state, act_state, weights = act_step(state, act_state, step)
            else:
                # Nothing changes once every position has halted: skip the block.
                state, act_state, weights = ops.cond(
                    ops.all(act_state["halted"]),
                    lambda: (state, act_state, ops.zeros_like(act_state["cumulative"])),
                    lambda: act_step(state, act_state, step),
                )
            all_weights.append(weights)
        self.add_loss(self.halting.ponder_cost(act_state, padding_mask))
        outputs = ops.cast(act_state["output"], self.compute_dtype)
        if return_halting:
            return outputs, ops.stack(all_weights, axis=1), act_state["steps"]
        return outputs

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            block=keras.saving.serialize_keras_object(self.block),
            max_steps=self.max_steps,
            halting=keras.saving.serialize_keras_object(self.halting),
            max_wavelength=self.max_wavelength,
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for name in ("block", "halting"):
            config[name] = keras.saving.deserialize_keras_object(config.get(name))
        return cls(**config)
