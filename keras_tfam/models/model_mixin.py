"""What every model of the library adds to `keras.Model`."""

import keras

from keras_tfam.models.fit_traces_once import FitTracesOnce
from keras_tfam.models.lora import LoraMixin
from keras_tfam.models.preset_directory import PresetMixin
from keras_tfam.models.quantization import QuantizedConfigMixin
from keras_tfam.models.token_ids import check_token_ids


class ModelMixin(QuantizedConfigMixin, LoraMixin, PresetMixin, FitTracesOnce):
    """Mixed into each model, before `keras.Model`: a quantized model's config
    (`dtype_policy_config`), `enable_lora`, `save_to_preset`, a first `fit` that traces its
    step once, and an `export` that knows a token-ids model's input. Mixins rather than a
    `keras.Model` base, which Keras would turn into `Functional` in place for every model
    sharing it (see `FitTracesOnce`).
    """

    # A model that is no functional graph (Transformer-XL, the early-exit and kNN wrappers) and takes
    # `(batch, length)` token ids sets this: Keras would otherwise guess its serving input from the shape
    # it was first built with (a fixed length, float32). Functional models serve their own `Input`s.
    serves_token_ids = False

    @property
    def input_dtype(self):
        """What Keras converts a call's inputs to, and types the default SavedModel signature with: int32 token
        ids for a token-ids model (Keras' `Sequential` takes its input layer's dtype the same way)."""
        return "int32" if self.serves_token_ids else super().input_dtype

    def __call__(self, *args, **kwargs):
        if self.serves_token_ids and args:
            check_token_ids(args[0])  # before Keras converts them to `input_dtype`: a float id is refused
        return super().__call__(*args, **kwargs)

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs):
        """Keras' `Model.export`; a token-ids model serves int32 ids of any batch and length by default."""
        if input_signature is None and self.serves_token_ids:
            input_signature = [keras.InputSpec(shape=(None, None), dtype="int32")]
        return super().export(filepath, format=format, verbose=verbose, input_signature=input_signature, **kwargs)
