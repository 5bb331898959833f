"""Building a model whose weights a checkpoint overwrites: `build_and_fill` and `fill`.

The model is built as Keras builds any model (its variables drawn from
their initializers), then each variable a checkpoint holds is assigned its
value; the others (e.g. dropout seeds) keep their draws. Keras has no
public call that gives a deferred variable (`keras.StatelessScope(
initialize_variables=False)`) its first value, so the draws are not skipped.
"""


def fill(variable, value):
    """Sets `variable` to `value` (a NumPy array of its shape and dtype)."""
    variable.assign(value)


def build_and_fill(build, fill_model):
    """`build()`, then `fill_model(model)` (which `fill`s its variables): the model."""
    model = build()
    fill_model(model)
    return model
