"""The engines (`keras_tfam.engine`): the plain one computes what Keras computes, the XLA-CPU one its forms
(each against a NumPy formula), and generation gives the same greedy tokens either way."""

import os

import keras
import numpy as np
import pytest
from backend import BACKEND, compiled

from keras_tfam.engine import PLAIN, Engine, current_engine, xla_cpu
from keras_tfam.engine.xla_cpu import XLA_CPU, columns_product, one_row_by_rows, rows_product
from keras_tfam.generation import Generator, with_dtype
from keras_tfam.generation.requests import resolve_engine
from keras_tfam.layers import Dense
from keras_tfam.layers.attention.caches import KeyValueCache
from keras_tfam.models import GPT2LM

XLA = BACKEND in ("tensorflow", "jax")
FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "fixtures", "hf-gpt2-tiny")
rng = np.random.default_rng(0)


def numpy(tensor):
    return keras.ops.convert_to_numpy(tensor)


# The plain engine and the choice of engine.


def test_outside_an_engine_and_in_the_plain_one_layers_compute_what_keras_computes():
    assert current_engine() is PLAIN
    ours, theirs = Dense(6, bias_initializer="random_normal"), keras.layers.Dense(6)
    for layer in (ours, theirs):
        layer.build((None, 8))
    theirs.set_weights(ours.get_weights())
    x = rng.normal(size=(1, 1, 8)).astype("float32")
    quantized = Dense(6)
    quantized.build((None, 8))
    quantized.quantize("int8")
    for hook in (PLAIN.dense(ours, x), PLAIN.int8_dense(quantized, x)):
        assert hook is None
    with PLAIN.decoding(ours.variables, rows=1):
        assert current_engine() is PLAIN
        np.testing.assert_array_equal(numpy(ours(x)), numpy(theirs(x)))
    with XLA_CPU.decoding(ours.variables, rows=1):
        assert current_engine() is XLA_CPU
        with PLAIN.decoding():  # nested: the inner engine
            assert current_engine() is PLAIN
        assert current_engine() is XLA_CPU
    assert current_engine() is PLAIN
    assert PLAIN.cache_dtype("bfloat16") == "bfloat16"


def test_the_engine_argument_is_auto_plain_or_an_engine():
    assert resolve_engine("plain") is PLAIN and resolve_engine(XLA_CPU) is XLA_CPU
    assert resolve_engine("auto") is (XLA_CPU if XLA else PLAIN)  # the test machines compute on CPUs
    for value in ("xla", None, 1):
        with pytest.raises(ValueError) as error:
            resolve_engine(value)
        message = str(error.value)
        assert "('auto', 'plain')" in message and message.endswith(f"Received: engine={value!r}")
    model = GPT2LM(vocabulary_size=11, num_layers=1, num_heads=2, hidden_dim=8)
    with pytest.raises(ValueError, match="Received: engine='fast'"):
        model.generate([[1, 2]], max_new_tokens=2, engine="fast")


# The XLA-CPU forms against their formulas.


def test_rows_product_is_the_formula_for_one_row_and_refuses_more():
    rows = np.random.default_rng(0).integers(-127, 128, size=(5, 4)).astype("int8")
    x = np.random.default_rng(1).normal(size=(1, 1, 4)).astype("float32")
    out = numpy(rows_product(x, rows, "float32"))
    np.testing.assert_allclose(out, x @ rows.T.astype("float32"), rtol=1e-6)
    with pytest.raises(ValueError, match=r"one row. Received: inputs of shape \(2, 4\)"):
        rows_product(np.ones((2, 4), "float32"), rows, "float32")


def test_bfloat16_rows_are_widened_exactly_and_multiplied_in_float32():
    """bfloat16 rows read as their bits shifted into float32's upper half: the float32 product of the same values."""
    rows = keras.ops.cast(rng.normal(size=(40, 64)).astype("float32"), "bfloat16")
    widened = numpy(keras.ops.cast(rows, "float32"))  # bfloat16 -> float32 is exact
    x = rng.normal(size=(1, 1, 64)).astype("float32")
    expected = x @ widened.T
    for product in (lambda x: rows_product(x, rows, "float32"), compiled(lambda x: rows_product(x, rows, "float32"))):
        np.testing.assert_allclose(numpy(product(x)), expected, rtol=1e-5, atol=1e-5)
    out = rows_product(x, rows, "bfloat16")
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    np.testing.assert_allclose(numpy(keras.ops.cast(out, "float32")), expected, rtol=1e-2, atol=1e-2)


def test_one_row_by_rows_is_the_formula():
    rows = rng.normal(size=(5, 4)).astype("float32")
    x = rng.normal(size=(1, 1, 4)).astype("float32")
    for fn in (one_row_by_rows, compiled(one_row_by_rows)):
        out = numpy(fn(x, rows))
        assert out.shape == (1, 1, 5)
        np.testing.assert_allclose(out, x @ rows.T, rtol=1e-5, atol=1e-6)


def test_one_row_plus_bias_is_the_sum_bit_for_bit():
    x, bias = rng.normal(size=(1, 7)).astype("float32"), rng.normal(size=(7,)).astype("float32")
    np.testing.assert_array_equal(numpy(XLA_CPU.one_row_plus_bias(x, bias)), x + bias)


@pytest.mark.parametrize("shape", [(2, 4), (8, 1, 4), (4, 16, 4), (5, 4)])
def test_columns_product_is_the_formula_for_a_few_rows(shape):
    """`(rows @ x^T + c)^T` is `x @ rows^T + bias` (or without the bias), eagerly and compiled; also for 5
    rows by 5 weight rows, where Keras' TensorFlow `add` would take the bias column for a row."""
    generator = np.random.default_rng(3)
    rows, bias = generator.normal(size=(5, 4)).astype("float32"), generator.normal(size=(5,)).astype("float32")
    x = generator.normal(size=shape).astype("float32")
    for fn in (columns_product, compiled(columns_product)):
        np.testing.assert_allclose(numpy(fn(x, rows)), x @ rows.T, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(numpy(fn(x, rows, bias)), x @ rows.T + bias, rtol=1e-5, atol=1e-6)
    # A non-finite input spoils its own row's outputs only.
    x = np.ones((3, 4), "float32")
    x[1, 0] = np.nan
    out = numpy(columns_product(x, rows))
    assert np.isnan(out[1]).all() and np.isfinite(out[[0, 2]]).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("rows_dtype", ["float32", "same"])
def test_columns_product_of_16_bit_rows_is_the_float32_product_rounded_then_the_bias(dtype, rows_dtype):
    """16-bit inputs: the float32 product of their values (by float32 rows, the copy `XlaCpuEngine.loop`
    makes, or by 16-bit rows), rounded to their dtype, then the bias added in it; as XLA's CPU backend
    multiplies 16-bit matrices and Keras' Dense adds its bias."""
    import ml_dtypes

    narrow = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    generator = np.random.default_rng(5)
    x = generator.normal(size=(8, 1, 16)).astype(narrow)
    rows = generator.normal(size=(6, 16)).astype(narrow)
    bias = generator.normal(size=(6,)).astype(narrow)
    product = (x.astype("float64") @ rows.T.astype("float64")).astype(narrow)
    expected = (product.astype("float64") + bias.astype("float64")).astype(narrow).astype("float64")
    rows_in = rows.astype("float32") if rows_dtype == "float32" else rows
    args = [keras.ops.convert_to_tensor(a, dtype) for a in (x, bias)]
    for fn in (columns_product, compiled(columns_product)):
        out = fn(args[0], keras.ops.convert_to_tensor(rows_in), args[1])
        assert keras.backend.standardize_dtype(out.dtype) == dtype
        out = numpy(keras.ops.cast(out, "float32")).astype("float64")
        # The float32 sum rounded to 16 bits may differ from the exact sum rounded: one unit in the last place.
        ulp = 2.0 ** (-7 if dtype == "bfloat16" else -10)
        np.testing.assert_allclose(out, expected, rtol=2 * ulp, atol=2 * ulp * np.abs(expected).max())


@pytest.mark.parametrize("shape", [(1, 4), (1, 1, 4), (65, 4), (5, 13, 4)])
def test_columns_product_refuses_one_row_and_many(shape):
    with pytest.raises(ValueError, match=rf"2 to 64 rows. Received: inputs of shape \({shape[0]}, "):
        columns_product(np.ones(shape, "float32"), np.ones((3, 4), "float32"))


@pytest.mark.skipif(not XLA, reason="PyTorch decodes eagerly: no copies")
def test_the_loop_copies_matrices_to_float32_or_int8_rows_within_a_memory_budget(monkeypatch):
    kernel = keras.Variable(rng.normal(size=(4, 6)).astype("float32"))
    half = keras.Variable(rng.normal(size=(4, 6)).astype("float32"), dtype="bfloat16")
    int8 = keras.Variable(rng.integers(-127, 128, size=(4, 6)).astype("int8"), dtype="int8", trainable=False)
    vector = keras.Variable(np.ones((6,), "float32"))
    variables = [kernel, half, int8, vector]
    with XLA_CPU.decoding(variables, rows=8):
        assert XLA_CPU.kernel_rows(kernel) is None  # the prompt's pass reads no copies
        with XLA_CPU.loop():
            np.testing.assert_array_equal(numpy(XLA_CPU.kernel_rows(kernel)), np.asarray(kernel).T)
            widened = XLA_CPU.kernel_rows(half)  # a bfloat16 kernel's rows, exactly, in float32
            assert keras.backend.standardize_dtype(widened.dtype) == "float32"
            np.testing.assert_array_equal(numpy(widened), numpy(keras.ops.cast(half, "float32")).T)
            assert XLA_CPU.kernel_rows(vector) is None
            with XLA_CPU.decoding([]), XLA_CPU.loop():  # nested: the inner copies only
                assert XLA_CPU.kernel_rows(kernel) is None
            assert XLA_CPU.kernel_rows(kernel) is not None
        assert XLA_CPU.kernel_rows(kernel) is None
    # Copies larger than a quarter of the machine's memory are not made (a 16-bit kernel's copy: 4 bytes a weight).
    for memory, copied in ((4 * 4 * 48 - 1, False), (4 * 4 * 48, True)):
        monkeypatch.setattr(xla_cpu, "physical_memory_bytes", lambda memory=memory: memory)
        with XLA_CPU.decoding([kernel, half], rows=2), XLA_CPU.loop():
            assert (XLA_CPU.kernel_rows(kernel) is not None) == copied
            assert (XLA_CPU.kernel_rows(half) is not None) == copied
    monkeypatch.undo()
    # A loop of one row reads the copies of float32 kernels on TensorFlow only: no other float kernel is
    # copied for it. int8 kernels are copied to int8 rows, their bytes as they are, for up to 64 rows.
    for rows in (1, 8, xla_cpu.MAX_FEW_ROWS, None):
        with XLA_CPU.decoding([kernel, half, int8], rows=rows), XLA_CPU.loop():
            assert (XLA_CPU.kernel_rows(kernel) is not None) == (BACKEND == "tensorflow" or rows != 1)
            assert (XLA_CPU.kernel_rows(half) is not None) == (rows != 1)
            int8_rows = XLA_CPU.kernel_rows(int8)
            assert keras.backend.standardize_dtype(int8_rows.dtype) == "int8"
            np.testing.assert_array_equal(numpy(int8_rows), np.asarray(int8).T)
    with XLA_CPU.decoding([int8], rows=xla_cpu.MAX_FEW_ROWS + 1), XLA_CPU.loop():  # Keras' product: no copy
        assert XLA_CPU.kernel_rows(int8) is None
    for memory, copied in ((4 * 24 - 1, False), (4 * 24, True)):  # an int8 kernel's copy: a byte a weight
        monkeypatch.setattr(xla_cpu, "physical_memory_bytes", lambda memory=memory: memory)
        with XLA_CPU.decoding([int8], rows=1), XLA_CPU.loop():
            assert (XLA_CPU.kernel_rows(int8) is not None) == copied
    monkeypatch.undo()
    with PLAIN.decoding([kernel]), XLA_CPU.loop():  # another engine's call: nothing
        assert XLA_CPU.kernel_rows(kernel) is None


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_caches_keep_their_dtype_and_the_xla_cpu_engine_stores_16_bit_floats_as_bits(dtype):
    cache = KeyValueCache(2, 4)
    assert keras.backend.standardize_dtype(cache.init(1, 8, dtype).dtype) == dtype  # what a user holds
    key = keras.ops.cast(rng.normal(size=(1, 1, 2, 4)).astype("float32"), dtype)
    plain, _, _, _, _ = cache.update(cache.init(1, 8, dtype), key, key, 3)
    with XLA_CPU.decoding():
        bits = cache.init(1, 8, dtype)
        assert keras.backend.standardize_dtype(bits.dtype) == (xla_cpu.BITS_OF[dtype] if XLA else dtype)
        bits, keys, values, _, _ = cache.update(bits, key, key, 3)
        assert keras.backend.standardize_dtype(keys.dtype) == dtype
        for read, expected in zip(KeyValueCache.keys_values(bits), KeyValueCache.keys_values(plain)):
            np.testing.assert_array_equal(
                numpy(keras.ops.cast(read, "float32")), numpy(keras.ops.cast(expected, "float32"))
            )


@pytest.mark.skipif(BACKEND != "jax", reason="JAX's per-function XLA options")
def test_jax_loops_compile_with_the_cpu_options_and_without_options_this_xla_lacks(monkeypatch):
    def reduce(x):
        return (x * 2.0).sum(axis=-1)

    x = np.arange(12, dtype="float32").reshape(3, 4)
    np.testing.assert_allclose(XLA_CPU.jax_jit(reduce)(x), 2 * x.sum(-1))
    np.testing.assert_allclose(PLAIN.jax_jit(reduce)(x), 2 * x.sum(-1))
    # An XLA that does not know an option refuses it when compiling: the loop compiles without it.
    monkeypatch.setattr(xla_cpu, "JAX_CPU_OPTIONS", {"xla_cpu_no_such_option": ""})
    np.testing.assert_allclose(XLA_CPU.jax_jit(reduce)(x), 2 * x.sum(-1))


def test_an_engine_of_ones_own_is_entered_by_the_generator():
    """A subclass overriding one hook is what the generator's loop computes with."""
    calls = []

    class Counting(Engine):
        name = "counting"

        def dense(self, layer, inputs):
            calls.append(tuple(inputs.shape))
            return None

    model = GPT2LM(vocabulary_size=11, num_layers=1, num_heads=2, hidden_dim=8)
    prompt = [[1, 2, 3]]
    np.testing.assert_array_equal(
        model.generate(prompt, max_new_tokens=3, engine=Counting()),
        model.generate(prompt, max_new_tokens=3, engine="plain"),
    )
    assert calls


# Generation with the engine on and off: the same greedy tokens.


def _fixture_model():
    if not os.path.isdir(FIXTURE):
        pytest.skip("../shared fixtures not present")
    return GPT2LM.from_huggingface(FIXTURE), np.load(os.path.join(FIXTURE, "reference.npz"))


# float32: the same sums in another order; int8: the same integer sums (exact); bfloat16: the float32 product of
# the same bfloat16 values, rounded as XLA's bfloat16 product rounds it.
@pytest.mark.parametrize("kind", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("batch", [1, 8])
def test_gpt2_greedy_tokens_are_the_same_with_the_engine_on_and_off(kind, batch):
    model, reference = _fixture_model()
    prompts = np.tile(reference["prompt_ids"], (batch, 1))[:batch]
    if kind == "bfloat16":
        model = with_dtype(model, "bfloat16")
    elif kind == "int8":
        model.quantize("int8")
    generator = Generator.for_model(model)
    plain = generator.generate(prompts, max_new_tokens=12, engine="plain")
    for engine in ("auto", XLA_CPU):
        np.testing.assert_array_equal(generator.generate(prompts, max_new_tokens=12, engine=engine), plain)
    if kind == "float32":
        np.testing.assert_array_equal(plain, np.tile(reference["greedy_ids"], (batch, 1))[:batch, : plain.shape[1]])
