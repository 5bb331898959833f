"""Backend-specific test plumbing (gradients, compilation), so the tests themselves stay backend-neutral."""

import keras
import numpy as np
import pytest

BACKEND = keras.backend.backend()
tensorflow_only = pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow graphs with dynamic shapes")


def gradients(fn, *inputs):
    """NumPy gradients of the scalar `fn(*inputs)` with respect to each input."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        tensors = [tf.constant(x) for x in inputs]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            value = fn(*tensors)
        return [np.asarray(g) for g in tape.gradient(value, tensors)]
    if BACKEND == "jax":
        import jax

        return [np.asarray(g) for g in jax.grad(fn, argnums=tuple(range(len(inputs))))(*inputs)]
    if BACKEND == "torch":
        import torch

        tensors = [torch.tensor(x, requires_grad=True) for x in inputs]
        fn(*tensors).backward()
        return [t.grad.numpy() for t in tensors]
    raise NotImplementedError(BACKEND)


def compiled(fn):
    """`fn` compiled with XLA on TensorFlow and JAX (eager elsewhere)."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    return fn
