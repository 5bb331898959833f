"""Rotary frequencies with the context-extension rules of published checkpoints.

Each rule turns the rotary base `theta` and a head size into the inverse
frequencies `f_i` (pair `i` of a token at position `m` turns by `m * f_i`)
and a factor multiplying cos and sin:

- none: `f_i = theta ** (-2i / d)` (Su et al. 2021);
- `"linear"`: `f_i / factor` (position interpolation, Chen et al. 2023);
- `"dynamic"`: dynamic NTK scaling. Once the sequence holds `L` positions,
  more than the `original_max_position_embeddings` `L0` the model was
  trained on, the base becomes `theta * (factor * L / L0 - (factor - 1)) **
  (d / (d - 2))`; it depends on the length, so it is computed in the graph
  (`dynamic_inverse_frequencies`);
- `"llama3"`: Llama 3.1's rule: wavelengths longer than
  `L0 / low_freq_factor` are divided by `factor`, those shorter than
  `L0 / high_freq_factor` kept, the band between interpolated smoothly;
- `"yarn"`: YaRN (Peng et al. 2023): per-frequency blend of interpolation
  and extrapolation over the ramp `beta_fast..beta_slow` rotations, and cos
  and sin scaled by `0.1 * ln(factor) + 1` (or the `mscale` ratio).

The arguments are those of a Hugging Face config's `rope_scaling` (or
`rope_parameters`), so a checkpoint's dict is accepted as it is.
"""

import math

import numpy as np

ROPE_SCALINGS = ("linear", "dynamic", "llama3", "yarn")
_REQUIRED = {
    "linear": ("factor",),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}
_OPTIONAL = {
    "linear": (),
    "dynamic": (),
    "llama3": (),
    "yarn": ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate"),
}


def check_rope_scaling(scaling):
    """`scaling` as a plain dict with a `"type"`, or `None`; a `ValueError` naming what is wrong."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise ValueError(f"`scaling` must be a dict with a 'type' in {ROPE_SCALINGS}, or None. Received: {scaling!r}")
    scaling = dict(scaling)
    kind = scaling.get("type")
    if kind not in ROPE_SCALINGS:
        raise ValueError(f"Unsupported rope scaling: supported types are {ROPE_SCALINGS}. Received: type={kind!r}")
    missing = [key for key in _REQUIRED[kind] if scaling.get(key) is None]
    if missing:
        raise ValueError(f"{kind!r} rope scaling needs {missing}. Received: scaling={scaling!r}")
    unknown = sorted(set(scaling) - {"type", *_REQUIRED[kind], *_OPTIONAL[kind]})
    if unknown:
        raise ValueError(
            f"{kind!r} rope scaling takes {(*_REQUIRED[kind], *_OPTIONAL[kind])}; unknown key(s) {unknown}. "
            f"Received: scaling={scaling!r}"
        )
    factor = scaling["factor"]
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
        raise ValueError(f"The rope scaling `factor` must be a positive number. Received: factor={factor!r}")
    return scaling


def base_inverse_frequencies(theta, dim):
    """`theta ** (-2i / dim)` for `i < dim / 2`, float64."""
    return 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def inverse_frequencies(theta, dim, scaling=None):
    """`(f, attention_factor)`: the float64 inverse frequencies `(dim / 2,)` and the factor on cos and sin.

    For `"dynamic"` these are the frequencies within the original context
    (where the rule leaves them unchanged); `dynamic_inverse_frequencies`
    gives them for longer sequences.
    """
    frequencies = base_inverse_frequencies(theta, dim)
    kind = None if scaling is None else scaling["type"]
    if kind is None or kind == "dynamic":
        return frequencies, 1.0
    factor = float(scaling["factor"])
    if kind == "linear":
        return frequencies / factor, 1.0
    if kind == "llama3":
        return _llama3(frequencies, factor, scaling), 1.0
    return _yarn(theta, dim, factor, scaling)


def _llama3(frequencies, factor, scaling):
    context = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelengths = 2 * math.pi / frequencies
    scaled = np.where(wavelengths > context / low, frequencies / factor, frequencies)
    smooth = (context / wavelengths - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelengths >= context / high) & (wavelengths <= context / low)
    return np.where(medium, smoothed, scaled)


def _yarn(theta, dim, factor, scaling):
    context = scaling["original_max_position_embeddings"]

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations):  # the pair whose wavelength turns `rotations` times over the context
        return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation = base_inverse_frequencies(theta, dim)
    extrapolated_share = 1.0 - ramp
    frequencies = extrapolation / factor * (1 - extrapolated_share) + extrapolation * extrapolated_share
    return frequencies, float(attention_factor)


def dynamic_base(theta, dim, scaling, length, ops):
    """Dynamic NTK's base for a sequence of `length` positions (a scalar tensor), in the graph."""
    factor = float(scaling["factor"])
    context = float(scaling["original_max_position_embeddings"])
    length = ops.maximum(ops.cast(length, "float32"), context)
    return theta * ops.power(factor * length / context - (factor - 1.0), dim / (dim - 2.0))


def dynamic_inverse_frequencies(theta, dim, scaling, length, ops):
    """Dynamic NTK's inverse frequencies `(dim / 2,)` float32 for `length` positions."""
    exponents = ops.cast(ops.arange(0, dim, 2), "float32") / dim
    return 1.0 / ops.power(dynamic_base(theta, dim, scaling, length, ops), exponents)
