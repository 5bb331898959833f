"""Backend-specific test plumbing (gradients, compilation), so the tests themselves stay backend-neutral."""

import keras
import numpy as np
import pytest

BACKEND = keras.backend.backend()
tensorflow_only = pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow graphs with dynamic shapes")

# The cheapest decoding loop to build, for tests of the generator's own logic rather than of a compiler: on
# TensorFlow a graph without XLA (no XLA compilation); on JAX a jitted loop (its `lax.while_loop` compiles
# with XLA either way, and only a jitted loop is kept for the next call instead of traced again).
CHEAP_LOOP = {"jit_compile": BACKEND == "jax"}


def build_optimizer(model):
    """Builds a compiled `keras.Model`'s optimizer over its trainable variables before `fit`, as the library's
    models do (`keras_tfam.models.fit_traces_once`): Keras' TensorFlow trainer would build it inside the first
    trace of the train step and trace the step a second time. Same variables, same training."""
    model.optimizer.build(model.trainable_variables)


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


def jitted_on_jax(fn):
    """`fn` jitted on JAX, whose eager mode compiles every op anew for each new shape (hundreds of small
    programs for a tiny GPT-2's decoding steps, where one program a shape serves); unchanged elsewhere,
    whose eager kernels run directly. For a stateless function of a few shapes called many times, as the
    generator's compiled steps are (weights read inside it are constants of the program)."""
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    return fn


def optimized_hlo(layer, inputs, **kwargs):
    """The text of the HLO module XLA compiles `layer(inputs, **kwargs)` to, after its optimizations.

    The layer's weights are arguments of the compiled function, as in `fit` and in the generator (on JAX
    a closed-over weight would be a constant, which XLA fuses differently). TensorFlow and JAX only.
    """
    if BACKEND == "tensorflow":
        import tensorflow as tf

        fn = tf.function(lambda x: layer(x, **kwargs), jit_compile=True, autograph=False)
        return fn.experimental_get_compiler_ir(inputs)(stage="optimized_hlo")
    if BACKEND == "jax":
        import jax

        def call(trainable, non_trainable, x):
            return layer.stateless_call(trainable, non_trainable, x, **kwargs)[0]

        weights = ([v.value for v in layer.trainable_variables], [v.value for v in layer.non_trainable_variables])
        return jax.jit(call).lower(*weights, inputs).compile().as_text()
    raise NotImplementedError(BACKEND)


def forward(model, inputs):
    """`model(inputs)` as NumPy, computed the fastest way for a one-off call on this backend.

    JAX's eager mode compiles every op anew for each new input shape (2-15 s for a tiny GPT-2), so on
    JAX the call goes through `predict_on_batch`: one compiled graph per shape. TensorFlow and torch run
    their eager kernels directly.
    """
    if BACKEND == "jax":
        return np.asarray(model.predict_on_batch(inputs))
    return keras.ops.convert_to_numpy(model(inputs))


def greedy_by_full_passes(model, prompt, steps):
    """Greedy decoding without a cache: each token is the argmax of a full pass over the sequence so far.

    The sequence sits right-padded in a buffer of its final length, so every pass has one shape (one
    compilation on JAX); a causal model's logits at the last real position do not see the padding.
    """
    return greedy_rows_by_full_passes(model, [prompt], steps)[0]


def greedy_rows_by_full_passes(model, prompts, steps):
    """`greedy_by_full_passes` of each prompt, the prompts as rows of one batch: a pass per position.

    Each row sits right-padded in a buffer of the longest final length; a row takes its next token from
    each pass while it has tokens left to generate (a causal model's logits at a row's last real
    position see neither the padding nor the other rows).
    """
    lengths = [len(prompt) for prompt in prompts]
    tokens = np.zeros((len(prompts), max(lengths) + steps), "int32")
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = prompt
    for t in range(min(lengths), tokens.shape[1]):
        logits = forward(model, tokens)
        for row, length in enumerate(lengths):
            if length <= t < length + steps:
                tokens[row, t] = logits[row, t - 1].argmax()
    return [tokens[row, : length + steps].tolist() for row, length in enumerate(lengths)]
