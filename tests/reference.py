"""Independent NumPy references, written from the papers' formulas.

Nothing here imports keras_tfam: these are the few lines of NumPy each test
compares the layers against.
"""

import math

import numpy as np


def softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def attention(q, k, v, mask=None, bias=None):
    """Vaswani et al. eq. 1, per head. q `(B, T, N, H)`, k/v `(B, S, K, H)`.

    Key/value heads are repeated for grouped queries. `mask` `(B, T, S)`
    boolean, or `(B, N, T, S)` per head; a fully masked row yields zeros.
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    groups = q.shape[2] // k.shape[2]
    k = np.repeat(k, groups, axis=2)
    v = np.repeat(v, groups, axis=2)
    scores = np.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        mask = np.asarray(mask, bool)
        mask = np.broadcast_to(mask[:, None] if mask.ndim == 3 else mask, scores.shape)
        scores = np.where(mask, scores, -np.inf)
        row_has_key = mask.any(-1, keepdims=True)
        scores = np.where(row_has_key, scores, 0.0)
        weights = np.where(row_has_key, softmax(scores), 0.0)
    else:
        weights = softmax(scores)
    return np.einsum("bnts,bsnh->btnh", weights, v), weights


def dense(x, kernel, bias=None):
    y = x @ kernel
    return y if bias is None else y + bias


def multi_head_attention(query, value, weights, num_heads, num_kv_heads, mask=None, bias=None):
    """Full MHA from a `MultiHeadAttention`'s weights in build order."""
    wq, bq, wk, bk, wv, bv, wo, bo = weights
    b, t, _ = query.shape
    s = value.shape[1]
    q = dense(query, wq, bq).reshape(b, t, num_heads, -1)
    k = dense(value, wk, bk).reshape(b, s, num_kv_heads, -1)
    v = dense(value, wv, bv).reshape(b, s, num_kv_heads, -1)
    out, _ = attention(q, k, v, mask, bias)
    return dense(out.reshape(b, t, -1), wo, bo)


def layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def rms_norm(x, gain, eps):
    """Zhang & Sennrich 2019: a / RMS(a) * g."""
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * gain


def scale_norm(x, g, eps):
    """Nguyen & Salazar 2019: g * x / max(||x||, eps)."""
    return g * x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


def gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def sinusoidal_table(length, dim, base=10000.0):
    """Vaswani et al. section 3.5, written position by position."""
    table = np.zeros((length, dim))
    for pos in range(length):
        for i in range(dim):
            angle = pos / base ** (2 * (i // 2) / dim)
            table[pos, i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    return table


def rotary(x, positions, base=10000.0):
    """RoFormer eq. 34: each pair (x[2i], x[2i+1]) rotated by pos * base^(-2i/d)."""
    x = np.asarray(x, np.float64)
    out = np.empty_like(x)
    d = x.shape[-1]
    for t, pos in enumerate(positions):
        for i in range(d // 2):
            theta = pos * base ** (-2 * i / d)
            c, s = math.cos(theta), math.sin(theta)
            a, b = x[:, t, :, 2 * i], x[:, t, :, 2 * i + 1]
            out[:, t, :, 2 * i] = c * a - s * b
            out[:, t, :, 2 * i + 1] = s * a + c * b
    return out


def t5_bucket(distance, bidirectional, num_buckets, max_distance):
    """T5's relative_position_bucket for one `query_pos - key_pos` distance."""
    bucket = 0
    n = distance
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            bucket += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return bucket + min(large, num_buckets - 1)


def normal_cdf(x):
    """Phi(x) through Abramowitz & Stegun 7.1.26 (|error of erf| < 1.5e-7), vectorised."""
    z = np.abs(np.asarray(x, np.float64)) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-z * z)
    return 0.5 * (1.0 + np.sign(x) * erf)


def angular_lsh_collision_probability(theta, num_buckets, grid=120, limit=6.0):
    """P[h(x) = h(y)] for unit vectors at angle `theta`, h(x) = argmax([xR; -xR]), R Gaussian `(d, b/2)`.

    Derivation: the columns give `m = b/2` iid pairs `(u_i, w_i) = (x.r_i,
    y.r_i)`, standard bivariate normal with correlation `rho = cos(theta)`.
    By symmetry over the `2m` buckets, `P = 2m P(u_1 > |u_j|, w_1 > |w_j|
    for all j > 1) = 2m E[G(u_1, w_1)^(m-1); u_1 > 0, w_1 > 0]` with
    `G(a, c) = P(|U| < a, |W| < c)`. For `b = 2`: `1 - theta / pi`.
    Integrated on a grid (trapezoids).
    """
    m = num_buckets // 2
    rho = math.cos(theta)
    s = math.sqrt(1.0 - rho**2)
    a = np.linspace(0.0, limit, grid)
    u = np.linspace(-1.0, 1.0, grid)[None, None, :] * a[:, None, None]  # (a, ., u) over [-a, a]
    density = np.exp(-0.5 * u**2) / math.sqrt(2 * math.pi)
    c = a[None, :, None]
    inner = density * (normal_cdf((c - rho * u) / s) - normal_cdf((-c - rho * u) / s))  # (a, c, u)
    g = np.trapezoid(inner, u, axis=-1)  # G(a, c)
    aa, cc = np.meshgrid(a, a, indexing="ij")
    joint = np.exp(-(aa**2 - 2 * rho * aa * cc + cc**2) / (2 * s**2)) / (2 * math.pi * s)
    return 2 * m * np.trapezoid(np.trapezoid(joint * g ** (m - 1), a, axis=1), a)
