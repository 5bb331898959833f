"""The gradient of a scalar function of one Keras variable, on the TensorFlow or the JAX backend."""

import keras


def gradient(loss_fn, variable):
    """d loss_fn() / d variable, as a NumPy array (zeros where unconnected; `loss_fn` reads the variable)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = loss_fn()
        grad = tape.gradient(loss, variable.value, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return keras.ops.convert_to_numpy(grad)
    if backend == "jax":
        import jax

        def stateless(value):
            with keras.StatelessScope(state_mapping=[(variable, value)]):
                return loss_fn()

        return keras.ops.convert_to_numpy(jax.grad(stateless)(variable.value))
    raise NotImplementedError(f"gradient() supports tensorflow and jax. Received: backend={backend}")
