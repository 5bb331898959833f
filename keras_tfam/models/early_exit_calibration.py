"""Calibrating an early-exit threshold on a validation split: grid search, or Learn-then-Test (CALM)."""

import math

import numpy as np

from keras_tfam.utils import check_real


def _sorted_thresholds(thresholds):
    if isinstance(thresholds, (str, bytes)) or not hasattr(thresholds, "__iter__"):
        raise ValueError(f"`thresholds` must be a list of numbers in [0, 1]. Received: thresholds={thresholds!r}")
    in_range = [check_real("threshold", t, "in [0, 1]", lambda t: 0.0 <= t <= 1.0) for t in thresholds]
    thresholds = sorted(set(in_range), reverse=True)
    if not thresholds:
        raise ValueError("`thresholds` is empty: give at least one candidate threshold")
    return thresholds


def _check_tolerance(tolerance):
    return check_real("tolerance", tolerance, "in (0, 1)", lambda value: 0.0 < value < 1.0)


def _risks(risk, threshold):
    """`risk(threshold)` as float64 `(n,)`, every loss in `[0, 1]`.

    A NaN loss is refused like any other outside `[0, 1]`: its mean is NaN,
    whose Hoeffding p-value `exp(-2 n NaN)` is NaN, which no comparison
    with `epsilon` would reject, so the threshold would pass the test.
    """
    values = np.asarray(risk(threshold), np.float64).reshape(-1)
    if values.size == 0:
        raise ValueError(f"`risk({threshold})` must return per-example losses in [0, 1]. Received: no values")
    outside = ~((values >= 0.0) & (values <= 1.0))  # NaN included
    if outside.any():
        example = int(np.argmax(outside))
        raise ValueError(
            f"`risk({threshold})` must return per-example losses in [0, 1] (not NaN). Received: "
            f"{values[example]} for example {example}"
        )
    return values


def grid_search_threshold(risk, thresholds, tolerance):
    """The smallest threshold whose empirical risk on the calibration data is at most `tolerance`.

    Args:
        risk: `threshold -> (n,)` per-example losses in `[0, 1]` (for
            instance the fraction of a sequence's tokens whose early-exit
            prediction differs from the full model's).
        thresholds: candidates in `[0, 1]`.
        tolerance: the largest acceptable mean risk `delta`.

    Returns:
        `(threshold, records)`: the chosen threshold (`1.0`, never exiting,
        when no candidate qualifies) and one `{"threshold", "risk"}` dict per
        candidate, largest threshold first.
    """
    tolerance = _check_tolerance(tolerance)
    records = [{"threshold": t, "risk": float(_risks(risk, t).mean())} for t in _sorted_thresholds(thresholds)]
    passing = [r["threshold"] for r in records if r["risk"] <= tolerance]
    return (min(passing) if passing else 1.0), records


def learn_then_test(risk, thresholds, tolerance, epsilon=0.05):
    """CALM's calibration: Learn-then-Test with fixed-sequence testing (Angelopoulos et al. 2021).

    Candidates are tested from the largest (safest) down. For each, the null
    hypothesis "the expected risk exceeds `tolerance`" gets the Hoeffding
    p-value `exp(-2 n (tolerance - mean risk)_+^2)` over the `n` calibration
    examples; testing stops at the first candidate whose p-value exceeds
    `epsilon`. The smallest rejected null gives a threshold whose risk is at
    most `tolerance` with probability at least `1 - epsilon` (over the draw
    of the calibration set), for the same distribution.

    Args:
        risk: `threshold -> (n,)` per-example losses in `[0, 1]`; a NaN
            loss raises a `ValueError` (naming the threshold and the
            example) instead of passing the test.
        thresholds: candidates in `[0, 1]`.
        tolerance: `delta`, in `(0, 1)`.
        epsilon: allowed probability of a wrong guarantee, in `(0, 1)`.

    Returns:
        `(threshold, records)`: the smallest accepted threshold (`1.0`,
        never exiting, when even the first fails) and one
        `{"threshold", "risk", "p_value"}` dict per tested candidate.
    """
    tolerance = _check_tolerance(tolerance)
    epsilon = check_real("epsilon", epsilon, "in (0, 1)", lambda value: 0.0 < value < 1.0)
    chosen, records = 1.0, []
    for threshold in _sorted_thresholds(thresholds):
        values = _risks(risk, threshold)
        mean = float(values.mean())
        p_value = math.exp(-2.0 * values.size * max(tolerance - mean, 0.0) ** 2)
        records.append({"threshold": threshold, "risk": mean, "p_value": p_value})
        if p_value > epsilon:
            break
        chosen = threshold
    return chosen, records
