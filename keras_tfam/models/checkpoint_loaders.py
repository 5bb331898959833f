"""Where checkpoint loaders and writers register, so models never import their converters (arrows point down).

`keras_tfam.convert` imports the models it fills and registers a loader
per source format here (`register_checkpoint_loader`); a model's
`from_huggingface` / `from_keras_hub` looks the loader up by format.
`keras_tfam/__init__.py` imports `keras_tfam.convert`, so the loaders are
registered whenever any part of the library is imported.
"""

_LOADERS = {}
_WRITERS = {}


def register_checkpoint_loader(source):
    """Decorator: registers `loader(checkpoint, cls, **overrides)` for checkpoints of `source`."""

    def register(loader):
        _LOADERS[source] = loader
        return loader

    return register


def checkpoint_loader(source):
    """The loader registered for `source`; a `ValueError` naming the registered ones otherwise."""
    if source not in _LOADERS:
        raise ValueError(
            f"No checkpoint loader for {source!r} is registered (import keras_tfam.convert). "
            f"Registered: {sorted(_LOADERS)}"
        )
    return _LOADERS[source]


def register_checkpoint_writer(target):
    """Decorator: registers `writer(model, directory, **options)` for checkpoints of `target`."""

    def register(writer):
        _WRITERS[target] = writer
        return writer

    return register


def checkpoint_writer(target):
    """The writer registered for `target`; a `ValueError` naming the registered ones otherwise."""
    if target not in _WRITERS:
        raise ValueError(
            f"No checkpoint writer for {target!r} is registered (import keras_tfam.convert). "
            f"Registered: {sorted(_WRITERS)}"
        )
    return _WRITERS[target]
