"""Seeded random matrices held as weights, redrawn on a policy: random features and LSH rotations."""

import math
import random

import keras
from keras import ops

from keras_tfam.utils import check_positive_int, is_integer


def gaussian_matrix(rows, columns, seed, orthogonal=False):
    """A `(rows, columns)` float32 matrix whose rows are standard normal vectors.

    With `orthogonal`, rows come in blocks of `columns` mutually orthogonal
    rows (Yu et al. 2016; Performer's ORF): each block is the orthogonal
    factor of a Gaussian matrix, its signs fixed by the diagonal of `R` so
    that it is uniform (Haar; Mezzadri 2007), and each row is rescaled by
    the norm of an independent Gaussian vector, so that each row alone is
    still exactly `N(0, I)`. Estimators built on the rows stay unbiased;
    orthogonality lowers their variance.

    Args:
        rows, columns: the shape.
        seed: an int, or a `keras.random.SeedGenerator`.
        orthogonal: orthogonal blocks instead of independent rows.
    """
    if not orthogonal:
        return keras.random.normal((rows, columns), seed=seed, dtype="float32")
    # One draw (an int seed gives the same numbers on every call): the
    # Gaussian blocks, then the Gaussian vectors whose norms scale the rows.
    blocks = math.ceil(rows / columns)
    gaussian = keras.random.normal((2 * blocks, columns, columns), seed=seed, dtype="float32")
    q, r = ops.qr(gaussian[:blocks])  # batched
    signs = ops.where(ops.diagonal(r, axis1=-2, axis2=-1) < 0, -1.0, 1.0)
    directions = ops.reshape(ops.swapaxes(q * signs[:, None, :], -1, -2), (blocks * columns, columns))[:rows]
    norms = ops.norm(ops.reshape(gaussian, (-1, columns))[blocks * columns :][:rows], axis=-1)
    return directions * norms[:, None]


class SeededDraws:
    """Mixin of layers that hold a random matrix drawn from a seed.

    The matrix is a non-trainable float32 weight (saved with the model, so a
    reloaded layer computes the same outputs), drawn at build time from
    `seed`. With `redraw=N` it is drawn again every `N` training calls
    (`training=True`), the `k`-th redraw from the seed stream
    `(seed, k)`: a run is reproducible from its seed and the saved step
    counter (float32, exact for 16.7M steps). `redraw=None` never redraws.
    """

    def _init_draws(self, seed, redraw):
        if seed is None:
            seed = random.randrange(2**31)  # chosen once, then part of the config
        if not is_integer(seed) or seed < 0:
            raise ValueError(f"`seed` must be a non-negative integer or None. Received: seed={seed!r}")
        seed = int(seed)
        if redraw is not None:
            redraw = check_positive_int("redraw", redraw)
        self.seed = seed
        self.redraw = redraw

    def _build_draws(self, name, shape, draw):
        """Creates the weight `name` of `shape` as `draw(seed)`; `draw` takes an int or a SeedGenerator."""
        self._draw = draw
        variable = self.add_weight(
            name=name,
            shape=shape,
            initializer=lambda shape, dtype=None: draw(self.seed),
            trainable=False,
            autocast=False,
            dtype="float32",
        )
        self._drawn = variable
        if self.redraw is not None:
            self.steps = self.add_weight(
                name="steps", shape=(), initializer="zeros", trainable=False, autocast=False, dtype="float32"
            )
            self._seed_stream = keras.random.SeedGenerator(self.seed, name="redraw_seed")
        return variable

    def _current_draw(self, training=None):
        """The matrix, after counting one training call and redrawing when it is due."""
        if self.redraw is None or not training:
            return self._drawn.value
        steps = self.steps.value + 1.0
        self.steps.assign(steps)
        redraws = ops.floor_divide(steps, float(self.redraw))
        state = self._seed_stream.state
        state.assign(ops.stack([ops.cast(self.seed, state.dtype), ops.cast(redraws, state.dtype)]))
        due = ops.equal(ops.mod(steps, float(self.redraw)), 0.0)
        drawn = ops.where(due, self._draw(self._seed_stream), self._drawn.value)
        self._drawn.assign(drawn)
        return drawn
