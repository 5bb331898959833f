"""`.keras` files written by keras_tfam 0.2.0 (before the attention contract) still load and compute the same.

`tests/data/legacy/make_legacy.py` wrote them at that version with the logits they gave; the files
hold every kind whose code the contract moved (softmax with rotary, grouped-query heads and local
layers; linear; Performer; LSH; routing; ALiBi with a strided pattern).
"""

import pathlib

import keras
import numpy as np
import pytest

import keras_tfam  # noqa: F401 (registers the classes)

LEGACY = pathlib.Path(__file__).resolve().parent.parent / "data" / "legacy"
IDS = np.array([[3, 14, 15, 9, 2, 6, 5, 3, 5, 8, 9, 7]], "int32")


@pytest.mark.parametrize("path", sorted(LEGACY.glob("*.keras")), ids=lambda path: path.stem)
def test_a_file_of_keras_tfam_0_2_loads_and_gives_its_logits(path):
    model = keras.saving.load_model(path)
    expected = np.load(path.with_name(path.stem + ".logits.npy"))
    np.testing.assert_allclose(np.asarray(model(IDS)), expected, rtol=1e-5, atol=1e-5)
    # And it decodes through the contract: cached steps equal the full pass.
    step = model.call_with_cache(IDS[:, :5], model.init_cache(1, IDS.shape[1]), 0)
    logits = [np.asarray(step.logits)]
    for t in range(5, IDS.shape[1]):
        step = model.call_with_cache(IDS[:, t : t + 1], step.cache, t)
        logits.append(np.asarray(step.logits))
    np.testing.assert_allclose(np.concatenate(logits, axis=1), expected, rtol=1e-5, atol=1e-5)
