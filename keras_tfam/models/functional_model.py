"""Base of the functional models that build their layers in `__init__` (as keras-hub's backbones)."""

import keras

from keras_tfam.models.model_mixin import ModelMixin


class FunctionalModel(ModelMixin, keras.Model):
    """A functional `keras.Model` whose constructor makes its layers before the graph.

    On PyTorch every Keras layer is a `torch.nn.Module`, and a module refuses
    sublayers assigned before `Module.__init__` runs, which here is inside
    `super().__init__(inputs, outputs)`. Until then (and for properties),
    attributes are set plainly: the functional graph tracks every layer
    anyway. On TensorFlow and JAX attributes are set as usual.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._functional_model_ready = True
        self.resolve_dtype_policy_maps()

    def __setattr__(self, name, value):
        if keras.config.backend() == "torch" and (
            not self.__dict__.get("_functional_model_ready") or isinstance(getattr(type(self), name, None), property)
        ):
            object.__setattr__(self, name, value)
            return
        super().__setattr__(name, value)
