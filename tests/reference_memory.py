"""NumPy references for relative positions, memory and gating, written from the papers.

Nothing here imports keras_tfam. Loops follow the papers' indices (`i` a
query, `j` a key) rather than speed.
"""

import math

import numpy as np
from reference import softmax


def shaw_attention(q, k, v, key_table, value_table, max_distance, mask=None, query_offset=0, key_offset=0):
    """Shaw et al. 2018, eqs. 3-5, per head: q `(B, T, N, H)`, k/v `(B, S, N, H)`, tables `(2k+1, H)`.

    `e_ij = q_i . (k_j + a^K_ij) / sqrt(d)`, `z_i = sum_j alpha_ij (v_j + a^V_ij)`,
    `a_ij = w_clip(j - i, k)`. `mask` `(B, T, S)` boolean.
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    batch, length, heads, dim = q.shape
    keys = k.shape[1]
    out = np.zeros((batch, length, heads, v.shape[-1]))
    for b in range(batch):
        for n in range(heads):
            for i in range(length):
                scores = np.empty(keys)
                clipped = []
                for j in range(keys):
                    r = min(max((j + key_offset) - (i + query_offset), -max_distance), max_distance) + max_distance
                    clipped.append(r)
                    scores[j] = q[b, i, n] @ (k[b, j, n] + key_table[r]) / math.sqrt(dim)
                allowed = np.ones(keys, bool) if mask is None else mask[b, i]
                if not allowed.any():
                    continue
                alpha = softmax(np.where(allowed, scores, -np.inf))
                out[b, i, n] = sum(alpha[j] * (v[b, j, n] + value_table[clipped[j]]) for j in range(keys))
    return out


def sinusoid(distance, dim, base=10000.0):
    """Transformer-XL's `R_d` (Vaswani et al.'s table at position `d`, sines then cosines, as Dai et al.'s code)."""
    inverse = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    angles = distance * inverse
    return np.concatenate([np.sin(angles), np.cos(angles)])


def transformer_xl_scores(q, k, u, v, w_r, query_positions, key_positions):
    """Dai et al. 2019, section 3.3: `A_ij = q_i.k_j + q_i.W_R R_{i-j} + u.k_j + v.W_R R_{i-j}` per head.

    q `(B, T, N, H)`, k `(B, S, N, H)`, u/v `(N, H)`, `w_r` `(D_R, N * H)`:
    `W_{k,R} R` for head `n` is `(R @ w_r)[n * H:(n + 1) * H]`. Returns
    the four terms, each `(B, N, T, S)`, unscaled.
    """
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    batch, length, heads, dim = q.shape
    keys = k.shape[1]
    terms = np.zeros((4, batch, heads, length, keys))
    for i in range(length):
        for j in range(keys):
            r = (sinusoid(query_positions[i] - key_positions[j], w_r.shape[0]) @ w_r).reshape(heads, dim)
            for b in range(batch):
                for n in range(heads):
                    terms[0, b, n, i, j] = q[b, i, n] @ k[b, j, n]
                    terms[1, b, n, i, j] = q[b, i, n] @ r[n]
                    terms[2, b, n, i, j] = u[n] @ k[b, j, n]
                    terms[3, b, n, i, j] = v[n] @ r[n]
    return terms


def span_mask(distance, span, ramp):
    """Sukhbaatar et al. 2019, eq. 3: `m_z(x) = min(max((R + z - x) / R, 0), 1)`."""
    return np.clip((ramp + span - np.asarray(distance, np.float64)) / ramp, 0.0, 1.0)


def gru_gate(x, y, w_r, u_r, w_z, u_z, w_g, u_g, gate_bias):
    """Parisotto et al. 2020, GTrXL's GRU-type gate g(x, y) (section 3.2)."""
    sigmoid = lambda a: 1.0 / (1.0 + np.exp(-a))  # noqa: E731
    r = sigmoid(y @ w_r + x @ u_r)
    z = sigmoid(y @ w_z + x @ u_z - gate_bias)
    h = np.tanh(y @ w_g + (r * x) @ u_g)
    return (1.0 - z) * x + z * h


def compressive_memory(states, memory_length, compressed_length, rate, compress):
    """Rae et al. 2020 (algorithm 1) after a whole stream `states (L, D)`, however it was cut into segments.

    The memory held `M` empty slots, then the states in order: it keeps the
    last `M`; every slot before them left it (the empty ones first), and
    each `c` consecutive slots that left, counted from the first, make one
    compressed slot, of which the last `Cm` are kept. Returns
    `(compressed (Cm, D), compressed_valid (Cm,), memory (M, D), memory_valid (M,))`;
    an empty slot is zeros, and a compressed slot is valid when one of its
    states was.
    """
    width = states.shape[1]
    slots = np.concatenate([np.zeros((memory_length, width)), states])
    valid = np.concatenate([np.zeros(memory_length, bool), np.ones(len(states), bool)])
    left, left_valid = slots[:-memory_length], valid[:-memory_length]
    groups = len(left) // rate
    compressed = [compress(left[g * rate : (g + 1) * rate]) for g in range(groups)]
    compressed_valid = [left_valid[g * rate : (g + 1) * rate].any() for g in range(groups)]
    pad = max(0, compressed_length - groups)
    compressed = np.concatenate([np.zeros((pad, width)), np.array(compressed).reshape(-1, width)])[-compressed_length:]
    compressed_valid = np.concatenate([np.zeros(pad, bool), np.array(compressed_valid, bool)])[-compressed_length:]
    return compressed, compressed_valid, slots[-memory_length:], valid[-memory_length:]
