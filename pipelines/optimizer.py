"""AdamW whose global-norm clipping sees the whole batch's gradient under tf.distribute.

Keras 3 clips gradients (`global_clipnorm`) inside each replica, before the
cross-replica sum, so with two replicas each half-batch gradient is clipped
on its own and the update differs from one device on the same global batch.
Here the gradients are summed across replicas first and clipped afterwards,
so a MirroredStrategy run takes the same steps as a single-device run.
"""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="keras_tfam_pipelines")
class GlobalClipAdamW(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` plus `clip_global_norm` applied after the all-reduce.

    Args:
        clip_global_norm: maximum global norm of the (all-reduced) gradient,
            or `None`.
        **kwargs: `keras.optimizers.AdamW` arguments (without
            `global_clipnorm`, which would clip per replica).
    """

    def __init__(self, clip_global_norm=None, **kwargs):
        if kwargs.get("global_clipnorm") or kwargs.get("clipnorm") or kwargs.get("clipvalue"):
            raise ValueError("Use `clip_global_norm`; Keras' own clipping acts per replica")
        super().__init__(**kwargs)
        self.clip_global_norm = clip_global_norm

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        variables = [v.value if isinstance(v, keras.Variable) else v for v in trainable_variables]
        # Keras' TF optimizer internals: all-reduce (a no-op outside a replica
        # context), then the per-variable update in cross-replica context.
        grads_and_vars = self._all_reduce_sum_gradients(list(zip(grads, variables)))
        if self.clip_global_norm:
            present = [(g, v) for g, v in grads_and_vars if g is not None]
            clipped, _ = tf.clip_by_global_norm([g for g, _ in present], self.clip_global_norm)
            grads_and_vars = [(g, v) for g, (_, v) in zip(clipped, present)]
        tf.__internal__.distribute.interim.maybe_merge_call(
            self._distributed_tf_update_step, self._distribution_strategy, grads_and_vars, learning_rate
        )

    def get_config(self):
        config = super().get_config()
        config["clip_global_norm"] = self.clip_global_norm
        return config
