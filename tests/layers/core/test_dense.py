import gc
import re
import weakref
from functools import partial

import h5py
import keras
import numpy as np
import pytest
from backend import BACKEND, compiled, optimized_hlo
from harness import LayerHarness

from keras_tfam.engine import PLAIN
from keras_tfam.engine.xla_cpu import XLA_CPU
from keras_tfam.layers import Dense, TiedEmbedding

rng = np.random.default_rng(0)


class TestDenseHarness(LayerHarness):
    layer_cls = Dense
    init_kwargs = {"units": 6, "activation": "gelu", "bias_initializer": "random_normal"}

    def make_inputs(self):
        return {"inputs": rng.normal(size=(1, 1, 8)).astype("float32")}


def _pair(units=6, **kwargs):
    """Our `Dense` and Keras' with the same weights."""
    ours = Dense(units, bias_initializer="random_normal", **kwargs)
    theirs = keras.layers.Dense(units, **kwargs)
    ours.build((None, 8))
    theirs.build((None, 8))
    theirs.set_weights(ours.get_weights())
    return ours, theirs


def _in(engine, fn):
    """`fn` called inside a decoding call of `engine`."""

    def inside(*args):
        with engine.decoding():
            return fn(*args)

    return inside


def _in_loop(engine, layer, fn):
    """`fn` called inside the decoding loop of `engine`, `layer`'s variables those of the call."""

    def inside(*args):
        with engine.decoding(layer.variables), engine.loop():
            return fn(*args)

    return inside


def _saved(model, path):
    """The arrays of `model`'s weights file, in the file's order."""
    model.save_weights(path)
    arrays = []
    with h5py.File(path, "r") as file:
        file.visititems(lambda name, item: arrays.append(item[()]) if isinstance(item, h5py.Dataset) else None)
    return arrays


@pytest.mark.parametrize("engine", [PLAIN, XLA_CPU], ids=["plain", "xla_cpu"])
@pytest.mark.parametrize("shape", [(1, 8), (1, 1, 8), (3, 8), (2, 1, 8)])
def test_equals_keras_dense_and_the_formula_bit_for_bit(shape, engine):
    ours, theirs = _pair()
    x = rng.normal(size=shape).astype("float32")
    kernel, bias = (np.asarray(w) for w in ours.get_weights())
    out = keras.ops.convert_to_numpy(_in(engine, ours)(x))
    # x - (-b) == x + b exactly: negation only flips the sign bit.
    np.testing.assert_array_equal(out, keras.ops.convert_to_numpy(theirs(x)))
    np.testing.assert_allclose(out, x @ kernel + bias, rtol=1e-6, atol=1e-6)
    step = compiled(_in(engine, lambda x: ours(x)))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(step(x)), x @ kernel + bias, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(BACKEND not in ("tensorflow", "jax"), reason="XLA's CPU fusion decisions")
def test_one_row_product_is_not_output_fused_with_its_bias():
    """XLA's CPU backend emits `dot + bias` of one row as a single-threaded "output fusion"; in the XLA-CPU
    engine ours stays a dot."""
    x = rng.normal(size=(1, 1, 64)).astype("float32")
    ours = Dense(128)
    ours.build((None, 64))
    with XLA_CPU.decoding():
        assert "kind=kOutput" not in optimized_hlo(ours, x)
    if BACKEND == "tensorflow":  # Keras' Dense, and ours outside the engine, are fused there
        theirs = keras.layers.Dense(128)
        theirs.build((None, 64))
        assert "kind=kOutput" in optimized_hlo(theirs, x)
        assert "kind=kOutput" in optimized_hlo(ours, x)


WEIGHT_ONLY = keras.quantizers.Int8QuantizationConfig(activation_quantizer=None)


@pytest.mark.parametrize("engine", [PLAIN, XLA_CPU], ids=["plain", "xla_cpu"])
@pytest.mark.parametrize("config", [None, WEIGHT_ONLY], ids=["int8", "weight-only-int8"])
@pytest.mark.parametrize("shape", [(1, 1, 8), (1, 8), (3, 8)])
def test_int8_equals_keras_int8_dense_and_the_formula(config, shape, engine):
    """Keras' int8 kernel and outputs, in and out of the engine's loop (one row there by the kernel's int8 rows,
    copied before the loop): the same integer sums (input_dim <= 1040: exact in float32)."""
    ours, theirs = _pair()
    for layer in (ours, theirs):
        layer.quantize("int8", config=config)
    x = rng.normal(size=shape).astype("float32")
    # Quantized activations make integer sums: exact in any order. Float activations sum in the kernel's order.
    close = partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-6)
    same = np.testing.assert_array_equal if config is None else close
    expected = keras.ops.convert_to_numpy(theirs(x))
    for inside in (_in(engine, ours), _in_loop(engine, ours, ours)):
        out = keras.ops.convert_to_numpy(inside(x))
        same(out, expected)
        same(out, keras.ops.convert_to_numpy(compiled(lambda x: inside(x))(x)))
    # The formula: Keras' per-output-channel scales, activations quantized per row unless weight-only.
    columns, scale, bias = (keras.ops.convert_to_numpy(v) for v in (ours.kernel, ours.kernel_scale, ours.bias))
    assert columns.dtype == np.int8 and columns.shape == (8, 6)
    np.testing.assert_array_equal(columns, keras.ops.convert_to_numpy(theirs.kernel))  # Keras' own layout
    rows = x.reshape(-1, 8)
    x_scale = 127 / np.abs(rows).max(-1, keepdims=True) if config is None else np.ones((len(rows), 1), "float32")
    x_q = np.clip(np.round(rows * x_scale), -127, 127) if config is None else rows
    expected = (x_q @ columns.astype("float32")) / (x_scale * scale) + bias
    np.testing.assert_allclose(out.reshape(-1, 6), expected, rtol=1e-5, atol=1e-6)


def test_int8_many_rows_in_an_executor_call_are_keras_integer_sums():
    """In a decoding call the executor runs (`compiled=False`, as a served prefill), an int8 Dense of many rows
    multiplies by float32 products of slices of at most 1024 terms (`int8_sums`): Keras' int8 outputs bit for
    bit, also where 3000 terms of about 120 * 120 sum past 2 ** 24, which one float32 sum would round."""
    signs = rng.choice([-1.0, 1.0], size=(1, 3000))
    x = (signs * rng.uniform(0.9, 1.0, size=(80, 3000))).astype("float32")
    kernel = rng.uniform(0.9, 1.0, size=(3000, 3)) * np.concatenate([signs.T, -signs.T, signs.T[::-1]], axis=1)
    ours, theirs = Dense(3), keras.layers.Dense(3)
    for layer in (ours, theirs):
        layer.build((None, 3000))
        layer.set_weights([kernel.astype("float32"), np.zeros(3, "float32")])
        layer.quantize("int8")
    with XLA_CPU.decoding(ours.variables, compiled=False):
        out = keras.ops.convert_to_numpy(ours(x))
    np.testing.assert_array_equal(out, keras.ops.convert_to_numpy(theirs(x)))
    columns, scale = (keras.ops.convert_to_numpy(v) for v in (ours.kernel, ours.kernel_scale))
    # Keras' activation quantizer, in float32: 127 / (max |x| + epsilon) per row, rounded half to even.
    x_scale = np.float32(127) / (np.abs(x).max(-1, keepdims=True) + np.float32(keras.config.epsilon()))
    sums = np.clip(np.round(x * x_scale), -127, 127).astype(np.int64) @ columns.astype(np.int64)
    assert np.abs(sums).max() > 2**24
    np.testing.assert_allclose(out, sums / (x_scale * scale), rtol=1e-6)


def test_int8_files_are_keras_int8_dense_files(tmp_path):
    """Saved, an int8 layer is Keras' int8 `Dense` file, array for array, and loads either way."""
    ours, theirs = _pair()
    for layer in (ours, theirs):
        layer.quantize("int8")
    x = rng.normal(size=(1, 8)).astype("float32")
    ours_model, theirs_model = (keras.Sequential([keras.Input((8,)), layer]) for layer in (ours, theirs))
    ours_file = _saved(ours_model, tmp_path / "ours.weights.h5")
    theirs_file = _saved(theirs_model, tmp_path / "theirs.weights.h5")
    assert [a.shape for a in ours_file] == [(8, 6), (6,), (6,)] and ours_file[0].dtype == np.int8
    for a, b in zip(ours_file, theirs_file, strict=True):
        np.testing.assert_array_equal(a, b)
    saved = keras.Sequential([keras.Input((8,)), keras.layers.Dense(6, dtype=theirs.dtype_policy)])
    saved.load_weights(tmp_path / "ours.weights.h5")  # Keras' Dense reads our file
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(saved(x)), keras.ops.convert_to_numpy(ours_model(x)))
    ours_model.save(tmp_path / "ours.keras")
    loaded = keras.models.load_model(tmp_path / "ours.keras")
    assert isinstance(loaded.layers[0], Dense) and tuple(loaded.layers[0].kernel.shape) == (8, 6)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(x)), keras.ops.convert_to_numpy(ours_model(x)))


def test_int8_lora_trains_as_keras_does_and_saves_its_factors(tmp_path):
    ours, theirs = _pair()
    for layer in (ours, theirs):
        layer.quantize("int8")
    quantized = [keras.ops.convert_to_numpy(v) for v in (ours.kernel, ours.kernel_scale)]
    for layer in (ours, theirs):
        layer.enable_lora(2)
    theirs.lora_kernel_a.assign(ours.lora_kernel_a)
    for layer in (ours, theirs):
        layer.lora_kernel_b.assign(np.linspace(-1, 1, 12, dtype="float32").reshape(2, 6))
    x = rng.normal(size=(1, 1, 8)).astype("float32")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(ours(x)), keras.ops.convert_to_numpy(theirs(x)), rtol=1e-6, atol=1e-6
    )
    assert [v.name for v in ours.trainable_variables] == [v.name for v in theirs.trainable_variables]
    assert "kernel" not in [v.name for v in ours.trainable_variables]
    # Saved, a quantized layer keeps its int8 kernel, its scales and its factors as they are (Keras merges them
    # and quantizes again, which changes the outputs: tests/test_keras_compat.py).
    saved = _saved(keras.Sequential([keras.Input((8,)), ours]), tmp_path / "ours.weights.h5")
    factors = [keras.ops.convert_to_numpy(v) for v in (ours.lora_kernel_a, ours.lora_kernel_b)]
    for value in quantized + factors:
        assert any(array.shape == value.shape and np.array_equal(array, value) for array in saved)


class _Loop(keras.layers.Layer):
    """`layer` applied three times in a loop, as the generator applies a model once per token."""

    def __init__(self, layer):
        super().__init__(name="loop")
        self.layer = layer

    def call(self, x):
        return keras.ops.fori_loop(0, 3, lambda i, x: keras.ops.cast(self.layer(x), x.dtype), x)


class _RowsLoop(_Loop):
    """`_Loop` inside the XLA-CPU engine's loop, as the generator runs its decoding loop (rows not known)."""

    def call(self, x):
        with XLA_CPU.decoding(self.layer.variables), XLA_CPU.loop():
            return super().call(x)


class _EngineLoop(_Loop):
    """`_Loop` inside a decoding call of the XLA-CPU engine, outside its loop: no copies, the one-row forms."""

    def call(self, x):
        with XLA_CPU.decoding(self.layer.variables):
            return super().call(x)


@pytest.mark.parametrize("shape", [(8, 1, 8), (2, 3, 8), (64, 8), (1, 1, 8), (1, 8)])
def test_a_few_rows_inside_the_engine_loop_equal_keras_dense_and_the_formula(shape):
    """Inside the XLA-CPU engine's loop (TensorFlow, JAX, a CPU: the kernel transposed once), 2 to 64 rows take
    `(rows @ x^T + bias)^T` and one row on TensorFlow `x @ rows^T - (-bias)`: Keras' result within float32
    rounding, eagerly, compiled and in a loop."""
    ours, theirs = _pair(8, activation="gelu")
    x = rng.normal(size=shape).astype("float32")
    kernel, bias = (np.asarray(w) for w in ours.get_weights())
    formula = keras.ops.convert_to_numpy(keras.ops.gelu(x @ kernel + bias, approximate=False))
    expected = keras.ops.convert_to_numpy(theirs(x))

    def inside(x):
        with XLA_CPU.decoding(ours.variables), XLA_CPU.loop():
            assert (XLA_CPU.kernel_rows(ours.kernel) is not None) == (BACKEND in ("tensorflow", "jax"))
            return ours(x)

    for fn in (inside, compiled(inside)):
        out = keras.ops.convert_to_numpy(fn(x))
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out, formula, rtol=1e-5, atol=1e-5)
    layer = Dense(8, bias_initializer="random_normal")
    layer.build((None, 8))
    loop = _RowsLoop(layer)
    loop.build(x.shape)
    kernel, bias = (np.asarray(w) for w in layer.get_weights())
    three = ((x @ kernel + bias) @ kernel + bias) @ kernel + bias
    np.testing.assert_allclose(keras.ops.convert_to_numpy(compiled(loop)(x)), three, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(BACKEND not in ("tensorflow", "jax"), reason="XLA's loops")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_few_rows_read_the_kernel_transposed_once_before_the_loop(dtype):
    """In the loop, the product of 8 rows is `(N, K) @ (K, 8)` in float32 over a loop-carried copy of the
    kernel, transposed (and a bfloat16 kernel widened) before the loop, not at each step; Keras' Dense
    multiplies `(8, K) @ (K, N)`, the slow form on a CPU."""
    x = keras.ops.cast(rng.normal(size=(8, 1, 24)).astype("float32"), dtype)

    def compiled_loop(layer):
        """The optimized HLO of the loop and the text of its body computation."""
        if not layer.built:
            layer.build((None, 24))
        loop = _RowsLoop(layer)
        loop.build(x.shape)
        hlo = optimized_hlo(loop, x)
        name = re.search(r"body=(%[\w.\-]+)", hlo).group(1)
        return hlo, next(c for c in hlo.split("\n\n") if c.startswith(name + " "))

    hlo, body = compiled_loop(Dense(24, dtype=dtype))
    assert re.search(r"= f32\[24,8\]\{1,0\} dot\(", hlo) and not re.search(r"= f32\[8,24\]\{1,0\} dot\(", hlo)
    assert not re.search(r"= f32\[24,24\]\{[0-9,]*\} (copy|transpose|convert)\(", body)  # no copy at each step
    hlo, _ = compiled_loop(keras.layers.Dense(24, dtype=dtype))  # Keras' Dense: what the test guards against
    assert re.search(r"= f32\[8,24\]\{1,0\} dot\(", hlo)
    if dtype == "float32":
        int8 = Dense(24)
        int8.build((None, 24))
        int8.quantize("int8")
        hlo, body = compiled_loop(int8)
        assert not re.search(r"= f32\[24,8\]\{1,0\} dot\(", hlo)  # int8: its own product, by int8 rows
        by_rows = r"= s32\[8,24\]\{1,0\} dot\([^)]*\), lhs_contracting_dims=\{1\}, rhs_contracting_dims=\{1\}"
        assert BACKEND == "jax" or re.search(by_rows, body)  # JAX's compiled weights are constants, folded
        assert not re.search(r"= s8\[24,24\]\{[0-9,]*\} (copy|transpose)\(", body)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_few_rows_of_a_16_bit_layer_inside_the_engine_loop_equal_keras_dense_and_the_formula(dtype):
    """A 16-bit kernel inside the XLA-CPU engine's loop: copied to float32 rows once, the product of 8 rows rounded to
    the layer's dtype, then the bias: Keras' 16-bit Dense within a rounding, eagerly, compiled and in a loop."""
    ours = Dense(24, bias_initializer="random_normal", activation="gelu", dtype=dtype)
    theirs = keras.layers.Dense(24, activation="gelu", dtype=dtype)
    for layer in (ours, theirs):
        layer.build((None, 24))
    theirs.set_weights(ours.get_weights())
    x = keras.ops.cast(rng.normal(size=(8, 1, 24)).astype("float32"), dtype)
    kernel, bias = (keras.ops.convert_to_numpy(keras.ops.cast(w, "float32")) for w in ours.weights)
    x32 = keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))
    formula = keras.ops.convert_to_numpy(keras.ops.gelu(x32 @ kernel + bias, approximate=False))
    expected = keras.ops.convert_to_numpy(keras.ops.cast(theirs(x), "float32"))
    tolerance = 2e-2 if dtype == "bfloat16" else 3e-3  # a few roundings to the dtype

    def inside(x):
        with XLA_CPU.decoding(ours.variables), XLA_CPU.loop():
            assert (XLA_CPU.kernel_rows(ours.kernel) is not None) == (BACKEND in ("tensorflow", "jax"))
            return ours(x)

    for fn in (inside, compiled(inside)):
        out = fn(x)
        assert keras.backend.standardize_dtype(out.dtype) == dtype
        out = keras.ops.convert_to_numpy(keras.ops.cast(out, "float32"))
        np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance)
        np.testing.assert_allclose(out, formula, rtol=tolerance, atol=tolerance)
    loop = _RowsLoop(ours)
    loop.build(x.shape)
    twice = keras.ops.convert_to_numpy(keras.ops.cast(_Loop(theirs)(x), "float32"))
    out = keras.ops.convert_to_numpy(keras.ops.cast(compiled(loop)(x), "float32"))
    np.testing.assert_allclose(out, twice, rtol=5 * tolerance, atol=5 * tolerance)


class _FeedForwardLoop(keras.layers.Layer):
    """Three steps of `h + up(down(h))` in the XLA-CPU engine's loop, as a decoding loop runs a feed-forward."""

    def __init__(self, width, hidden):
        super().__init__(name="feed_forward_loop")
        self.up, self.down = Dense(hidden, activation="relu"), Dense(width)
        self.up.build((None, width))
        self.down.build((None, hidden))

    def call(self, x):
        with XLA_CPU.decoding(self.up.variables + self.down.variables, rows=1), XLA_CPU.loop():
            return keras.ops.fori_loop(0, 3, lambda i, h: h + self.down(self.up(h)), x)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="XLA's one-row products under TensorFlow")
def test_one_row_inside_the_engine_loop_reads_the_rows_copied_before_the_loop():
    """One row by the kernel's rows `(N, K)`, copied once before the loop: each product of the loop's body is
    the matrix-vector product `rows @ x` (what XLA reads fastest for one row on a CPU), not
    output-fused with its bias into a single-threaded loop, and nothing is transposed or copied at each step."""
    x = rng.normal(size=(1, 1, 24)).astype("float32")
    loop = _FeedForwardLoop(24, 40)
    loop.build(x.shape)
    hlo = optimized_hlo(loop, x)
    name = re.search(r"body=(%[\w.\-]+)", hlo).group(1)
    body = next(c for c in hlo.split("\n\n") if c.startswith(name + " "))
    matrix_vector = r"= f32\[(\d+)\]\{0\} dot\([^)]*\), lhs_contracting_dims=\{1\}, rhs_contracting_dims=\{0\}"
    products = re.findall(matrix_vector, body)
    assert sorted(products) == ["24", "40"], body
    assert "kind=kOutput" not in body
    assert not re.search(r"= f32\[(40,24|24,40)\]\{[0-9,]*\} (copy|transpose|fusion)\(", body)
    h = x.reshape(1, 24)
    (k1, b1), (k2, b2) = ([np.asarray(w) for w in layer.get_weights()] for layer in (loop.up, loop.down))
    for _ in range(3):
        h = h + np.maximum(h @ k1 + b1, 0) @ k2 + b2
    np.testing.assert_allclose(keras.ops.convert_to_numpy(compiled(loop)(x)).reshape(1, 24), h, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(BACKEND not in ("tensorflow", "jax"), reason="XLA's loop-invariant code motion")
def test_int8_one_row_product_reads_int8_inside_the_loop():
    """In the XLA-CPU engine's loop, the cast of the int8 rows copied before the loop stays in the product,
    inside the loop; Keras' is hoisted out of it.

    Hoisted, the loop reads a converted copy of four bytes per weight (int32 or float32). And the
    activation quantizer stays out of the product: fused in, it runs once per row of the weights.
    """
    x = rng.normal(size=(1, 1, 24)).astype("float32")

    def casts(layer):
        """The computations that cast the int8 weights (to float32 or int32)."""
        loop = _RowsLoop(layer)
        loop.build(x.shape)
        computations = optimized_hlo(loop, x).split("\n\n")
        found = [c for c in computations if re.search(r"= (f32|s32)\[24,24\]\{[0-9,]*\} convert\(", c)]
        assert found, "no cast of the int8 weights at all"
        return found

    ours, theirs = Dense(24), keras.layers.Dense(24)
    for layer in (ours, theirs):
        layer.build((None, 24))
        layer.quantize("int8")
    for computation in casts(ours):
        assert " dot(" in computation and "round-nearest" not in computation
    assert any(" dot(" not in computation for computation in casts(theirs))  # what the test guards against


@pytest.mark.parametrize("shape", [(1, 1, 24), (3, 24)])
def test_bfloat16_equals_keras_bfloat16_dense_where_rows_pay(shape, monkeypatch):
    """In the XLA-CPU engine, one row of a bfloat16 layer multiplies the kernel's rows widened by their bits
    (an AVX2 CPU, where it pays):
    the float32 product of the bfloat16 values, rounded to bfloat16, as Keras' bfloat16 Dense computes it."""
    monkeypatch.setenv("TFAM_CPU_FLAGS", "avx2")
    ours = Dense(24, bias_initializer="random_normal", activation="gelu", dtype="bfloat16")
    theirs = keras.layers.Dense(24, activation="gelu", dtype="bfloat16")
    for layer in (ours, theirs):
        layer.build((None, 24))
    theirs.set_weights(ours.get_weights())
    x = keras.ops.cast(rng.normal(size=shape).astype("float32"), "bfloat16")
    kernel, bias = (np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(w, "float32"))) for w in ours.weights)
    for fn in (_in(XLA_CPU, ours), compiled(_in(XLA_CPU, lambda x: ours(x)))):
        out = keras.ops.convert_to_numpy(keras.ops.cast(fn(x), "float32"))
        expected = keras.ops.convert_to_numpy(keras.ops.cast(theirs(x), "float32"))
        np.testing.assert_allclose(out, expected, rtol=2e-2, atol=2e-2)  # a bfloat16 rounding apart at most
        x32 = keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))
        formula = keras.ops.convert_to_numpy(keras.ops.gelu(x32 @ kernel + bias, approximate=False))
        np.testing.assert_allclose(out, formula, rtol=3e-2, atol=3e-2)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's XLA fuses the widening into the product, JAX's not")
def test_bfloat16_one_row_product_reads_two_bytes_inside_the_loop(monkeypatch):
    """Where bfloat16 rows pay, the XLA-CPU engine's loop carries the kernel's 16 bits and widens them inside its
    product;
    Keras' bfloat16 Dense hands XLA's dot a float32 copy of the kernel, made once before the loop."""
    monkeypatch.setenv("TFAM_CPU_FLAGS", "avx2")
    x = keras.ops.cast(rng.normal(size=(1, 1, 24)).astype("float32"), "bfloat16")

    def computations(layer):
        layer.build((None, 24))
        loop = _EngineLoop(layer)
        loop.build(x.shape)
        return optimized_hlo(loop, x).split("\n\n")

    ours = computations(Dense(24, dtype="bfloat16"))
    assert any(" dot(" in c and " shift-left(" in c for c in ours), "no product widening the kernel's bits"
    float_copy = re.compile(r"= f32\[24,24\]\{[0-9,]*\} convert\(")
    assert not any(float_copy.search(c) for c in ours)
    assert any(float_copy.search(c) for c in computations(keras.layers.Dense(24, dtype="bfloat16")))  # guarded against


def test_lora_layers_take_keras_paths():
    x = rng.normal(size=(1, 1, 8)).astype("float32")
    ours, theirs = _pair()
    for layer in (ours, theirs):
        layer.enable_lora(2)
        layer.lora_kernel_b.assign(rng.normal(size=(2, 6)).astype("float32"))
    theirs.lora_kernel_a.assign(ours.lora_kernel_a)
    theirs.lora_kernel_b.assign(ours.lora_kernel_b)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(ours(x)), keras.ops.convert_to_numpy(theirs(x)), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("layer", [partial(Dense, 6), partial(TiedEmbedding, 11, 8)], ids=["Dense", "TiedEmbedding"])
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantize_frees_the_float_weights_without_a_collection(layer, mode, monkeypatch):
    """Keras runs `gc.collect()` per deleted variable; the float weights need none to be freed (no cycle)."""
    layer = layer()
    layer.build((None, 8))
    float_weights = weakref.ref(layer.trainable_weights[0])
    collections = []
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(args))
    layer.quantize(mode)
    assert float_weights() is None and collections == []
    assert all(w is not float_weights() for w in layer.weights)
    assert layer.quantization_mode == mode
