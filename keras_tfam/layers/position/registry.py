"""Position schemes applied inside attention, by name: the list models and the CLI read.

Each entry builds a fresh scheme for an attention layer of `num_heads`
heads. These schemes see positions only through query-key distances, so a
model using one can decode with sliding-window (ring) caches.
"""

from keras_tfam.layers.position.alibi_bias import ALiBiBias
from keras_tfam.layers.position.relative_position_bias import RelativePositionBias
from keras_tfam.layers.position.rotary_embedding import RotaryEmbedding
from keras_tfam.layers.position.shaw_relative_position import ShawRelativePosition
from keras_tfam.layers.position.transformer_xl_position import TransformerXLPosition

ATTENTION_POSITIONS = {
    "rotary": lambda num_heads, **options: RotaryEmbedding(**options),
    "alibi": ALiBiBias,
    "relative": lambda num_heads, **options: RelativePositionBias(num_heads, **{"bidirectional": False, **options}),
    "shaw": lambda num_heads, **options: ShawRelativePosition(**{"max_distance": 16, **options}),
    "transformer_xl": TransformerXLPosition,
}


def make_attention_position(name, num_heads, options=None):
    """A new scheme registered as `name` for `num_heads` heads, with the scheme's own `options` (e.g.
    `{"max_wavelength": 5e5, "pairing": "half"}` for rotary); a `ValueError` naming a bad one."""
    if name not in ATTENTION_POSITIONS:
        raise ValueError(f"`position` must be one of {tuple(ATTENTION_POSITIONS)}. Received: position={name!r}")
    try:
        return ATTENTION_POSITIONS[name](num_heads, **dict(options or {}))
    except (TypeError, ValueError) as error:  # Keras layers refuse unknown keywords with a ValueError
        raise ValueError(f"`position_options` do not fit position={name!r} ({error}). Received: {options!r}") from None
