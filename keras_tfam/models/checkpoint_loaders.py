"""Where checkpoint loaders and writers register, so models never import their converters (arrows point down).

`keras_tfam.convert` imports the models it fills and registers a loader
per source format here (`register_checkpoint_loader`); a model's
`from_huggingface` / `from_keras_hub` looks the loader up by format.
`keras_tfam/__init__.py` imports `keras_tfam.convert`, so the loaders are
registered whenever any part of the library is imported.
"""

_REGISTERED = {"loader": {}, "writer": {}}


def _registering(kind, name):
    def register(function):
        _REGISTERED[kind][name] = function
        return function

    return register


def _registered(kind, name):
    table = _REGISTERED[kind]
    if name not in table:
        raise ValueError(
            f"No checkpoint {kind} for {name!r} is registered (import keras_tfam.convert). Registered: {sorted(table)}"
        )
    return table[name]


def register_checkpoint_loader(source):
    """Decorator: registers `loader(checkpoint, cls, **overrides)` for checkpoints of `source`."""
    return _registering("loader", source)


def checkpoint_loader(source):
    """The loader registered for `source`; a `ValueError` naming the registered ones otherwise."""
    return _registered("loader", source)


def register_checkpoint_writer(target):
    """Decorator: registers `writer(model, directory, **options)` for checkpoints of `target`."""
    return _registering("writer", target)


def checkpoint_writer(target):
    """The writer registered for `target`; a `ValueError` naming the registered ones otherwise."""
    return _registered("writer", target)
