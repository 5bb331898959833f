"""A model's constructor argument declared once: the table its constructor, `get_config` and the CLI read."""

import math
from collections.abc import Mapping

import numpy as np

from keras_tfam.utils import is_integer

_KINDS = {int: "an integer", float: "a finite number", bool: "True or False", dict: "a mapping", str: "a string"}


class Option:
    """One argument of a model's constructor that a training config may set.

    A model class declares its options once, next to the class, as `OPTIONS = {name: Option(...)}`. Its
    constructor checks its arguments with `check_options`, its `get_config` lists them with
    `option_config`, and `keras_tfam.models.presets` (`check_model_option`) and the `tfam train` flags read
    the same table: an option is never listed again by hand.

    Args:
        kind: `int`, `float`, `bool`, `dict` or `str`.
        choices: the closed set of a `str` option: a tuple, or a function returning one, called at each check
            (a registry's names, so that a kind registered after import is accepted).
        allowed: for a `float`, what is allowed in words (`"> 0"`, `"in [0, 1)"`), with `condition`.
        condition: for a `float`, the predicate `allowed` says in words.
        zero: for an `int`, what 0 means where 0 is a setting (`"no memory"`); other `int` options are
            sizes, at least 1.
        optional: whether `None` (the constructor's default: derived from other options, or off) is taken.
        indices: for a `str` option, whether a list of layer indices is taken too (checked against the
            number of layers by the model).

    Example:
        >>> Option(float, allowed="in [0, 1)", condition=lambda rate: 0.0 <= rate < 1.0).check("dropout", 0.1)
        0.1
    """

    def __init__(self, kind, choices=None, allowed=None, condition=None, zero=None, optional=False, indices=False):
        if kind not in _KINDS:
            raise ValueError(f"`kind` must be one of {tuple(k.__name__ for k in _KINDS)}. Received: kind={kind!r}")
        if (choices is not None) != (kind is str):
            raise ValueError(
                f"A `str` option, and only it, has `choices`. Received: kind={kind!r}, choices={choices!r}"
            )
        self.kind = kind
        self.choices = choices
        self.allowed = allowed
        self.condition = condition
        self.zero = zero
        self.optional = optional
        self.indices = indices

    def values(self):
        """The closed set of values of a `str` option, read now (a registry's current names); `None` otherwise."""
        if self.choices is None:
            return None
        return tuple(self.choices() if callable(self.choices) else self.choices)

    def check(self, name, value):
        """`value` if option `name` takes it (NumPy scalars as Python numbers); a `ValueError` naming it."""
        if value is None and self.optional:
            return None
        if self.kind is str:
            return self._check_choice(name, value)
        if self.kind is int:
            return self._check_int(name, value)
        if self.kind is float:
            return self._check_float(name, value)
        if self.kind is bool:
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")
            return bool(value)
        if not isinstance(value, Mapping):
            raise ValueError(f"`{name}` must be a mapping. Received: {name}={value!r}")
        return value

    def _check_choice(self, name, value):
        values = self.values()
        if self.indices and isinstance(value, (list, tuple)):
            if not all(is_integer(i) and i >= 0 for i in value):
                raise ValueError(f"`{name}` must list non-negative layer indices. Received: {name}={value!r}")
            return [int(i) for i in value]
        if not isinstance(value, str) or value not in values:
            also = " or a list of layer indices" if self.indices else ""
            raise ValueError(f"`{name}` must be one of {values}{also}. Received: {name}={value!r}")
        return value

    def _check_int(self, name, value):
        if self.zero is not None:
            if not is_integer(value) or value < 0:
                raise ValueError(
                    f"`{name}` must be a non-negative integer (0: {self.zero}). Received: {name}={value!r}"
                )
        elif not is_integer(value) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
        return int(value)

    def _check_float(self, name, value):
        real = None
        if is_integer(value) or isinstance(value, (float, np.floating)):
            try:
                real = float(value)
            except OverflowError:  # an integer beyond float range
                real = None
        if real is None or not math.isfinite(real) or (self.condition is not None and not self.condition(real)):
            allowed = f" {self.allowed}" if self.allowed else ""
            raise ValueError(f"`{name}` must be a finite number{allowed}. Received: {name}={value!r}")
        return real

    def __repr__(self):
        return f"Option({self.kind.__name__}" + (f", choices={self.values()}" if self.choices else "") + ")"


def check_options(options, arguments):
    """`{name: checked value}` of every option of `options` (`{name: Option}`) in `arguments` (a mapping)."""
    return {name: option.check(name, arguments[name]) for name, option in options.items()}


def option_config(model, options):
    """`{name: model.name}` of every option of `options`: the part of `get_config` they make."""
    config = {}
    for name in options:
        value = getattr(model, name)
        if isinstance(value, Mapping):
            value = dict(value)
        elif isinstance(value, (list, tuple)):
            value = list(value)
        config[name] = value
    return config
