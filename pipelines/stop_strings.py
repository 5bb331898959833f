"""Stop strings in the exported `generate_text`, as graph ops on per-row strings.

`stop_strings [B, S]` holds each row's strings (an empty string is none, as TF Serving pads string inputs).
A row's text is cut before the first occurrence of any of its strings (OpenAI's `stop`), and its tokens end
with the one whose text completed it (transformers' `stop_strings`).
"""

import tensorflow as tf


def _escaped(strings):
    """`strings` with RE2's special characters escaped, to match as they are."""
    return tf.strings.regex_replace(strings, r"([\\.^$|?*+()\[\]{}\-])", r"\\\1")


def _alternatives(stop_strings):
    """`(B,)` string: each row's non-empty stop strings as one RE2 alternation (empty if it has none)."""
    escaped = _escaped(stop_strings)
    kept = tf.ragged.boolean_mask(escaped, tf.strings.length(stop_strings) > 0)
    return tf.strings.reduce_join(kept, axis=1, separator="|")


def contains_stop(texts, stop_strings):
    """`(B,)` bool: whether row `b` of `texts` holds one of its `stop_strings`."""
    alternatives = _alternatives(stop_strings)

    def row(inputs):
        text, pattern = inputs
        return tf.logical_and(
            tf.strings.length(pattern) > 0,
            tf.strings.regex_full_match(text, tf.strings.join(["(?s).*(", pattern, ").*"])),
        )

    return tf.map_fn(row, (texts, alternatives), fn_output_signature=tf.bool)


def cut_before_stop(texts, stop_strings):
    """`texts`, each cut before the first occurrence of any of its row's `stop_strings`."""
    alternatives = _alternatives(stop_strings)

    def row(inputs):
        text, pattern = inputs
        cut = tf.strings.regex_replace(text, tf.strings.join(["(?s)(", pattern, ").*"]), "", replace_global=False)
        return tf.where(tf.strings.length(pattern) > 0, cut, text)

    return tf.map_fn(row, (texts, alternatives), fn_output_signature=tf.string)


def completing_count(counts, stop_strings, text_of):
    """`(B,)` int32: for a row whose first `counts` new tokens hold a stop string, the fewest of them whose text
    holds one (the last is the token that completed it); `counts` elsewhere.

    A binary search over prefixes: a prefix's text holding a stop string, every longer one does.
    `text_of(counts)` is the `(B,)` text of each row's first `counts` new tokens.
    """

    def holds(count):
        return contains_stop(text_of(count), stop_strings)

    found = holds(counts)
    low, high = tf.zeros_like(counts), counts

    def narrowing(low, high):
        return tf.reduce_any(tf.logical_and(found, high - low > 1))

    def halve(low, high):
        middle = (low + high) // 2
        held = holds(middle)
        return tf.where(held, low, middle), tf.where(held, middle, high)

    low, high = tf.while_loop(narrowing, halve, (low, high))
    return tf.where(found, high, counts)
