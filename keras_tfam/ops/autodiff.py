"""A vector-Jacobian product on the running Keras backend: what a custom gradient that recomputes needs.

Keras 3 offers `keras.ops.custom_gradient` but no backend-neutral VJP, so
this is the one function of the library that asks the backend for its
autodiff (as `keras_tfam.generation.generator.compile_function` asks for its
compiler): `tf.GradientTape` on TensorFlow, `jax.vjp` on JAX,
`torch.autograd.grad` on PyTorch. Nothing else in the library touches them.
"""

import keras


def vjp(fn, primals, cotangent):
    """`(fn(*primals), cotangent^T d fn / d primals)`.

    Args:
        fn: a function of tensors returning one tensor.
        primals: a list of tensors.
        cotangent: a tensor shaped like `fn(*primals)`.

    Returns:
        The output and a list of gradients, one per primal (zeros where the
        output does not depend on it).
    """
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf  # the backend Keras already runs on

        with tf.GradientTape() as tape:
            tape.watch(primals)
            outputs = fn(*primals)
        return outputs, tape.gradient(outputs, primals, output_gradients=cotangent, unconnected_gradients="zero")
    if backend == "jax":
        import jax

        outputs, pullback = jax.vjp(fn, *primals)
        return outputs, list(pullback(cotangent))
    if backend == "torch":
        import torch

        with torch.enable_grad():
            primals = [p.detach().requires_grad_(True) for p in primals]
            outputs = fn(*primals)
            grads = torch.autograd.grad(outputs, primals, grad_outputs=cotangent, allow_unused=True)
        return outputs.detach(), [torch.zeros_like(p) if g is None else g for p, g in zip(primals, grads)]
    raise ValueError(f"No vector-Jacobian product for the {backend!r} backend. Received: backend={backend!r}")
