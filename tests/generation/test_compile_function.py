"""How the generator compiles its loops: per-backend compiler settings, which must not change results."""

import numpy as np
import pytest
from backend import BACKEND

from keras_tfam.generation import generator

pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="JAX's per-function XLA options")


def _reduce(x):
    return (x * 2.0).sum(axis=-1)


def test_jax_loops_compile_with_the_cpu_options_and_without_options_this_xla_lacks(monkeypatch):
    x = np.arange(12, dtype="float32").reshape(3, 4)
    np.testing.assert_allclose(generator._jax_jit(_reduce)(x), 2 * x.sum(-1))
    # An XLA that does not know an option refuses it when compiling: the loop compiles without it.
    monkeypatch.setattr(generator, "_JAX_CPU_OPTIONS", {"xla_cpu_no_such_option": ""})
    np.testing.assert_allclose(generator._jax_jit(_reduce)(x), 2 * x.sum(-1))
