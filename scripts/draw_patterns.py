"""Draws each attention pattern's mask as a small PNG (pure NumPy + zlib) for the README.

    python scripts/draw_patterns.py [--out docs/patterns] [--length 36]

Row = query position, column = key position; a dark cell may attend. The
masks come from the patterns themselves (`AttentionPattern.mask`), intersected
with the causal mask where the pattern is used causally (Sparse Transformer,
GPT-Neo / GPT-3 local layers).
"""

import argparse
import os
import struct
import zlib

os.environ.setdefault("KERAS_BACKEND", "numpy")

import numpy as np  # noqa: E402

from keras_tfam.layers.attention.patterns import (  # noqa: E402
    BigBird,
    Blockwise,
    DilatedWindow,
    Fixed,
    GlobalTokens,
    HeadPatterns,
    SlidingWindow,
    Strided,
    UnionPattern,
)

# name: (pattern, causal, caption)
PATTERNS = {
    "sliding_window": (SlidingWindow(6), True, "SlidingWindow(6), causal"),
    "dilated_window": (DilatedWindow(4, dilation=3), False, "DilatedWindow(4, dilation=3)"),
    "strided": (Strided(6), True, "Strided(6), causal (A1 + A2 merged)"),
    "fixed": (Fixed(6, summary=2), True, "Fixed(6, summary=2), causal (A1 + A2 merged)"),
    "blockwise": (Blockwise(6, [1, 0, 2]), False, "Blockwise(6, [1, 0, 2])"),
    "longformer": (UnionPattern([SlidingWindow(4), GlobalTokens(2)]), False, "SlidingWindow(4) + GlobalTokens(2)"),
    "big_bird": (BigBird(4, num_random_blocks=1, num_global_blocks=1, seed=0), False, "BigBird(4, 1 random, 1 global)"),
    "per_head": (
        HeadPatterns([Strided(6, subset=1), Strided(6, subset=2)]),
        True,
        "HeadPatterns([Strided(6, 1), Strided(6, 2)]): head groups side by side",
    ),
}
ATTENDED, EMPTY, GRID = (31, 78, 140), (245, 245, 245), (205, 205, 205)


def write_png(path, rgb):
    """Writes an `(H, W, 3)` uint8 image as an 8-bit RGB PNG."""
    height, width, _ = rgb.shape

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + row.tobytes() for row in np.ascontiguousarray(rgb, np.uint8))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9)))
        f.write(chunk(b"IEND", b""))


def picture(mask, cell=6):
    """A bool `(T, S)` mask as cells of `cell` pixels with 1-pixel grid lines."""
    rows, columns = mask.shape
    image = np.empty((rows * cell + 1, columns * cell + 1, 3), np.uint8)
    image[:] = GRID
    for i in range(rows):
        for j in range(columns):
            image[i * cell + 1 : (i + 1) * cell, j * cell + 1 : (j + 1) * cell] = ATTENDED if mask[i, j] else EMPTY
    return image


def pattern_mask(pattern, causal, length):
    positions = np.arange(length, dtype="int32")
    mask = np.asarray(pattern.mask(positions, positions))
    if causal:
        mask = mask & np.tril(np.ones((length, length), bool))
    return mask


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "patterns"))
    parser.add_argument("--length", type=int, default=36)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name, (pattern, causal, caption) in PATTERNS.items():
        mask = pattern_mask(pattern, causal, args.length)
        if mask.ndim == 3:  # one panel per head group, side by side
            gap = np.full((mask.shape[1] * 6 + 1, 6, 3), 255, np.uint8)
            panels = [picture(group) for group in mask]
            image = np.concatenate([part for panel in panels for part in (panel, gap)][:-1], axis=1)
        else:
            image = picture(mask)
        path = os.path.join(args.out, f"{name}.png")
        write_png(path, image)
        print(f"{path}: {caption}")


if __name__ == "__main__":
    main()
