"""Work-arounds for Keras 3: `fit` under `MultiWorkerMirroredStrategy`, and exports traced once.

Keras 3 (3.15 at the time of writing) breaks multi-worker `fit` in two places,
reported as tensorflow/tensorflow#72388:

1. before training it averages a distributed data batch across workers in
   eager mode to build the model symbolically, and that cross-worker reduce
   fails ("Attempt to convert a value (PerReplica ...)");
2. after each step it reduces the per-replica logs with
   `strategy.reduce("MEAN", v, axis=0)`, which fails for the scalar loss
   ("Invalid reduction dimension 0 for input with 0 dimensions").

Only multi-worker runs are touched: the model is built from a local batch,
and scalar logs are averaged across replicas with `axis=None`.
"""

import contextlib

import tensorflow as tf
from keras.src.backend.tensorflow import trainer as _tf_trainer
from keras.src.backend.tensorflow.layer import TFLayer

_original_reduce_per_replica = _tf_trainer.reduce_per_replica


def _reduce_per_replica(values, strategy, reduction):
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and reduction in ("auto", "mean"):
        return tf.nest.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
    return _original_reduce_per_replica(values, strategy, reduction)


def patch_multi_worker_fit(model, strategy, local_batch):
    """Makes `model.fit` work under `strategy` (a MultiWorkerMirroredStrategy)."""
    _tf_trainer.reduce_per_replica = _reduce_per_replica

    def build_from_local_batch(iterator=None, data_batch=None):
        with strategy.scope():
            model._symbolic_build(data_batch=local_batch)

    model._maybe_symbolic_build = build_from_local_batch


def save_endpoints_as_traced(archive):
    """Makes a `keras.export.ExportArchive` save each endpoint as the one trace it has, not trace it again.

    `tf.saved_model.save` traces every `tf.function` it finds again, because TensorFlow's trace key
    includes the save context: each endpoint, the decoding loop's among them, was traced twice, half of
    an export's time. Here each endpoint `tf.function` on the archive is replaced by its concrete
    function, traced now (once), which the save writes as it is. Keras has no public route: this reads
    the archive's private endpoint table (Keras 3.12-3.15).
    """
    trackable = archive._tf_trackable
    for name in archive._endpoint_names:
        function = getattr(trackable, name)
        setattr(trackable, name, function.get_concrete_function())
        # Where Keras' `write_out` looks for an endpoint's concrete function: the attribute itself.
        archive._endpoint_signatures[name] = function.input_signature


@contextlib.contextmanager
def no_default_save_signatures():
    """Keras models offer no default save signature inside the block: write an `ExportArchive` in it.

    Keras' TensorFlow layers have a `_default_save_signature` property that makes a new `tf.function` over
    a model's `call` at each read, and TensorFlow's walk of a SavedModel's objects traces every function it
    finds. `ExportArchive.write_out` walks each tracked model to find its lookup tables, so every export
    traced the whole model once more (2.2 of an export's 15 CPU seconds for a 6-layer GPT-2), into a graph
    the SavedModel does not keep: its signatures are the archive's endpoints. For the block's duration the
    property reads None on every layer (Keras 3.12-3.15; a class attribute, so for every thread). A Keras
    without the property is left as it is: the export is the same, traced once more.
    """
    signature = TFLayer.__dict__.get("_default_save_signature")
    if signature is None:
        yield
        return
    TFLayer._default_save_signature = None
    try:
        yield
    finally:
        TFLayer._default_save_signature = signature
