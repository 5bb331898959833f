"""Work-around for Keras 3: `fit` under `MultiWorkerMirroredStrategy` (tensorflow/tensorflow#72388).

Keras' TensorFlow trainer breaks multi-worker `fit` in two places:

1. before training, a model created in the strategy's scope is built from
   its first batch averaged across workers in eager mode, and that reduce
   fails ("Attempt to convert a value (PerReplica ...)");
2. after each step it reduces the per-replica logs with
   `strategy.reduce("MEAN", v, axis=0)`, which fails for the scalar loss
   ("Invalid reduction dimension 0 for input with 0 dimensions").

`MultiWorkerTrainer` fits a built model without either: it is created
outside the strategy's scope (so Keras builds nothing from a batch) and
trained inside it, and its steps return each scalar log as `[1]`, which
the reduction along axis 0 averages across replicas into a scalar.
"""

import keras
import tensorflow as tf


class MultiWorkerTrainer(keras.Model):
    """Trains `model` (built, compiled, in the strategy's scope) with `fit` under a `MultiWorkerMirroredStrategy`.

    Create it outside the strategy's scope and call `fit` inside it (`fit_multi_worker`); callbacks see
    `model` itself, so checkpoints and backups are the model's own.
    """

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        self.trained = model
        self.built = True

    def call(self, inputs, training=False):
        return self.trained(inputs, training=training)

    def train_step(self, data):
        logs = super().train_step(data)
        return tf.nest.map_structure(lambda v: tf.reshape(v, [1]) if v.shape.rank == 0 else v, logs)

    @property
    def stop_training(self):
        trained = self.__dict__.get("trained")
        return bool(trained is not None and trained.stop_training)

    @stop_training.setter
    def stop_training(self, value):
        trained = self.__dict__.get("trained")
        if trained is not None:
            trained.stop_training = value

    @property
    def history(self):
        return self.trained.history

    @history.setter
    def history(self, value):
        self.trained.history = value


def fit_multi_worker(model, strategy, data, callbacks, epochs, steps_per_epoch, verbose=1, **kwargs):
    """`model.fit(data, ...)` under `strategy`, a `MultiWorkerMirroredStrategy`: the `History`."""
    trainer = MultiWorkerTrainer(model)
    with strategy.scope():
        trainer.compile(optimizer=model.optimizer, loss=model.loss, jit_compile=model.jit_compile)
        callbacks = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            verbose=verbose,
            epochs=epochs,
            steps=steps_per_epoch,
            model=model,
        )
        return trainer.fit(
            data, epochs=epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=verbose, **kwargs
        )
