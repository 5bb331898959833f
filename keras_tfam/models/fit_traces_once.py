"""A mixin of the library's models: their first `fit` traces the train step once."""

import contextlib

import keras
import numpy as np


class FitTracesOnce:
    """Mixed into a `keras.Model`: builds the model and its optimizer before the first `fit`.

    Without a distribution strategy, Keras' TensorFlow trainer leaves an
    unbuilt model, its compiled loss and metrics and its optimizer unbuilt
    until the train step is traced, so the first trace creates their
    variables and `tf.function` traces the step a second time (the
    Transformer-XL docstring example's first `fit`, alone on a 2-core EPYC:
    9.0-9.1 s with the second trace, 7.7-8.6 s without). Building them beforehand, in the model's
    distribution scope, from symbolic inputs of the shapes and dtypes the
    train step will be traced with, is what Keras does itself under a
    strategy (`Trainer._symbolic_build`): the variables and the training are
    the same. Data the shapes cannot be read from without drawing a batch
    (generators, `PyDataset`s) leaves an unbuilt model to Keras.

    A mixin, not a `keras.Model` subclass: Keras turns a `Model` base into
    `Functional` in place when a functional subclass is constructed, which
    would make every subclassed model sharing that base functional too.
    """

    def fit(self, *args, **kwargs):
        optimizer = getattr(self, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            # Under a strategy, Keras' TensorFlow trainer builds symbolically itself, from the first batch
            # (per replica: `pipelines.keras_workarounds`), as JAX's and PyTorch's always do.
            created_under = getattr(self, "_distribute_strategy", None)  # the strategy the model was created in
            keras_builds = keras.backend.backend() != "tensorflow" or created_under is not None
            batch = None if keras_builds else _symbolic_batch(args, kwargs)
            if batch is not None or self.built:
                strategy = getattr(self, "distribute_strategy", None)  # TensorFlow's trainer only
                with strategy.scope() if strategy is not None else contextlib.nullcontext():
                    if batch is not None:
                        self._symbolic_build(data_batch=batch)
                    else:
                        optimizer.build(self.trainable_variables)
        return super().fit(*args, **kwargs)


def _symbolic_batch(args, kwargs):
    """`(x, y, sample_weight)` of `fit`'s arguments as `KerasTensor`s of the traced step's shapes, or `None`.

    Arrays and dense tensors give the shape of their first batch (what Keras
    builds from under a strategy; a stateful model such as `TransformerXLLM`
    keeps its memory for that batch size), floats cast to `floatx` (Keras'
    array adapter); a `tf.data.Dataset` of dense tensors gives its
    `element_spec`. `None` for anything else.
    """
    x = args[0] if args else kwargs.get("x")
    if hasattr(x, "element_spec"):  # a tf.data.Dataset of (x, y[, sample_weight]) or of x alone
        batch = x.element_spec
        if not all(type(s).__name__ == "TensorSpec" and s.shape.rank is not None for s in _leaves(batch)):
            return None
        return keras.tree.map_structure(lambda s: keras.KerasTensor(tuple(s.shape), s.dtype.name), batch)
    batch = (x, args[1] if len(args) > 1 else kwargs.get("y"), kwargs.get("sample_weight"))
    if not all(isinstance(a, np.ndarray) or type(a).__name__ in ("EagerTensor", "Variable") for a in _leaves(batch)):
        return None
    batch_size = (args[2] if len(args) > 2 else kwargs.get("batch_size")) or 32

    def symbolic(array):
        if array is None:
            return None
        dtype = keras.backend.standardize_dtype(array.dtype)
        return keras.KerasTensor(
            (min(batch_size, array.shape[0]),) + tuple(array.shape[1:]),
            keras.config.floatx() if keras.backend.is_float_dtype(dtype) else dtype,
        )

    return keras.tree.map_structure(symbolic, batch)


def _leaves(structure):
    """The leaves of `structure` but `None`s; `[None]` (no leaf to read) when there are none."""
    return [leaf for leaf in keras.tree.flatten(structure) if leaf is not None] or [None]
