"""Building a model whose weights a checkpoint will overwrite, without drawing them at random first.

A model's variables are drawn from their initializers when they are
created: for a 250M-parameter LM, about 5 s of random numbers on a CPU that a
loader then throws away. Keras can defer that: variables created inside a
`keras.StatelessScope(initialize_variables=False)` hold their initializer
and no value. `build_undrawn` builds so; `fill` gives a deferred variable its
checkpoint value as its initial value (an ordinary assignment otherwise);
`build_and_fill` does the three, drawing at the end those the checkpoint did
not fill (e.g. dropout seeds), so the model leaves the loader like any other.

Keras has no public call that initializes one deferred variable with a
given value; this module is the one place that uses its private hooks
(`_initializer`, `_deferred_initialize`), and it falls back to drawing the
variables as usual where they are missing.
"""

import keras

_HOOKS = all(hasattr(keras.Variable, name) for name in ("_deferred_initialize", "_initialize_with_initializer"))


def build_undrawn(build):
    """`build()`, its variables created but not drawn (where this Keras can defer them)."""
    if not _HOOKS:
        return build()
    with keras.StatelessScope(initialize_variables=False):
        return build()


def _deferred(variable):
    return getattr(variable, "_value", True) is None and getattr(variable, "_initializer", None) is not None


def fill(variable, value):
    """Sets `variable` to `value` (a NumPy array of its shape and dtype): its first value if deferred."""
    if _deferred(variable):
        variable._initializer = lambda shape, dtype: value
        variable._deferred_initialize()
    else:
        variable.assign(value)


def build_and_fill(build, fill_model):
    """`build()` undrawn, `fill_model(model)` (which `fill`s its variables), the rest drawn: the model.

    When `fill_model` fails, the model's variables are dropped from Keras'
    list of deferred ones (the model is lost, nothing is drawn for it).
    """
    model = build_undrawn(build)
    try:
        fill_model(model)
    except BaseException:
        _forget(model)
        raise
    if _HOOKS:
        for variable in model.variables:
            if _deferred(variable):
                variable._deferred_initialize()
        _forget(model)
    return model


def _forget(model):
    if not _HOOKS:
        return
    from keras.src.backend.common import global_state

    mine = {id(variable) for variable in model.variables}
    pending = global_state.get_global_attribute("uninitialized_variables") or []
    global_state.set_global_attribute(
        "uninitialized_variables", [v for v in pending if id(v) not in mine and _deferred(v)]
    )
