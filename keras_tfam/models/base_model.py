"""The library's `keras.Model` base: its first `fit` traces the train step once."""

import contextlib

import keras


class Model(keras.Model):
    """A `keras.Model` that builds its optimizer before the first `fit`.

    Without a distribution strategy, Keras' TensorFlow trainer leaves the
    optimizer unbuilt until the train step is traced, so the first trace
    creates the optimizer's variables and `tf.function` traces the step a
    second time (3 s of a tiny GPT-2's 5 s first epoch). Building the
    optimizer over `trainable_variables` beforehand, in the model's
    distribution scope, is what Keras does itself under a strategy and what
    the traced step would do: the variables and the training are the same.
    """

    def fit(self, *args, **kwargs):
        optimizer = getattr(self, "optimizer", None)
        if self.built and optimizer is not None and not optimizer.built:
            strategy = getattr(self, "distribute_strategy", None)  # TensorFlow's trainer only
            with strategy.scope() if strategy is not None else contextlib.nullcontext():
                optimizer.build(self.trainable_variables)
        return super().fit(*args, **kwargs)
