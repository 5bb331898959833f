"""Low-rank adaptation of a model's projections (Hu et al. 2021), through Keras' own LoRA layers."""

import collections

import keras

from keras_tfam.utils import check_positive_int

DEFAULT_TARGETS = ("query", "value")


def sublayers(layer):
    """Every layer inside `layer` (not `layer` itself), each once, nearest first.

    Keras has no public recursive walk (`Model.layers` is one level deep), so this one follows what each
    layer holds: `Model.layers`, and the layers under its public attributes, in lists, tuples and dicts too.
    """
    found, seen = [], {id(layer)}
    queue = collections.deque(_held_layers(layer))
    while queue:
        sublayer = queue.popleft()
        if id(sublayer) not in seen:
            seen.add(id(sublayer))
            found.append(sublayer)
            queue.extend(_held_layers(sublayer))
    return found


def _held_layers(layer):
    held = list(layer.layers) if isinstance(layer, keras.Model) else []
    values = collections.deque(value for name, value in vars(layer).items() if not name.startswith("_"))
    while values:
        value = values.popleft()
        if isinstance(value, keras.layers.Layer):
            held.append(value)
        elif isinstance(value, (list, tuple, dict)):
            values.extendleft(reversed(list(value.values() if isinstance(value, dict) else value)))
    return held


class LoraMixin:
    """Mixed into the library's models: `enable_lora(rank, target)`.

    LoRA (Hu et al. 2021) freezes a pretrained weight `W` and learns
    `W + (alpha / rank) B A` with `A` of shape `(d_in, rank)` and `B` of shape
    `(rank, d_out)`, `B` starting at zero so the model starts where it was.
    Keras' `Dense`, `EinsumDense` and `Embedding` carry the two factors
    (`enable_lora`); this picks the layers by name, as keras-hub's
    `Backbone.enable_lora` does, and freezes every other weight. Saving
    (`.keras`, SavedModel) writes `W + (alpha / rank) B A`: the merged weight.
    A quantized layer (`quantize` before or after `enable_lora`) keeps its
    quantized weights and the factors as they are in a `.keras` file or a
    preset (`keras_tfam.keras_compat.SavesQuantizedLora`): merging would
    quantize the sum again, another model; loading it enables LoRA again.
    """

    def enable_lora(self, rank, target=DEFAULT_TARGETS, alpha=None):
        """Adds rank-`rank` LoRA factors to the layers named in `target`; only they train.

        Args:
            rank: rank of the update, a positive int.
            target: names of the layers to adapt: the attention projections
                `"query"`, `"key"`, `"value"`, `"attention_output"`, the
                feed-forward `"intermediate"` and `"output"`, the tied
                `"token_embedding"` (embedding and head); `("query", "value")`
                by default, as in the paper.
            alpha: scale numerator of the update (`alpha / rank`); `rank` by
                default (a scale of 1).

        Returns:
            The names of the adapted layers' paths.
        """
        check_positive_int("rank", rank)
        target = (target,) if isinstance(target, str) else tuple(target)
        layers = [layer for layer in sublayers(self) if layer.name in target and hasattr(layer, "enable_lora")]
        found = {layer.name for layer in layers}
        if not target or found != set(target):
            missing = sorted(set(target) - found) or list(target)
            raise ValueError(
                f"`target` must name layers with a LoRA form in this model (e.g. {DEFAULT_TARGETS}). "
                f"Received: target={target!r}, no such layer: {missing}"
            )
        for layer in sublayers(self):
            layer.trainable = False
        adapted = []
        for layer in layers:
            layer.trainable = True
            layer.enable_lora(rank, lora_alpha=alpha)
            for variable in layer.weights:  # Keras freezes the kernel; the paper freezes the bias too
                if not variable.path.split("/")[-1].startswith("lora_"):
                    variable.trainable = False
            adapted.append(layer.path)
        return adapted
