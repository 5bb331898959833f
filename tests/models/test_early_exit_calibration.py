"""Threshold calibration: a risk that is NaN must never pass Learn-then-Test."""

import numpy as np
import pytest

from keras_tfam.models import grid_search_threshold, learn_then_test


def risk_with_nan_below(cutoff, n=2000):
    """0/1 losses at rate `0.2 * (1 - threshold)`, and a NaN loss for thresholds below `cutoff`."""

    def risk(threshold):
        losses = np.zeros(n)
        losses[: int(round(n * 0.2 * (1.0 - threshold)))] = 1.0
        if threshold < cutoff:
            losses[7] = np.nan  # e.g. a 0/0 in a per-sequence rate
        return losses

    return risk


@pytest.mark.parametrize("calibrate", [learn_then_test, grid_search_threshold])
def test_a_nan_risk_is_refused_naming_the_threshold_and_example(calibrate):
    # Risks 0 and .04 pass; at 0.6 the NaN mean gave a NaN p-value, which `p > epsilon` never rejected,
    # so Learn-then-Test went on and calibrated a threshold of 0.0.
    with pytest.raises(ValueError) as error:
        calibrate(risk_with_nan_below(0.7), [1.0, 0.8, 0.6, 0.4, 0.2, 0.0], tolerance=0.1)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("`risk(0.6)` must return per-example losses in [0, 1]")
    assert message.endswith("Received: nan for example 7")


def test_risks_outside_zero_one_and_empty_risks_are_refused():
    with pytest.raises(ValueError, match=r"`risk\(0.5\)` .*Received: inf for example 2$"):
        learn_then_test(lambda t: [0.0, 0.0, np.inf], [0.5], tolerance=0.1)
    with pytest.raises(ValueError, match=r"Received: -0.5 for example 0$"):
        learn_then_test(lambda t: [-0.5], [0.5], tolerance=0.1)
    with pytest.raises(ValueError, match="Received: no values$"):
        learn_then_test(lambda t: [], [0.5], tolerance=0.1)


@pytest.mark.parametrize("name, kwargs", [("tolerance", {"tolerance": np.nan}), ("epsilon", {"epsilon": np.nan})])
def test_nan_settings_are_refused(name, kwargs):
    with pytest.raises(ValueError, match=f"Received: {name}=nan"):
        learn_then_test(risk_with_nan_below(0.0), [0.5], **{"tolerance": 0.1, **kwargs})
    with pytest.raises(ValueError, match="Received: threshold=nan"):
        learn_then_test(risk_with_nan_below(0.0), [0.5, np.nan], tolerance=0.1)


@pytest.mark.parametrize(
    "kwargs, shown",
    [
        ({"tolerance": "0.1"}, "tolerance='0.1'"),
        ({"tolerance": np.float32(1.5)}, "tolerance=np.float32(1.5)"),
        ({"thresholds": ["0.5"]}, "threshold='0.5'"),
        ({"thresholds": 0.5}, "thresholds=0.5"),
        ({"thresholds": [True]}, "threshold=True"),
    ],
)
def test_settings_of_another_type_are_refused_in_one_line(kwargs, shown):
    arguments = {"risk": lambda t: [0.0], "thresholds": [0.5], "tolerance": 0.1, **kwargs}
    for calibrate in (grid_search_threshold, learn_then_test):
        with pytest.raises(ValueError) as error:
            calibrate(**arguments)
        assert "\n" not in str(error.value) and str(error.value).endswith(f"Received: {shown}")
    assert grid_search_threshold(lambda t: [0.0], [np.float32(0.5)], np.float64(0.1))[0] == 0.5
