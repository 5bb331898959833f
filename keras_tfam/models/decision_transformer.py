"""Decision Transformer (Chen et al. 2021): offline RL as return-conditioned sequence modelling."""

import keras
import numpy as np
from keras import ops

from keras_tfam.layers.blocks.transformer_decoder_block import TransformerDecoderBlock
from keras_tfam.models.functional_model import FunctionalModel
from keras_tfam.utils import base_model_config, check_positive_int, head_size

_INPUTS = ("returns_to_go", "states", "actions", "timesteps")


@keras.saving.register_keras_serializable(package="keras_tfam")
class DecisionTransformer(FunctionalModel):
    """A GPT-2 decoder over (return-to-go, state, action) tokens that predicts actions.

    Chen et al. 2021. A trajectory of `T` steps becomes the `3T` tokens
    `R_1, s_1, a_1, R_2, s_2, a_2, ...`, where `R_t` is the return-to-go
    (the sum of the rewards from step `t` on). Each modality has its own
    embedding (linear for the scalar return and the state vector, a table for
    the discrete action) and a learned embedding of the environment timestep
    `t` is added to all three tokens of the step; then a LayerNorm, dropout
    and a causal stack of pre-norm GPT-2 blocks (no other position
    embedding, as in the paper). The action `a_t` is predicted from the
    output at the `s_t` token, which sees `R_1..R_t`, `s_1..s_t` and
    `a_1..a_{t-1}`: at evaluation, condition on the return you want and
    feed the actions taken so far (the action input of the last step is not
    read for its own prediction).

    Actions are discrete (cross-entropy on the logits, as in the paper's
    Atari experiments).

    Args:
        state_dim: size of a state vector.
        num_actions: number of discrete actions.
        max_timestep: size of the timestep embedding table (timesteps are
            in `[0, max_timestep)`; others are refused, see `inputs`).
        hidden_dim: model width.
        num_layers: decoder blocks.
        num_heads: attention heads.
        intermediate_dim: feed-forward width; default `4 * hidden_dim`.
        dropout: dropout on the embeddings, residual branches and attention.
        return_scale: returns-to-go are divided by it before embedding (the
            paper scales by the environment's return range).

    Call arguments:
        inputs: a dict of `returns_to_go` float `(B, T)`, `states` float
            `(B, T, state_dim)`, `actions` int `(B, T)`, `timesteps` int
            `(B, T)`, all with the same `T`. Actions must be in
            `[0, num_actions)` and timesteps in `[0, max_timestep)`: an eager
            call, and `fit` / `evaluate` / `predict` given the trajectories as
            arrays (or as `validation_data`), raise a `ValueError` naming the
            first other one. Where the values are known only inside the
            traced step (a `tf.data` pipeline, a generator, a compiled call),
            nothing can be raised: such a trajectory's logits are NaN for
            every step, so the loss shows it (an embedding lookup would wrap
            a negative id, or clamp a large one under XLA, silently).

    Returns:
        float32 action logits `(B, T, num_actions)`; row `t` predicts `a_t`.

    Examples:
        >>> model = DecisionTransformer(state_dim=11, num_actions=4, max_timestep=1000, hidden_dim=32, num_layers=1)
        >>> trajectories = {  # 8 trajectories of 20 steps
        ...     "returns_to_go": np.random.rand(8, 20), "states": np.random.rand(8, 20, 11),
        ...     "actions": np.random.randint(0, 4, (8, 20)), "timesteps": np.tile(np.arange(20), (8, 1))}
        >>> model.compile("adamw", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        >>> history = model.fit(trajectories, trajectories["actions"], epochs=1, verbose=0)
        >>> next_actions = model.predict(trajectories, verbose=0)[:, -1].argmax(-1)
        >>> next_actions.shape
        (8,)
    """

    def __init__(
        self,
        state_dim,
        num_actions,
        max_timestep,
        hidden_dim=128,
        num_layers=3,
        num_heads=1,
        intermediate_dim=None,
        dropout=0.1,
        return_scale=1.0,
        **kwargs,
    ):
        state_dim = check_positive_int("state_dim", state_dim)
        num_actions = check_positive_int("num_actions", num_actions)
        max_timestep = check_positive_int("max_timestep", max_timestep)
        hidden_dim = check_positive_int("hidden_dim", hidden_dim)
        num_layers = check_positive_int("num_layers", num_layers)
        num_heads = check_positive_int("num_heads", num_heads)
        head_size("hidden_dim", hidden_dim, num_heads)
        if not _is_real(dropout) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout!r}")
        if not _is_real(return_scale) or not 0 < return_scale < float("inf"):
            raise ValueError(f"`return_scale` must be positive and finite. Received: return_scale={return_scale!r}")
        intermediate_dim = (
            4 * hidden_dim if intermediate_dim is None else check_positive_int("intermediate_dim", intermediate_dim)
        )
        dtype = kwargs.pop("dtype", None)
        initializer = keras.initializers.RandomNormal(stddev=0.02)

        # === Layers ===
        self.return_embedding = keras.layers.Dense(hidden_dim, dtype=dtype, name="return_embedding")
        self.state_embedding = keras.layers.Dense(hidden_dim, dtype=dtype, name="state_embedding")
        self.action_embedding = keras.layers.Embedding(
            num_actions, hidden_dim, embeddings_initializer=initializer, dtype=dtype, name="action_embedding"
        )
        self.timestep_embedding = keras.layers.Embedding(
            max_timestep, hidden_dim, embeddings_initializer=initializer, dtype=dtype, name="timestep_embedding"
        )
        self.embedding_norm = keras.layers.LayerNormalization(epsilon=1e-5, dtype=dtype, name="embedding_norm")
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embedding_dropout")
        self.transformer_blocks = [
            TransformerDecoderBlock(
                num_heads,
                intermediate_dim,
                dropout=dropout,
                attention_dropout=dropout,
                activation="gelu_tanh",
                norm_position="pre",
                kernel_initializer=initializer,
                dtype=dtype,
                name=f"transformer_block_{i}",
            )
            for i in range(num_layers)
        ]
        self.final_norm = keras.layers.LayerNormalization(epsilon=1e-5, dtype=dtype, name="final_norm")
        self.action_head = keras.layers.Dense(num_actions, dtype=dtype, name="action_head")

        # === Functional model ===
        inputs = {
            "returns_to_go": keras.Input((None,), dtype="float32", name="returns_to_go"),
            "states": keras.Input((None, state_dim), dtype="float32", name="states"),
            "actions": keras.Input((None,), dtype="int32", name="actions"),
            "timesteps": keras.Input((None,), dtype="int32", name="timesteps"),
        }
        # Lookups wrap negative ids, and clamp large ones under XLA, where no error can be raised: in a traced
        # call such an id is looked up as 0 and its trajectory's logits are NaN (eager calls raise, see `call`).
        outside_actions = _outside(inputs["actions"], num_actions)  # [B, T]
        outside_timesteps = _outside(inputs["timesteps"], max_timestep)
        actions = ops.where(outside_actions, 0, inputs["actions"])
        time = self.timestep_embedding(ops.where(outside_timesteps, 0, inputs["timesteps"]))  # [B, T, D]
        returns = ops.expand_dims(inputs["returns_to_go"], -1) / return_scale
        tokens = ops.stack(
            [
                self.return_embedding(returns) + time,
                self.state_embedding(inputs["states"]) + time,
                self.action_embedding(actions) + time,
            ],
            axis=2,
        )  # [B, T, 3, D]: R_t, s_t, a_t
        hidden = keras.layers.Reshape((-1, hidden_dim), name="interleave")(tokens)  # [B, 3T, D]: R_1, s_1, a_1, ...
        hidden = self.embedding_dropout(self.embedding_norm(hidden))
        for block in self.transformer_blocks:
            hidden = block(hidden)
        hidden = keras.layers.Reshape((-1, 3, hidden_dim), name="steps")(self.final_norm(hidden))  # [B, T, 3, D]
        logits = ops.cast(self.action_head(hidden[:, :, 1]), "float32")  # read at the s_t tokens
        outside = ops.logical_or(outside_actions, outside_timesteps)
        poisoned = ops.any(outside, axis=1, keepdims=True)[:, :, None]  # [B, 1, 1]
        logits = ops.where(poisoned, ops.full_like(logits, float("nan")), logits)
        super().__init__(inputs=inputs, outputs=logits, dtype=dtype, **kwargs)

        # === Config ===
        self.state_dim = state_dim
        self.num_actions = num_actions
        self.max_timestep = max_timestep
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.return_scale = return_scale

    def call(self, inputs, training=None, mask=None):
        self._check_trajectory(inputs)
        self._check_ids(inputs)
        return super().call(inputs, training=training, mask=mask)

    # The trajectories of `fit`, `evaluate` and `predict` given as arrays are checked before any trace.
    def fit(self, *args, **kwargs):
        self._check_arrays(args[0] if args else kwargs.get("x"))
        validation = kwargs.get("validation_data")
        if isinstance(validation, (tuple, list)) and validation:
            self._check_arrays(validation[0])
        return super().fit(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        self._check_arrays(args[0] if args else kwargs.get("x"))
        return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        self._check_arrays(args[0] if args else kwargs.get("x"))
        return super().predict(*args, **kwargs)

    def _check_arrays(self, inputs):
        if isinstance(inputs, dict) and set(inputs) == set(_INPUTS):
            self._check_ids(inputs)

    def _check_ids(self, inputs):
        """A `ValueError` for an action outside `[0, num_actions)` or a timestep outside `[0, max_timestep)`.

        Checked when the values are known (eager calls); a traced call gives
        NaN logits for such a trajectory instead.
        """
        for name, limit, size in (
            ("actions", "num_actions", self.num_actions),
            ("timesteps", "max_timestep", self.max_timestep),
        ):
            try:
                ids = ops.convert_to_numpy(inputs[name])
            except Exception:  # symbolic or traced: no values yet
                continue
            bad = (ids < 0) | (ids >= size)
            if not np.issubdtype(ids.dtype, np.integer):
                bad = bad | (ids != np.floor(ids)) | ~np.isfinite(ids)
            if np.any(bad):
                where = tuple(int(i) for i in np.argwhere(bad)[0])
                raise ValueError(
                    f"`{name}` must be integers in [0, {size}) ({limit}={size}). "
                    f"Received: {name}={ids[where].item()!r} at index {where}"
                )

    def _check_trajectory(self, inputs):
        if not isinstance(inputs, dict) or set(inputs) != set(_INPUTS):
            got = sorted(inputs) if isinstance(inputs, dict) else type(inputs).__name__
            raise ValueError(f"`inputs` must be a dict with keys {list(_INPUTS)}. Received: {got}")
        lengths = {name: inputs[name].shape[1] for name in _INPUTS}
        known = {length for length in lengths.values() if length is not None}
        if len(known) > 1:
            raise ValueError(
                "Every part of a trajectory must have the same number of steps (axis 1). Received: "
                + ", ".join(f"{name}.shape={tuple(inputs[name].shape)}" for name in _INPUTS)
            )

    def get_config(self):
        return {
            **base_model_config(self),
            "state_dim": self.state_dim,
            "num_actions": self.num_actions,
            "max_timestep": self.max_timestep,
            "hidden_dim": self.hidden_dim,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "intermediate_dim": self.intermediate_dim,
            "dropout": self.dropout,
            "return_scale": self.return_scale,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _is_real(value):
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _outside(ids, size):
    """`(B, T)` bool: which ids are outside `[0, size)`."""
    return ops.logical_or(ops.less(ids, 0), ops.greater_equal(ids, size))
