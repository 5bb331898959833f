"""Attention kinds by name: the one list a model's `attention` option, the CLI and the tests read.

A kind registers itself next to its class with `@register_attention("name")`,
and `keras_tfam/layers/attention/__init__.py` imports its file: a new kind
is one new file plus one import line. A model builds a kind with
`make_attention` and never branches on the name.
"""

# name -> class, in registration order.
_KINDS = {}


def register_attention(name, decoder=True):
    """Class decorator: registers an attention kind under `name`.

    Args:
        name: the name models and the CLI use (`attention="name"`).
        decoder: whether decoder models offer it (a causal kind that decodes
            with a cache); encoder-only kinds (Linformer) register with
            `decoder=False`.
    """

    def register(cls):
        if name in _KINDS and _KINDS[name] is not cls:
            raise ValueError(f"An attention kind is already registered as {name!r}: {_KINDS[name].__name__}")
        _KINDS[name] = cls
        cls.registered_name = name
        cls.decoder_kind = decoder
        return cls

    return register


def unregister_attention(name):
    """Removes the kind registered as `name` (a kind registered for a test, say); a `ValueError` if there is none."""
    if name not in _KINDS:
        raise ValueError(f"No attention kind is registered as {name!r}. Registered: {sorted(_KINDS)}")
    del _KINDS[name]


def attention_kinds(decoder=None):
    """`{name: class}` of the registered kinds; with `decoder=True` those decoder models offer."""
    return {name: cls for name, cls in _KINDS.items() if decoder is None or cls.decoder_kind == decoder}


class _DecoderKinds(dict):
    """`ATTENTIONS`: the decoder kinds, read at each access so kinds registered later appear."""

    def _current(self):
        return attention_kinds(decoder=True)

    def __getitem__(self, name):
        return self._current()[name]

    def __contains__(self, name):
        return name in self._current()

    def __iter__(self):
        return iter(self._current())

    def __len__(self):
        return len(self._current())

    def keys(self):
        return self._current().keys()

    def items(self):
        return self._current().items()

    def values(self):
        return self._current().values()

    def get(self, name, default=None):
        return self._current().get(name, default)

    def __repr__(self):
        return repr(self._current())


# The kinds decoder models offer, as a mapping (kept for code that imported it).
ATTENTIONS = _DecoderKinds()


def get_attention_class(name, decoder=True):
    """The class registered as `name`; a `ValueError` naming it otherwise."""
    kinds = attention_kinds(decoder=True if decoder else None)
    if name not in kinds:
        raise ValueError(f"`attention` must be one of {tuple(kinds)}. Received: attention={name!r}")
    return kinds[name]


def make_attention(kind, num_heads, key_dim, options=None, **layer_arguments):
    """An attention layer of kind `kind`.

    Args:
        kind: a registered decoder kind.
        num_heads, key_dim: its heads.
        options: the kind's own arguments (e.g. `{"feature_map": "exp"}`
            for `"linear"`), as given by a user.
        **layer_arguments: what the model sets for every kind (initializers,
            `position`, `dtype`, `name`, ...). A kind without attention
            weights (`has_attention_weights = False`) ignores `dropout`.
    """
    options = dict(options or {})
    cls = get_attention_class(kind)
    if not cls.has_attention_weights:
        layer_arguments.pop("dropout", None)
    clash = sorted(set(options) & (set(layer_arguments) | {"num_heads", "key_dim"}))
    if clash:
        raise ValueError(
            f"`attention_options` cannot set what the model sets itself: {clash}. Received: attention_options={options}"
        )
    return cls(num_heads, key_dim, **layer_arguments, **options)
