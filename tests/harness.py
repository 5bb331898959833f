"""The shared layer test harness every public layer passes (STYLE.md rule 10).

Subclass `LayerHarness` in a test module, set `layer_cls`, `init_kwargs` and
`call_kwargs`, and implement `make_inputs()` returning a dict of call argument
name -> NumPy array. pytest then runs, for that layer:

- `get_config` / `from_config` round trip, with equal outputs on equal weights;
- `.keras` save and load inside a functional model, with equal outputs;
- symbolic (functional) and eager calls agreeing;
- one `fit` step compiled with `jit_compile=True` (XLA; eager on PyTorch, see
  `test_jit_fit_step`) that changes the weights;
- a `mixed_float16` layer with float32 variables and finite outputs close to
  the float32 ones.
"""

import keras
import numpy as np
from backend import build_optimizer


def as_numpy(x):
    return keras.ops.convert_to_numpy(x)


class LayerHarness:
    layer_cls = None
    init_kwargs = {}
    call_kwargs = {}
    # Relative tolerance of mixed_float16 outputs against float32 ones.
    mixed_precision_tolerance = 2e-2

    def make_inputs(self):
        raise NotImplementedError

    def _layer(self, **overrides):
        return self.layer_cls(**{**self.init_kwargs, **overrides})

    def _call(self, layer, inputs):
        return layer(**inputs, **self.call_kwargs)

    def _model(self, layer, inputs):
        symbolic = {
            name: keras.Input(shape=value.shape[1:], dtype=str(value.dtype), name=name)
            for name, value in inputs.items()
        }
        return keras.Model(symbolic, self._call(layer, symbolic))

    def test_config_round_trip(self):
        inputs = self.make_inputs()
        layer = self._layer()
        expected = as_numpy(self._call(layer, inputs))
        config = layer.get_config()
        clone = self.layer_cls.from_config(config)
        assert clone.get_config() == config
        self._call(clone, inputs)
        clone.set_weights(layer.get_weights())
        np.testing.assert_allclose(as_numpy(self._call(clone, inputs)), expected, rtol=1e-6, atol=1e-6)

    def test_keras_save_load(self, tmp_path):
        inputs = self.make_inputs()
        model = self._model(self._layer(), inputs)
        expected = as_numpy(model(inputs))
        path = str(tmp_path / "model.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
        np.testing.assert_allclose(as_numpy(loaded(inputs)), expected, rtol=1e-6, atol=1e-6)

    def test_symbolic_and_eager(self):
        inputs = self.make_inputs()
        layer = self._layer()
        model = self._model(layer, inputs)
        eager = as_numpy(self._call(layer, inputs))
        assert tuple(model.output.shape[1:]) == eager.shape[1:]
        np.testing.assert_allclose(as_numpy(model(inputs)), eager, rtol=1e-6, atol=1e-6)

    def test_jit_fit_step(self):
        inputs = self.make_inputs()
        layer = self._layer()
        model = self._model(layer, inputs)
        target = np.random.default_rng(0).normal(size=model(inputs).shape).astype("float32")
        # XLA on TensorFlow and JAX. On PyTorch, `jit_compile=True` is torch.compile, whose inductor writes and
        # builds C++ for each new model (30 to 70 s a layer on 2 cores: the whole harness would take hours);
        # there the step runs as Keras runs it by default on PyTorch, eagerly.
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=keras.config.backend() != "torch")
        build_optimizer(model)  # one trace of the step, not two
        before = [as_numpy(w) for w in model.trainable_weights]
        history = model.fit(inputs, target, batch_size=len(target), epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])
        after = [as_numpy(w) for w in model.trainable_weights]
        if before:
            assert any(not np.array_equal(b, a) for b, a in zip(before, after))

    def test_mixed_float16(self):
        inputs = self.make_inputs()
        reference_layer = self._layer()
        expected = as_numpy(self._call(reference_layer, inputs))
        layer = self._layer(dtype="mixed_float16")
        self._call(layer, inputs)
        assert all(w.dtype == "float32" for w in layer.weights)
        layer.set_weights(reference_layer.get_weights())
        outputs = as_numpy(self._call(layer, inputs)).astype("float32")
        assert np.all(np.isfinite(outputs))
        scale = np.max(np.abs(expected)) + 1e-6
        assert np.max(np.abs(outputs - expected)) / scale < self.mixed_precision_tolerance
