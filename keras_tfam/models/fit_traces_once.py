"""A mixin of the library's models: their first `fit` on TensorFlow traces the train step once."""

import keras


class FitTracesOnce:
    """Mixed into a `keras.Model`: a built model's optimizer is built before the first `fit`.

    Without a distribution strategy, Keras' TensorFlow trainer builds the
    optimizer inside the first trace of the train step, so creating its
    variables makes `tf.function` trace the step a second time. Building it
    beforehand over the model's trainable variables, in the model's strategy
    scope, is what Keras does itself under a strategy: the variables and the
    training are the same. An unbuilt model is left to Keras.

    A mixin, not a `keras.Model` subclass: Keras turns a `Model` base into
    `Functional` in place when a functional subclass is constructed, which
    would make every subclassed model sharing that base functional too.
    """

    def fit(self, *args, **kwargs):
        optimizer = getattr(self, "optimizer", None)
        if keras.backend.backend() == "tensorflow" and self.built and optimizer is not None and not optimizer.built:
            with self.distribute_strategy.scope():
                optimizer.build(self.trainable_variables)
        return super().fit(*args, **kwargs)
