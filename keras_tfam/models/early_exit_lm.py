"""Confident Adaptive Language Modeling (Schuster et al. 2022): early-exit decoding for a GPT-2 LM."""

import keras
import numpy as np
from keras import ops

from keras_tfam.generation.generator import GenerationMixin
from keras_tfam.generation.protocol import DecodeStep, DecodingModel, DecodingWrapper
from keras_tfam.generation.samplers import first_argmax
from keras_tfam.layers.attention.caches.key_value_cache import KeyValueCache
from keras_tfam.models.decoder_lm import DecoderLM
from keras_tfam.models.model_mixin import ModelMixin
from keras_tfam.models.token_ids import check_token_ids
from keras_tfam.utils import base_model_config, check_positive_int, check_real, is_integer

CONFIDENCES = ("softmax_response", "classifier")


def _check_threshold(threshold):
    """`threshold` as a Python float: a number in [0, 1], NumPy scalars included."""
    return check_real("threshold", threshold, "in [0, 1]", lambda value: 0.0 <= value <= 1.0)


@keras.saving.register_keras_serializable(package="keras_tfam")
class EarlyExitLM(GenerationMixin, DecodingWrapper, ModelMixin, keras.Model):
    """A GPT-2 decoder whose generated tokens leave the stack once confident (CALM).

    Schuster et al. 2022. The `backbone` GPT-2's final norm and tied output
    head form the exit head shared by every layer. While decoding one token
    per step (`call_with_cache` with `T = 1`), after each layer but the last
    a confidence in `[0, 1]` is measured on the intermediate state; a row
    whose confidence exceeds `threshold` exits there: its logits are the
    shared head's on that state, and the layers it skipped get their cache
    entries from that state (CALM's state propagation: the skipped layers'
    keys and values are projected from the exit state). Once every row of
    the batch has exited, the remaining layers are skipped (`ops.cond`);
    until then they run, with exited rows frozen at their exit state. The
    prompt (`T > 1`) and full passes use every layer.

    Confidence measures:
        `"softmax_response"`: top-1 minus top-2 probability of the shared
            head on the state (costs one vocabulary projection per layer).
        `"classifier"`: `sigmoid` of a linear early-exit classifier shared
            across layers, trained with `exit_classifier_model` on the
            consistency oracle (`consistency_labels`); one dot product.

    The threshold never fires at `1.0` (a confidence never exceeds 1), where
    decoding is the ordinary model's, token for token. It is a non-trainable
    variable, so compiled decoding loops and a SavedModel read its current
    value; calibrate it with `keras_tfam.models.learn_then_test` (CALM) or
    `grid_search_threshold` on a validation split.

    CALM fine-tunes the LM so that intermediate states predict well through
    the shared head: `layer_logits_model()` outputs every layer's logits;
    compile it with `loss_weights=EarlyExitLM.calm_loss_weights(L)`.

    Implements the generation protocol with the backbone's caches (local
    layers' rings and sliding windows included), so `generate` decodes
    with early exits under any sampler or beam search, compiled, and in an
    exported SavedModel (`pipelines.export`); its `DecodeStep`s carry the
    final hidden states (the input of the softmax) for retrieval models
    such as `KNNLM`. It is a `DecodingWrapper` of its backbone.

    Args:
        backbone: a `DecoderLM` (`GPT2LM`, an imported Llama, ...) whose attention decodes with key/value caches
            (every kind but the recurrent state of linear attention).
        confidence: `"softmax_response"` or `"classifier"`.
        threshold: exit when the confidence exceeds it, in `[0, 1]`.

    Call arguments:
        token_ids: int `(B, T)`.
        return_hidden_states: also return the final hidden states.
        training: whether dropout is active.

    Returns:
        float32 logits `(B, T, V)` of the last layer; `(logits, hidden
        (B, T, D))` with `return_hidden_states`.

    Examples:
        >>> model = EarlyExitLM(GPT2LM(vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=32), threshold=0.9)
        >>> calm = model.layer_logits_model()  # trains every layer's exit (CALM's weighted loss)
        >>> ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        >>> calm.compile("adamw", [ce] * 2, loss_weights=EarlyExitLM.calm_loss_weights(2))
        >>> tokens = np.random.randint(0, 1000, size=(8, 17))
        >>> history = calm.fit(tokens[:, :-1], [tokens[:, 1:]] * 2, epochs=1, verbose=0)
        >>> model.generate([[464, 329]], max_new_tokens=8, sampler="top_p", seed=0).shape
        (1, 10)
    """

    def __init__(self, backbone, confidence="softmax_response", threshold=1.0, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(backbone, DecoderLM) or not all(
            isinstance(block.self_attention_layer.cache_for(), KeyValueCache) for block in backbone.transformer_blocks
        ):
            raise ValueError(
                "`backbone` must be a DecoderLM whose attention decodes with key/value caches (they are filled for "
                f"the skipped layers; a recurrent state is not). Received: backbone={backbone!r}"
            )
        if confidence not in CONFIDENCES:
            raise ValueError(f"`confidence` must be one of {CONFIDENCES}. Received: confidence={confidence!r}")
        threshold = _check_threshold(threshold)
        self.backbone = backbone
        self.confidence = confidence
        self.exit_classifier = None
        if confidence == "classifier":
            self.exit_classifier = keras.layers.Dense(1, dtype=backbone.dtype_policy, name="exit_classifier")
            self.exit_classifier.build((None, None, backbone.hidden_dim))
        self.threshold_variable = keras.Variable(threshold, dtype="float32", trainable=False, name="threshold")
        self.built = backbone.built  # every weight exists (exports need it before any call)

    # ------------------------------------------------------------------ threshold

    @property
    def threshold(self):
        return float(ops.convert_to_numpy(self.threshold_variable))

    @threshold.setter
    def threshold(self, value):
        value = _check_threshold(value)
        self.threshold_variable.assign(value)

    # ------------------------------------------------------------------ the stack

    @property
    def blocks(self):
        return self.backbone.transformer_blocks

    @property
    def num_layers(self):
        return len(self.blocks)

    def exit_head(self, hidden):
        """`(exit states, float32 logits)` of hidden states through the shared final norm and head."""
        states = self.backbone.final_norm(hidden)
        return states, self.backbone.logits(states)

    def _layer_states(self, token_ids, training=None):
        """The residual stream after every block, for a full pass."""
        hidden = self.backbone.embed(token_ids, 0, training)
        states = []
        for block in self.blocks:
            hidden = block(hidden, training=training)
            states.append(hidden)
        return states

    def call(self, token_ids, return_hidden_states=False, training=None):
        states, logits = self.exit_head(self._layer_states(token_ids, training)[-1])
        if return_hidden_states:
            return logits, states
        return logits

    def _confidence(self, hidden):
        """`(confidence (B,), logits (B, 1, V) or None)` of one-token states `(B, 1, D)`."""
        if self.exit_classifier is not None:
            states = self.backbone.final_norm(hidden)
            return ops.cast(ops.sigmoid(self.exit_classifier(states)), "float32")[:, 0, 0], None
        _, logits = self.exit_head(hidden)
        probabilities = ops.softmax(logits[:, 0], axis=-1)  # [B, V]
        # Top-1 minus top-2 by two maxima: XLA sorts the whole row for a top-k on CPU.
        first = ops.max(probabilities, axis=-1)
        top = ops.one_hot(first_argmax(probabilities), self.vocabulary_size, dtype="bool")
        second = ops.max(ops.where(top, -1.0, probabilities), axis=-1)
        return first - second, logits

    # ------------------------------------------------------------------ training

    @staticmethod
    def calm_loss_weights(num_layers):
        """CALM's per-layer loss weights `w_i = i / sum_j j` (deeper layers weigh more)."""
        check_positive_int("num_layers", num_layers)
        total = num_layers * (num_layers + 1) / 2
        return [i / total for i in range(1, num_layers + 1)]

    def layer_logits_model(self):
        """A functional model `token_ids -> [logits after layer 1, ..., after layer L]` sharing the weights."""
        token_ids = keras.Input((None,), dtype="int32", name="token_ids")
        outputs = [self.exit_head(hidden)[1] for hidden in self._layer_states(token_ids)]
        return keras.Model(token_ids, outputs, name="layer_logits")

    def exit_classifier_model(self):
        """A functional model `token_ids -> (B, T, L - 1)` exit probabilities after layers 1..L-1.

        Train it (backbone frozen) on `consistency_labels` with binary
        cross-entropy: CALM's early-exit classifier.
        """
        if self.exit_classifier is None:
            raise ValueError('This model has no exit classifier. Received: confidence="softmax_response"')
        token_ids = keras.Input((None,), dtype="int32", name="token_ids")
        states = self._layer_states(token_ids)[:-1]
        probabilities = [ops.sigmoid(self.exit_classifier(self.backbone.final_norm(h)))[..., 0] for h in states]
        return keras.Model(token_ids, ops.stack(probabilities, axis=-1), name="exit_classifier_model")

    def consistency_labels(self, token_ids, batch_size=16):
        """`(N, T, L - 1)` float32 NumPy: 1 where layer `i`'s top token equals the last layer's.

        CALM's consistency oracle for training the exit classifier.
        """
        check_token_ids(token_ids)
        batch_size = check_positive_int("batch_size", batch_size)
        layer_logits = self.layer_logits_model()
        labels = []
        for start in range(0, len(token_ids), batch_size):
            logits = [np.asarray(ops.convert_to_numpy(x)) for x in layer_logits(token_ids[start : start + batch_size])]
            final = logits[-1].argmax(-1)
            labels.append(np.stack([(x.argmax(-1) == final) for x in logits[:-1]], axis=-1))
        return np.concatenate(labels).astype("float32")

    def draft_model(self, num_layers=1):
        """The first `num_layers` blocks through the shared exit head, as a draft model of the backbone:
        self-speculation (LayerSkip, Elhoushi et al. 2024), exact.

        Examples:
            >>> model = EarlyExitLM(GPT2LM(vocabulary_size=64, num_layers=3, num_heads=2, hidden_dim=16))
            >>> plain = model.backbone.generate([[5, 7]], max_new_tokens=8)
            >>> drafted = model.backbone.generate([[5, 7]], 8, draft_model=model.draft_model(1), num_draft_tokens=3)
            >>> bool((drafted == plain).all())
            True
        """
        return FirstLayers(self.backbone, num_layers)

    # ------------------------------------------------------------------ generation protocol (delegated)

    @property
    def wrapped(self):
        return self.backbone

    def _propagate(self, block, hidden, layer_cache, index, window):
        """The cache of a skipped block with the keys/values projected from the exit state."""
        return block.self_attention_layer.write_cache(layer_cache, block.self_attention_norm(hidden), index, window)

    reads_prompt_rows = True
    serves_token_ids = True

    def call_with_cache(self, token_ids, cache, index, window=None, prompt_rows=None):
        """Runs `token_ids (B, T)` at positions `index ..`; one-token steps may exit early.

        `prompt_rows` (`(B,)` bool, from the generator) marks the rows whose
        token is still part of their prompt: those run every layer.

        Returns a `DecodeStep` (logits `(B, T, V)` float32, cache, hidden states).
        """
        step = self.early_exit_step(token_ids, cache, index, window, prompt_rows)
        return DecodeStep(step["logits"], step["cache"], step["hidden_states"])

    def early_exit_step(self, token_ids, cache, index, window=None, prompt_rows=None):
        """`call_with_cache` with its details: a dict of `logits`, `hidden_states`, `cache`
        and `exit_layers` (`(B,)` int32, the number of blocks each row ran)."""
        batch = ops.shape(token_ids)[0]
        if token_ids.shape[1] != 1:
            logits, cache, states = self.backbone.call_with_cache(token_ids, cache, index, window=window)
            exit_layers = ops.full((batch,), self.num_layers, "int32")
            return {"logits": logits, "hidden_states": states, "cache": cache, "exit_layers": exit_layers}
        if window is not None and not self.sliding_window_cache:
            raise ValueError(
                "Learned positions are absolute: a ring cache cannot slide them (the generator re-encodes the "
                f"window instead). Received: window={window}"
            )
        hidden = self.backbone.embed(token_ids, index, training=False)

        last = self.num_layers - 1
        carry = {
            "hidden": hidden,
            "exited": ops.zeros((batch,), "bool"),
            # Softmax response computes the exit logits on the way: kept for the exited rows.
            "logits": ops.zeros((batch, 1, self.vocabulary_size), "float32"),
            "layers": ops.zeros((batch,), "int32"),
        }

        def run_block(i, carry, layer_cache):
            output, layer_cache = self.blocks[i](
                carry["hidden"],
                self_attention_cache=layer_cache,
                self_attention_cache_update_index=index,
                self_attention_window=window,
            )
            exited = carry["exited"]
            # Exited rows keep their exit state; the block wrote their keys/values from it.
            carry = {
                "hidden": ops.where(exited[:, None, None], carry["hidden"], output),
                "exited": exited,
                "logits": carry["logits"],
                "layers": carry["layers"] + ops.cast(ops.logical_not(exited), "int32"),
            }
            if i < last:
                # At threshold 1 nothing can exit: the confidence is not even computed.
                carry = ops.cond(self.threshold_variable < 1.0, lambda: exit_check(carry), lambda: carry)
            return carry, layer_cache

        def exit_check(carry):
            confidence, logits = self._confidence(carry["hidden"])
            exits = ops.logical_and(ops.logical_not(carry["exited"]), confidence > self.threshold_variable)
            if prompt_rows is not None:  # prompt tokens run every layer
                exits = ops.logical_and(exits, ops.logical_not(ops.cast(prompt_rows, "bool")))
            carry = dict(carry, exited=ops.logical_or(carry["exited"], exits))
            if logits is not None:
                carry["logits"] = ops.where(exits[:, None, None], logits, carry["logits"])
            return carry

        def skip_block(i, carry, layer_cache):
            return carry, self._propagate(self.blocks[i], carry["hidden"], layer_cache, index, window)

        updated = []
        for i, layer_cache in enumerate(cache):
            if i == 0:
                carry, layer_cache = run_block(i, carry, layer_cache)
            else:
                carry, layer_cache = ops.cond(
                    ops.all(carry["exited"]),
                    lambda: skip_block(i, carry, layer_cache),
                    lambda: run_block(i, carry, layer_cache),
                )
            updated.append(layer_cache)

        exited = carry["exited"]
        states = self.backbone.final_norm(carry["hidden"])
        if self.exit_classifier is not None:
            logits = self.backbone.logits(states)
        else:
            logits = ops.cond(
                ops.all(exited),
                lambda: carry["logits"],
                lambda: ops.where(exited[:, None, None], carry["logits"], self.backbone.logits(states)),
            )
        return {"logits": logits, "hidden_states": states, "cache": tuple(updated), "exit_layers": carry["layers"]}

    # ------------------------------------------------------------------ config

    def get_config(self):
        return {
            **base_model_config(self),
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "confidence": self.confidence,
            "threshold": self.threshold,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        return cls(**config)


class FirstLayers(DecodingModel):
    """A `DecoderLM`'s first `num_layers` blocks through its final norm and head: every token exits there.

    A decoding model of its own (caches of those blocks only), sharing the backbone's weights: the draft of
    self-speculative decoding (`EarlyExitLM.draft_model`).

    Args:
        backbone: a `DecoderLM`.
        num_layers: blocks run, fewer than the backbone's.
    """

    def __init__(self, backbone, num_layers):
        blocks = len(backbone.transformer_blocks)
        if not is_integer(num_layers) or not 1 <= num_layers < blocks:
            raise ValueError(
                f"`num_layers` must be an integer from 1 to {blocks - 1} (fewer than the backbone's {blocks} "
                f"blocks). Received: num_layers={num_layers!r}"
            )
        self.backbone, self.num_layers = backbone, int(num_layers)
        self.vocabulary_size, self.max_length = backbone.vocabulary_size, backbone.max_length

    @property
    def blocks(self):
        return self.backbone.transformer_blocks[: self.num_layers]

    @property
    def variables(self):
        return self.backbone.variables

    @property
    def sliding_window_cache(self):
        return self.backbone.sliding_window_cache

    @property
    def positional_cache(self):
        return self.backbone.positional_cache

    def init_cache(self, batch_size, length, window=None):
        return self.backbone.init_cache(batch_size, length, window=window)[: self.num_layers]

    def resize_cache(self, cache, length):
        return tuple(block.self_attention_layer.resize_cache(c, length) for block, c in zip(self.blocks, cache))

    def call_with_cache(self, token_ids, cache, index, window=None):
        hidden = self.backbone.embed(token_ids, index, training=False)
        updated = []
        for block, layer_cache in zip(self.blocks, cache):
            hidden, layer_cache = block(
                hidden,
                self_attention_cache=layer_cache,
                self_attention_cache_update_index=index,
                self_attention_window=window,
            )
            updated.append(layer_cache)
        states = self.backbone.final_norm(hidden)
        return DecodeStep(self.backbone.logits(states), tuple(updated), states)
