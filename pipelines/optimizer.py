"""AdamW whose global-norm clipping sees the whole batch's gradient under tf.distribute.

Keras 3 clips gradients (`global_clipnorm`) inside each replica, before the
cross-replica sum, so with two replicas each half-batch gradient is clipped
on its own and the update differs from one device on the same global batch
(`tests/pipelines/test_optimizer.py` fails once Keras clips the sum itself).
Here each replica first holds the mean of all replicas' gradients, which
Keras then clips to `clip_global_norm / replicas` and sums: the sum clipped,
so a MirroredStrategy run takes the same steps as a single-device run.
"""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="keras_tfam_pipelines")
class GlobalClipAdamW(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` with `clip_global_norm` applied to the gradient summed over replicas.

    With several replicas this costs one more all-reduce of the gradients
    per step (Keras' own sum follows it); with one it is Keras'
    `global_clipnorm`. Gradient accumulation, loss scaling and weight decay
    are Keras' own: the clipped gradient is the accumulated one.

    Args:
        clip_global_norm: maximum global norm of the (all-reduced) gradient,
            or `None`.
        **kwargs: `keras.optimizers.AdamW` arguments (without
            `global_clipnorm`, `clipnorm` or `clipvalue`, which clip per
            replica).
    """

    def __init__(self, clip_global_norm=None, **kwargs):
        for name in ("global_clipnorm", "clipnorm", "clipvalue"):
            if kwargs.get(name):
                raise ValueError(
                    f"Use `clip_global_norm`: Keras' own clipping acts per replica. Received: {name}={kwargs[name]!r}"
                )
        kwargs.pop("global_clipnorm", None)
        super().__init__(global_clipnorm=clip_global_norm, **kwargs)
        self.clip_global_norm = clip_global_norm

    def apply(self, grads, trainable_variables=None):
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync if context is not None else 1
        if self.clip_global_norm and replicas > 1:
            grads = list(grads)
            present = [i for i, grad in enumerate(grads) if grad is not None]
            summed = context.all_reduce(tf.distribute.ReduceOp.SUM, [grads[i] for i in present])
            for i, grad in zip(present, summed):
                grads[i] = _divide(grad, replicas)
        # Keras clips each replica's (now equal) mean, then sums `replicas` copies of it.
        self.global_clipnorm = self.clip_global_norm / replicas if self.clip_global_norm else None
        return super().apply(grads, trainable_variables)

    def get_config(self):
        config = super().get_config()
        config["global_clipnorm"] = None
        config["clip_global_norm"] = self.clip_global_norm
        return config


def _divide(grad, divisor):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / divisor, grad.indices, grad.dense_shape)
    return grad / divisor
