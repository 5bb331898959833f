"""What every model of the library adds to `keras.Model`."""

from keras_tfam.models.fit_traces_once import FitTracesOnce
from keras_tfam.models.lora import LoraMixin
from keras_tfam.models.preset_directory import PresetMixin
from keras_tfam.models.quantization import QuantizedConfigMixin


class ModelMixin(QuantizedConfigMixin, LoraMixin, PresetMixin, FitTracesOnce):
    """Mixed into each model, before `keras.Model`: a quantized model's config
    (`dtype_policy_config`), `enable_lora`, `save_to_preset`, and a first `fit` that traces its
    step once. Mixins rather than a `keras.Model` base, which Keras would turn
    into `Functional` in place for every model sharing it (see `FitTracesOnce`).
    """
