"""A mixin of the library's models: their first `fit` traces the train step once."""

import contextlib


class FitTracesOnce:
    """Mixed into a `keras.Model`: builds the optimizer before the first `fit`.

    Without a distribution strategy, Keras' TensorFlow trainer leaves the
    optimizer unbuilt until the train step is traced, so the first trace
    creates the optimizer's variables and `tf.function` traces the step a
    second time (3 s of a tiny GPT-2's 5 s first epoch). Building the
    optimizer over `trainable_variables` beforehand, in the model's
    distribution scope, is what Keras does itself under a strategy and what
    the traced step would do: the variables and the training are the same.

    A mixin, not a `keras.Model` subclass: Keras turns a `Model` base into
    `Functional` in place when a functional subclass is constructed, which
    would make every subclassed model sharing that base functional too.
    """

    def fit(self, *args, **kwargs):
        optimizer = getattr(self, "optimizer", None)
        if self.built and optimizer is not None and not optimizer.built:
            strategy = getattr(self, "distribute_strategy", None)  # TensorFlow's trainer only
            with strategy.scope() if strategy is not None else contextlib.nullcontext():
                optimizer.build(self.trainable_variables)
        return super().fit(*args, **kwargs)
