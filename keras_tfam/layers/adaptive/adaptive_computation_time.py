"""Adaptive Computation Time (Graves 2016): per-position halting over recurrent steps."""

import keras
from keras import ops

from keras_tfam.ops import masks as mask_ops


@keras.saving.register_keras_serializable(package="keras_tfam")
class AdaptiveComputationTime(keras.layers.Layer):
    """Halting units and the mean-field output of ACT (Graves 2016), per position.

    After step `n` a halting unit gives every position `p_n = sigmoid(W s_n
    + b)`. A position halts at the first step `N` where `p_1 + ... + p_N >=
    1 - epsilon`, or at the last step. Its output is the mean-field sum
    `sum_n w_n s_n` with `w_n = p_n` for `n < N` and the remainder
    `w_N = R = 1 - (p_1 + ... + p_{N-1})`, so the weights of every position
    sum to 1. The ponder cost `N + R`, averaged over the real positions and
    scaled by `ponder_cost_weight`, goes to `add_loss`; its gradient flows
    through `R`, pushing towards fewer steps.

    The Universal Transformer drives it step by step (`initial_state`,
    `step`, `finish`); as a layer of its own it reads the states of all the
    steps at once.

    Args:
        epsilon: halting threshold is `1 - epsilon`, in `(0, 1)`.
        ponder_cost_weight: `tau`, the weight of the ponder cost (`>= 0`).
        halting_bias_initializer: initializer of the halting unit's bias (a
            positive bias halts early at the start of training; Graves and
            the Universal Transformer start from 1).
        kernel_initializer: initializer of the halting unit's kernel.

    Call arguments:
        step_states: `(B, S, T, D)`, the states `s_1 .. s_S` of `S` steps.
        padding_mask: boolean `(B, T)`, `True` = real position (excluded
            from the ponder cost otherwise).
        return_halting: also return the `(B, S, T)` halting weights `w_n`
            and the `(B, T)` step counts `N`.

    Returns:
        `(B, T, D)` mean-field outputs (float32 sums cast to the compute
        dtype); with `return_halting`, `(outputs, weights, steps)`.

    Examples:
        >>> act = AdaptiveComputationTime(epsilon=0.01, ponder_cost_weight=0.01)
        >>> outputs = act(keras.random.normal((2, 6, 10, 32)))  # 6 steps, 10 positions
    """

    def __init__(
        self,
        epsilon=0.01,
        ponder_cost_weight=0.01,
        halting_bias_initializer=keras.initializers.Constant(1.0),
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not 0.0 < epsilon < 1.0:
            raise ValueError(f"`epsilon` must be in (0, 1). Received: epsilon={epsilon}")
        if ponder_cost_weight < 0:
            raise ValueError(f"`ponder_cost_weight` must be >= 0. Received: ponder_cost_weight={ponder_cost_weight}")
        self.epsilon = epsilon
        self.ponder_cost_weight = ponder_cost_weight
        self.halting_bias_initializer = keras.initializers.get(halting_bias_initializer)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def build(self, step_states_shape):
        self.halting_unit = keras.layers.Dense(
            1,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.halting_bias_initializer,
            dtype=self.dtype_policy,
            name="halting_unit",
        )
        self.halting_unit.build(tuple(step_states_shape[:1]) + tuple(step_states_shape[-2:]))
        self.built = True

    def initial_state(self, states):
        """The bookkeeping before the first step, for states shaped like `states (B, T, D)`."""
        shape = ops.shape(states)
        zeros = ops.zeros((shape[0], shape[1]), "float32")
        return {
            "halted": ops.zeros((shape[0], shape[1]), "bool"),
            "cumulative": zeros,  # sum of p over the steps before halting
            "remainder": zeros,
            "steps": zeros,  # N, as a float
            "output": ops.zeros(shape, "float32"),
        }

    def step(self, act_state, states, last=False):
        """Folds in the states after one step; returns `(act_state, weights (B, T))`.

        `last` (a Python bool) makes every position still running halt here.
        """
        p = ops.cast(ops.sigmoid(self.halting_unit(states)), "float32")[..., 0]  # [B, T]
        running = ops.logical_not(act_state["halted"])
        cumulative = act_state["cumulative"]
        halts = ops.logical_and(running, cumulative + p >= 1.0 - self.epsilon)
        if last:
            halts = running
        remainder = 1.0 - cumulative
        weights = ops.where(halts, remainder, ops.where(running, p, 0.0))
        continues = ops.logical_and(running, ops.logical_not(halts))
        new_state = {
            "halted": ops.logical_or(act_state["halted"], halts),
            "cumulative": cumulative + ops.where(continues, p, 0.0),
            "remainder": ops.where(halts, remainder, act_state["remainder"]),
            "steps": act_state["steps"] + ops.cast(running, "float32"),
            "output": act_state["output"] + weights[..., None] * ops.cast(states, "float32"),
        }
        return new_state, weights

    def ponder_cost(self, act_state, padding_mask=None):
        """`ponder_cost_weight` times the mean of `N + R` over the real positions."""
        cost = act_state["steps"] + act_state["remainder"]
        if padding_mask is None:
            return self.ponder_cost_weight * ops.mean(cost)
        keep = ops.cast(padding_mask, "float32")
        return self.ponder_cost_weight * ops.sum(cost * keep) / ops.maximum(ops.sum(keep), 1.0)

    def call(self, step_states, padding_mask=None, return_halting=False):
        if padding_mask is None:
            padding_mask = mask_ops.keras_mask(step_states)
        num_steps = step_states.shape[1]
        act_state = self.initial_state(step_states[:, 0])
        weights = []
        for n in range(num_steps):
            act_state, step_weights = self.step(act_state, step_states[:, n], last=n == num_steps - 1)
            weights.append(step_weights)
        self.add_loss(self.ponder_cost(act_state, padding_mask))
        outputs = ops.cast(act_state["output"], self.compute_dtype)
        if return_halting:
            return outputs, ops.stack(weights, axis=1), act_state["steps"]
        return outputs

    def compute_output_shape(self, step_states_shape):
        return tuple(step_states_shape[:1]) + tuple(step_states_shape[2:])

    def get_config(self):
        config = super().get_config()
        config.update(
            epsilon=self.epsilon,
            ponder_cost_weight=self.ponder_cost_weight,
            halting_bias_initializer=keras.initializers.serialize(self.halting_bias_initializer),
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
