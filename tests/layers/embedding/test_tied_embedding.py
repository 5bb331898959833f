import keras
import numpy as np
import pytest
from harness import LayerHarness
from keras import ops

from keras_tfam.engine import PLAIN
from keras_tfam.engine.xla_cpu import XLA_CPU
from keras_tfam.layers import TiedEmbedding

rng = np.random.default_rng(0)


class TestTiedEmbeddingHarness(LayerHarness):
    layer_cls = TiedEmbedding
    init_kwargs = {"vocabulary_size": 20, "output_dim": 8}

    def make_inputs(self):
        return {"inputs": rng.integers(0, 20, size=(3, 5)).astype("int32")}


class TestTiedEmbeddingReverseHarness(LayerHarness):
    layer_cls = TiedEmbedding
    init_kwargs = {"vocabulary_size": 20, "output_dim": 8}
    call_kwargs = {"reverse": True}

    def make_inputs(self):
        return {"inputs": rng.normal(size=(3, 5, 8)).astype("float32")}


def test_lookup_and_tied_logits_use_one_matrix():
    layer = TiedEmbedding(20, 8)
    ids = rng.integers(0, 20, size=(2, 4))
    hidden = rng.normal(size=(2, 4, 8)).astype("float32")
    layer.build()
    table = ops.convert_to_numpy(layer.embeddings)
    np.testing.assert_array_equal(ops.convert_to_numpy(layer(ids)), table[ids])
    logits = ops.convert_to_numpy(layer(hidden, reverse=True))
    np.testing.assert_allclose(logits, hidden @ table.T, rtol=1e-5, atol=1e-5)
    assert len(layer.weights) == 1


def test_logits_are_float32_under_mixed_precision():
    layer = TiedEmbedding(20, 8, dtype="mixed_float16")
    out = layer(layer(np.array([[1, 2]])), reverse=True)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"


def test_bad_sizes():
    with pytest.raises(ValueError, match="Received: vocabulary_size=0"):
        TiedEmbedding(0, 8)


def test_ids_outside_the_vocabulary_are_refused():
    layer = TiedEmbedding(7, 4)
    with pytest.raises(ValueError, match=r"Token ids must be in \[0, 7\).*Received: token id -1 at index \(1, 2\)"):
        layer(np.array([[0, 1, 2], [3, 4, -1]]))
    with pytest.raises(ValueError, match=r"Received: token id 7 at index \(0, 0\)"):
        layer(np.array([[7]]))
    embedded = ops.convert_to_numpy(layer(np.array([[6]])))[0, 0]
    np.testing.assert_allclose(embedded, ops.convert_to_numpy(layer.embeddings)[6])


def _in(engine, fn):
    """`fn` called inside a decoding call of `engine`."""

    def inside(*args):
        with engine.decoding():
            return fn(*args)

    return inside


@pytest.mark.parametrize("engine", [PLAIN, XLA_CPU], ids=["plain", "xla_cpu"])
@pytest.mark.parametrize("shape", [(1, 1, 8), (1, 8), (2, 1, 8), (50, 8), (3, 40, 8)])
def test_one_row_and_batched_logits_follow_the_formula_compiled(shape, engine):
    """Keras' `h @ E^T`, or in the XLA-CPU engine `E @ h` for one row (a row-major matrix-vector product),
    `(E @ h^T)^T` for 2 to 64 rows on a CPU: same logits (50 rows by 50 table rows included, a square product)."""
    from backend import compiled

    layer = TiedEmbedding(50, 8)
    layer.build()
    table = np.asarray(layer.embeddings)
    hidden = rng.normal(size=shape).astype("float32")
    reverse = _in(engine, lambda h: layer(h, reverse=True))
    for fn in (reverse, compiled(reverse)):
        logits = keras.ops.convert_to_numpy(fn(hidden))
        assert logits.shape == shape[:-1] + (50,)
        np.testing.assert_allclose(logits, hidden @ table.T, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(keras.backend.backend() not in ("tensorflow", "jax"), reason="XLA's CPU layouts")
def test_one_row_logits_read_the_table_as_it_is_stored():
    """`h @ E^T` of one row made XLA's CPU backend copy `E` transposed (inside a single-threaded loop); the
    XLA-CPU engine's `E @ h` does not."""
    from backend import optimized_hlo

    layer = TiedEmbedding(512, 64)
    layer.build()
    hidden = rng.normal(size=(1, 1, 64)).astype("float32")
    with XLA_CPU.decoding():
        hlo = optimized_hlo(layer, hidden, reverse=True)
    assert " copy(" not in hlo and " transpose(" not in hlo
    keras_layer = keras.layers.ReversibleEmbedding(512, 64)
    keras_layer.build()
    assert " copy(" in optimized_hlo(keras_layer, hidden, reverse=True)  # what the test guards against


@pytest.mark.skipif(keras.backend.backend() not in ("tensorflow", "jax"), reason="XLA's CPU layouts")
def test_a_few_rows_of_logits_read_the_table_as_rows():
    """For 2 to 64 rows, the XLA-CPU engine's `(E @ h^T)^T`: XLA multiplies `(V, D)` by `(D, M)`; Keras'
    `h @ E^T` is `(M, D)` by
    `E^T`, the form XLA's CPU backend reads at about half the speed."""
    import re

    from backend import optimized_hlo

    layer = TiedEmbedding(512, 64)
    layer.build()
    hidden = rng.normal(size=(8, 1, 64)).astype("float32")
    with XLA_CPU.decoding():
        assert re.search(r"= f32\[512,8\]\{1,0\} dot\(", optimized_hlo(layer, hidden, reverse=True))
    keras_layer = keras.layers.ReversibleEmbedding(512, 64)
    keras_layer.build()
    assert re.search(r"= f32\[8,512\]\{1,0\} dot\(", optimized_hlo(keras_layer, hidden, reverse=True))


@pytest.mark.skipif(keras.backend.backend() not in ("tensorflow", "jax"), reason="XLA's loops")
def test_a_few_rows_of_bfloat16_logits_in_a_loop_read_a_float32_table_widened_once():
    """8 rows of a bfloat16 table inside a decoding-like loop of the XLA-CPU engine: `(E @ h^T)^T` in float32,
    the widening of `E`
    hoisted out of the loop by XLA (a loop invariant), not done at each step."""
    import re

    from backend import optimized_hlo

    layer = TiedEmbedding(512, 64, dtype="bfloat16")
    layer.build()

    class Loop(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.head = layer

        def call(self, h):
            step = lambda i, h: h + keras.ops.cast(self.head(h, reverse=True)[..., :64], h.dtype)  # noqa: E731
            return keras.ops.fori_loop(0, 3, step, h)

    hidden = keras.ops.cast(rng.normal(size=(8, 1, 64)).astype("float32"), "bfloat16")
    loop = Loop()
    loop.build(hidden.shape)
    with XLA_CPU.decoding():
        hlo = optimized_hlo(loop, hidden)
    name = re.search(r"body=(%[\w.\-]+)", hlo).group(1)
    body = next(c for c in hlo.split("\n\n") if c.startswith(name + " "))
    assert re.search(r"= f32\[512,8\]\{1,0\} dot\(", hlo)
    # The loop carries the widened table; nothing in its body widens it again.
    assert "f32[512,64]" in body.split("\n")[0] and not re.search(r"f32\[512,64\]\{[0-9,]*\} convert\(", body)


@pytest.mark.parametrize("shape", [(1, 1, 8), (2, 1, 8)])
def test_bfloat16_logits_are_the_float32_product_of_the_bfloat16_table(shape, monkeypatch):
    """In the XLA-CPU engine, one row of a bfloat16 table, where its widened rows pay (an AVX2 CPU): `E @ h` in
    float32 over the
    bfloat16 values, as more rows compute it through Keras' product."""
    from backend import compiled

    monkeypatch.setenv("TFAM_CPU_FLAGS", "avx2")
    layer = TiedEmbedding(50, 8, dtype="bfloat16")
    layer.build()
    table = keras.ops.convert_to_numpy(keras.ops.cast(layer.embeddings, "float32"))
    hidden = keras.ops.cast(rng.normal(size=shape).astype("float32"), "bfloat16")
    expected = keras.ops.convert_to_numpy(keras.ops.cast(hidden, "float32")) @ table.T
    reverse = _in(XLA_CPU, lambda h: layer(h, reverse=True))
    for fn in (reverse, compiled(reverse)):
        logits = keras.ops.convert_to_numpy(fn(hidden))
        assert logits.dtype == np.float32 and logits.shape == shape[:-1] + (50,)
        np.testing.assert_allclose(logits, expected, rtol=2e-2, atol=2e-2)  # the product rounded to bfloat16


@pytest.mark.parametrize("engine", [PLAIN, XLA_CPU], ids=["plain", "xla_cpu"])
@pytest.mark.parametrize("shape", [(1, 1, 8), (2, 1, 8)])
def test_int8_logits_equal_keras_int8_and_the_formula(shape, engine):
    """In the XLA-CPU engine one row multiplies the int8 table as stored (`rows_product`): Keras' int8 logits,
    bit for bit, as outside it."""
    from backend import compiled

    ours = TiedEmbedding(50, 8)
    theirs = keras.layers.ReversibleEmbedding(50, 8, tie_weights=True, logit_soft_cap=None)
    for layer in (ours, theirs):
        layer.build()
    theirs.set_weights(ours.get_weights())
    for layer in (ours, theirs):
        layer.quantize("int8", type_check=False)
    hidden = rng.normal(size=shape).astype("float32")
    reverse = _in(engine, lambda h: ours(h, reverse=True))
    logits = keras.ops.convert_to_numpy(reverse(hidden))
    np.testing.assert_array_equal(logits, keras.ops.convert_to_numpy(theirs(hidden, reverse=True)))
    np.testing.assert_array_equal(logits, keras.ops.convert_to_numpy(compiled(reverse)(hidden)))
    table, scale = (keras.ops.convert_to_numpy(v) for v in (ours.embeddings, ours.embeddings_scale))
    rows = hidden.reshape(-1, 8)
    h_scale = 127 / np.abs(rows).max(-1, keepdims=True)
    h_q = np.clip(np.round(rows * h_scale), -127, 127)
    expected = (h_q @ table.T.astype("float32")) / (h_scale * scale)
    np.testing.assert_allclose(logits.reshape(-1, 50), expected, rtol=1e-5, atol=1e-6)
