"""Engines: how the layers compute inside one decoding call, behind one interface.

Outside an entered engine, and inside the plain one (`Engine`), every layer computes what Keras computes.
The generator enters an engine for one decoding call (`Generator.generate(..., engine="auto")`):

    with engine.decoding(variables, rows):   # the caches, the prompt's pass and the loop
        ...
        with engine.loop():                  # the decoding loop: loop invariants prepared once, before it
            ...

An engine answers a few hooks that the layers call (`dense`, `int8_dense`, `reverse_embedding`, `int8_logits`)
and the caches call (`cache_dtype`, `cache_value_dtype`, `cache_values`, `cache_stored`); the plain engine
answers `None` (the layer then runs Keras' own computation) or returns its input.
`keras_tfam.engine.xla_cpu.XlaCpuEngine` holds the forms XLA's CPU backend runs faster; deleting that module
(and the generator's `"auto"` choice of it) leaves everything computing in plain mode.

Examples:
    >>> layer = keras_tfam.layers.Dense(4)
    >>> with Engine().decoding(layer.weights, rows=1):
    ...     current_engine().dense(layer, np.ones((1, 3))) is None  # Keras' own product
    True
"""

import contextlib
import dataclasses
import threading

__all__ = ["Engine", "PLAIN", "current_engine"]

_ENTERED = threading.local()


@dataclasses.dataclass
class Decoding:
    """One entered decoding call: its engine, the variables it computes with, its rows per step, whether XLA
    compiles it, and what the engine prepared for its loop (`Engine.loop`)."""

    engine: "Engine"
    variables: list
    rows: object = None
    compiled: bool = True
    prepared: dict = dataclasses.field(default_factory=dict)


def _stack():
    if not hasattr(_ENTERED, "stack"):
        _ENTERED.stack = []
    return _ENTERED.stack


def current_decoding():
    """The innermost entered `Decoding` of this thread, or `None`."""
    stack = _stack()
    return stack[-1] if stack else None


def current_engine():
    """The engine of the innermost entered decoding call of this thread; the plain engine outside one."""
    decoding = current_decoding()
    return PLAIN if decoding is None else decoding.engine


class Engine:
    """The plain engine, and the interface every engine implements: layers compute exactly what Keras computes.

    An engine is stateless; what one decoding call prepares lives in its `Decoding`. Each hook below returns
    `None` for "Keras' own computation" (or its input unchanged); a subclass overrides the hooks it computes
    differently.

    Args:
        None: an engine is stateless; `PLAIN` is the plain one.

    Examples:
        >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)
        >>> model.generate([[5, 7]], max_new_tokens=4, engine=Engine()).shape  # as engine="plain"
        (1, 6)
    """

    name = "plain"

    def __repr__(self):
        return f"<keras_tfam engine {self.name!r}>"

    @contextlib.contextmanager
    def decoding(self, variables=(), rows=None, compiled=True):
        """Makes this the current engine for one decoding call; `rows`: the rows a loop step multiplies, if known;
        `compiled`: whether XLA compiles the call (false: TensorFlow's executor runs it op by op)."""
        stack = _stack()
        stack.append(Decoding(self, list(variables), rows, compiled))
        try:
            yield self
        finally:
            stack.pop()

    @contextlib.contextmanager
    def loop(self):
        """Around the decoding loop of the entered call: where an engine prepares loop invariants (none here)."""
        yield

    def jax_jit(self, fn):
        """`fn` compiled with `jax.jit`, the engine's compiler options included (none here)."""
        import jax

        return jax.jit(fn)

    def dense(self, layer, inputs):
        """`layer(inputs)` for a float `keras_tfam.layers.Dense`, or `None` for Keras' own `Dense.call`."""
        return None

    def int8_dense(self, layer, inputs):
        """`layer(inputs)` for an int8 `keras_tfam.layers.Dense`, or `None` for Keras' own `Dense._int8_call`."""
        return None

    def reverse_embedding(self, layer, inputs):
        """The logits `inputs @ E^T` of a float `TiedEmbedding`, or `None` for Keras' reverse projection."""
        return None

    def int8_logits(self, layer, inputs):
        """The logits of an int8 `TiedEmbedding`, or `None` for Keras' int8 reverse projection."""
        return None

    def cache_dtype(self, dtype):
        """The dtype a cache of `dtype` values is stored in: `dtype` itself."""
        return dtype

    def cache_value_dtype(self, stored_dtype):
        """The dtype of the values a cache stored in `stored_dtype` holds: `stored_dtype` itself."""
        return stored_dtype

    def cache_values(self, stored):
        """A stored cache tensor as the values it holds: itself."""
        return stored

    def cache_stored(self, values, stored_dtype):
        """`values` (in the cache's value dtype) as a cache of `stored_dtype` stores them: themselves."""
        return values


PLAIN = Engine()
