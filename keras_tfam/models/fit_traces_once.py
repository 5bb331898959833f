"""A mixin of the library's models: their first `fit` traces the train step once."""

import contextlib

import keras
import numpy as np


class FitTracesOnce:
    """Mixed into a `keras.Model`: builds the model and its optimizer before the first `fit`.

    Without a distribution strategy, Keras' TensorFlow trainer leaves an
    unbuilt model, its compiled loss and metrics and its optimizer unbuilt
    until the train step is traced, so the first trace creates their
    variables and `tf.function` traces the step a second time, the creation
    of each variable a graph of its own (a tiny Transformer-XL's first `fit`:
    12 s, half of it this). Building them beforehand, in the model's
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
            keras_builds = keras.backend.backend() != "tensorflow" or getattr(self, "_distribute_strategy", None)
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
        dense = lambda s: type(s).__name__ == "TensorSpec" and s.shape.rank is not None  # noqa: E731
        symbolic = lambda s: keras.KerasTensor(tuple(s.shape), s.dtype.name)  # noqa: E731
    else:
        batch = (x, args[1] if len(args) > 1 else kwargs.get("y"), kwargs.get("sample_weight"))
        batch_size = (args[2] if len(args) > 2 else kwargs.get("batch_size")) or 32
        dense = lambda a: isinstance(a, np.ndarray) or type(a).__name__ in ("EagerTensor", "Variable")  # noqa: E731

        def symbolic(array):
            dtype = keras.backend.standardize_dtype(array.dtype)
            return keras.KerasTensor(
                (min(batch_size, array.shape[0]),) + tuple(array.shape[1:]),
                keras.config.floatx() if keras.backend.is_float_dtype(dtype) else dtype,
            )

    leaves = [leaf for leaf in keras.tree.flatten(batch) if leaf is not None]
    if not leaves or not all(dense(leaf) for leaf in leaves):
        return None
    return keras.tree.map_structure(lambda leaf: None if leaf is None else symbolic(leaf), batch)
