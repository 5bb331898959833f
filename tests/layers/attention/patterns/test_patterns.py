"""Each pattern against its definition written as a NumPy boolean mask, position by position."""

import math

import keras
import numpy as np
import pytest

from keras_tfam.layers.attention.patterns import (
    BigBird,
    Blockwise,
    DilatedWindow,
    Fixed,
    GlobalTokens,
    HeadPatterns,
    SlidingWindow,
    Strided,
    UnionPattern,
    get_pattern,
    interleave,
)


def definition(rule, length):
    """`(length, length)` bool from `rule(i, j)` evaluated pair by pair."""
    return np.array([[bool(rule(i, j)) for j in range(length)] for i in range(length)])


def mask(pattern, length):
    positions = np.arange(length, dtype="int32")
    return np.asarray(keras.ops.convert_to_numpy(pattern.mask(positions, positions)))


def strided_subsets(stride):
    # Child et al. 2019, section 4.2, causal (l = stride): A(1)_i = {t, ..., i}, t = max(0, i - l);
    # A(2)_i = {j : (i - j) mod l = 0}.
    a1 = lambda i, j: max(0, i - stride) <= j <= i  # noqa: E731
    a2 = lambda i, j: j <= i and (i - j) % stride == 0  # noqa: E731
    return a1, a2


def fixed_subsets(stride, c):
    # A(1)_i = {j : floor(j / l) = floor(i / l)}; A(2)_i = {j : j mod l in {l - c, ..., l - 1}} (causal: j <= i),
    # l = stride.
    a1 = lambda i, j: j <= i and j // stride == i // stride  # noqa: E731
    a2 = lambda i, j: j <= i and j % stride >= stride - c  # noqa: E731
    return a1, a2


CASES = {
    "sliding_window": (SlidingWindow(3), lambda i, j: abs(i - j) < 3),
    "dilated_window": (DilatedWindow(3, dilation=2), lambda i, j: abs(i - j) in (0, 2, 4)),
    "strided_local": (Strided(4, subset=1), lambda i, j: abs(i - j) <= 4),
    "strided_columns": (Strided(4, subset=2), lambda i, j: (i - j) % 4 == 0),
    "fixed_block": (Fixed(4, summary=2, subset=1), lambda i, j: i // 4 == j // 4),
    "fixed_summaries": (Fixed(4, summary=2, subset=2), lambda i, j: j % 4 in (2, 3)),
    "blockwise": (Blockwise(3, [2, 0, 1]), lambda i, j: j // 3 == (i // 3) // 3 * 3 + [2, 0, 1][(i // 3) % 3]),
    "global_tokens": (GlobalTokens(2), lambda i, j: i < 2 or j < 2),
    "longformer": (UnionPattern([SlidingWindow(2), GlobalTokens(1)]), lambda i, j: abs(i - j) < 2 or i < 1 or j < 1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pattern_equals_its_definition(name):
    pattern, rule = CASES[name]
    np.testing.assert_array_equal(mask(pattern, 18), definition(rule, 18))


@pytest.mark.parametrize("name", list(CASES))
def test_lookback_and_lookahead_bound_the_pattern(name):
    # What ring caches and banded compute rely on: no allowed key is farther.
    pattern, rule = CASES[name]
    allowed = definition(rule, 18)
    i, j = np.nonzero(allowed)
    if pattern.lookback is not None:
        assert np.all((i - j)[i >= j] < pattern.lookback)
        assert np.any((i - j)[i >= j] == pattern.lookback - 1)  # tight
    if pattern.lookahead is not None:
        assert np.all((j - i)[j >= i] <= pattern.lookahead)


def test_strided_and_fixed_match_the_papers_causal_sets():
    causal = np.tril(np.ones((20, 20), bool))
    for pattern, subsets in ((Strided(4), strided_subsets(4)), (Fixed(4, summary=2), fixed_subsets(4, 2))):
        a1, a2 = subsets
        np.testing.assert_array_equal(mask(pattern, 20) & causal, definition(lambda i, j: a1(i, j) or a2(i, j), 20))


@pytest.mark.parametrize("kind", ["strided", "fixed"])
@pytest.mark.parametrize("n", [64, 256, 1024])
def test_sparse_transformer_two_hops_with_sqrt_n_keys(kind, n):
    """Child et al.: every causal pair connected in at most two hops, O(sqrt(n)) keys per query."""
    stride = int(math.isqrt(n))
    pattern = Strided(stride) if kind == "strided" else Fixed(stride, summary=1)
    causal = np.tril(np.ones((n, n), bool))
    attend = (mask(pattern, n) & causal).astype(np.float32)
    two_hops = (attend + attend @ attend) > 0
    np.testing.assert_array_equal(two_hops, causal)
    assert attend.sum(axis=1).max() <= 2 * math.sqrt(n) + 1


def test_strided_subsets_in_successive_layers_connect_in_two_hops():
    # The factorised form: layer 1 attends with A(1), layer 2 with A(2); j reaches i through some a.
    n, stride = 64, 8
    causal = np.tril(np.ones((n, n), bool))
    layers = interleave([Strided(stride, subset=1), Strided(stride, subset=2)], 2)
    first, second = ((mask(p, n) & causal).astype(np.float32) for p in layers)
    np.testing.assert_array_equal((second @ first) > 0, causal)
    assert not np.array_equal(first > 0, causal) and not np.array_equal(second > 0, causal)


def test_head_patterns_stack_one_mask_per_group():
    pattern = HeadPatterns([SlidingWindow(2), Strided(3, subset=2)])
    stacked = mask(pattern, 10)
    assert stacked.shape == (2, 10, 10)
    np.testing.assert_array_equal(stacked[0], definition(lambda i, j: abs(i - j) < 2, 10))
    np.testing.assert_array_equal(stacked[1], definition(lambda i, j: (i - j) % 3 == 0, 10))
    assert pattern.lookback is None and HeadPatterns([SlidingWindow(2), SlidingWindow(5)]).lookback == 5


def test_big_bird_equals_global_window_and_its_random_blocks():
    pattern = BigBird(block_size=2, num_random_blocks=2, num_window_blocks=3, num_global_blocks=1, seed=7)
    blocks = 12
    random = pattern.random_blocks(blocks)

    def rule(i, j):
        q, k = i // 2, j // 2
        return q < 1 or k < 1 or abs(q - k) <= 1 or k in random[q]

    np.testing.assert_array_equal(mask(pattern, 2 * blocks), definition(rule, 2 * blocks))


def test_big_bird_random_blocks_are_seeded_distinct_and_outside_window_and_globals():
    pattern = BigBird(block_size=4, num_random_blocks=3, num_global_blocks=2, seed=1)
    random = pattern.random_blocks(16)
    assert all(len(keys) == 0 for keys in random[:2])
    for query, keys in enumerate(random[2:], start=2):
        assert len(set(keys)) == 3
        assert all(k >= 2 and abs(k - query) > 1 for k in keys)
    # Reproducible, the same at every call, and a function of the seed.
    np.testing.assert_array_equal(np.concatenate(BigBird(4, 3, seed=1).random_blocks(16)), np.concatenate(random))
    assert not np.array_equal(np.concatenate(BigBird(4, 3, seed=2).random_blocks(16)), np.concatenate(random))
    np.testing.assert_array_equal(mask(pattern, 64), mask(pattern, 64))


def test_causal_big_bird_draws_earlier_blocks_whatever_the_length():
    pattern = BigBird(block_size=2, num_random_blocks=2, num_global_blocks=1, seed=3, causal=True)
    short, long = pattern.random_blocks(10), pattern.random_blocks(40)
    for query in range(10):
        np.testing.assert_array_equal(short[query], long[query])
        assert all(k < query - 1 for k in short[query])
    # So the mask over a longer cache agrees with the shorter sequence's.
    np.testing.assert_array_equal(mask(pattern, 80)[:20, :20], mask(pattern, 20))


def test_config_round_trip_and_get_pattern():
    for pattern, _ in CASES.values():
        config = keras.saving.serialize_keras_object(pattern)
        assert get_pattern(config) == pattern
    big_bird = BigBird(4, seed=5, causal=True)
    assert get_pattern(keras.saving.serialize_keras_object(big_bird)) == big_bird
    assert get_pattern({"name": "sliding_window", "window": 8}) == SlidingWindow(8)
    assert get_pattern({"name": "union", "patterns": [{"name": "global_tokens", "num_tokens": 1}]}) == UnionPattern(
        [GlobalTokens(1)]
    )
    assert get_pattern(None) is None


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: SlidingWindow(0), "Received: window=0"),
        (lambda: SlidingWindow(-3), "Received: window=-3"),
        (lambda: DilatedWindow(4, dilation=0), "Received: dilation=0"),
        (lambda: Strided(0), "Received: stride=0"),
        (lambda: Strided(4, subset=3), "Received: subset=3"),
        (lambda: Fixed(4, summary=5), "Received: summary=5"),
        (lambda: Blockwise(4, [0, 2]), r"Received: permutation=\[0, 2\]"),
        (lambda: BigBird(4, num_window_blocks=2), "Received: num_window_blocks=2"),
        (lambda: BigBird(4, seed=-1), "Received: seed=-1"),
        (lambda: UnionPattern([]), r"Received: patterns=\[\]"),
        (lambda: HeadPatterns([HeadPatterns([SlidingWindow(2), SlidingWindow(3)])]), "apply to all heads alike"),
        (lambda: get_pattern("diagonal"), "Received: pattern='diagonal'"),
        (lambda: get_pattern({"name": "strided"}), "Bad arguments for the 'strided' pattern"),
        (lambda: get_pattern({"name": "sliding_window", "window": 4, "stride": 2}), "unexpected keyword"),
        (lambda: get_pattern(3), "Received: pattern=3"),
    ],
)
def test_bad_arguments(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize("pattern", [Blockwise(4, [1, 0]), BigBird(4)], ids=["blockwise", "big_bird"])
def test_block_size_must_divide_the_length(pattern):
    pattern.check_length(16)
    divide = "`block_size`=4 must divide the sequence length. Received: sequence length 10"
    with pytest.raises(ValueError, match=divide):
        pattern.check_length(10)


def test_blockwise_refuses_a_partial_cycle_of_its_permutation():
    # 3 blocks of 4 under a permutation of 2: block 2 would see block 3, past the end, and attend nothing.
    pattern = Blockwise(4, [1, 0])
    rows_with_keys = mask(pattern, 12).any(axis=-1)
    assert not rows_with_keys.all()  # what a length of 12 would give: silent empty rows
    with pytest.raises(ValueError) as error:
        pattern.check_length(12)
    message = str(error.value)
    assert "\n" not in message and message.endswith("Received: sequence length 12")
    assert "repeats every 8 positions" in message
    for length in (8, 16, 24):  # whole cycles: every query has its block of keys
        pattern.check_length(length)
        assert mask(pattern, length).sum(axis=-1).min() == 4


@pytest.mark.parametrize(
    "build, config",
    [
        (lambda: SlidingWindow(np.int64(4)), {"window": 4}),
        (lambda: DilatedWindow(np.int32(3), dilation=np.int16(2)), {"window": 3, "dilation": 2}),
        (lambda: Strided(np.int64(4), subset=np.int64(1)), {"stride": 4, "subset": 1}),
        (lambda: Fixed(np.uint8(4), summary=np.int64(2)), {"stride": 4, "summary": 2, "subset": None}),
        (lambda: GlobalTokens(np.int64(1)), {"num_tokens": 1}),
        (lambda: Blockwise(np.int64(4), np.array([1, 0])), {"block_size": 4, "permutation": [1, 0]}),
        (lambda: Blockwise(4, [np.int64(1), np.int64(0)]), {"block_size": 4, "permutation": [1, 0]}),
        (
            lambda: BigBird(np.int64(4), np.int64(2), np.int64(3), np.int64(1), seed=np.int64(5)),
            {
                "block_size": 4,
                "num_random_blocks": 2,
                "num_window_blocks": 3,
                "num_global_blocks": 1,
                "seed": 5,
                "causal": False,
            },
        ),
    ],
)
def test_numpy_integers_are_accepted_as_python_ints(build, config):
    pattern = build()
    assert pattern.get_config() == config
    numbers = [value for value in pattern.get_config().values() if isinstance(value, (int, np.integer))]
    assert all(type(value) in (int, bool) for value in numbers)  # no NumPy scalars in the config


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: SlidingWindow(2.5), "Received: window=2.5"),
        (lambda: SlidingWindow(np.float32(3)), r"Received: window=np.float32\(3.0\)"),
        (lambda: SlidingWindow(True), "Received: window=True"),
        (lambda: SlidingWindow(np.int64(0)), r"Received: window=np.int64\(0\)"),
        (lambda: DilatedWindow(3.0), "Received: window=3.0"),
        (lambda: Strided(4, subset=True), "Received: subset=True"),
        (lambda: Strided(4, subset=1.0), "Received: subset=1.0"),
        (lambda: Blockwise(4.0), "Received: block_size=4.0"),
        (lambda: Blockwise(4, [1.0, 0.0]), r"Received: permutation=\[1.0, 0.0\]"),
        (lambda: Blockwise(4, []), r"Received: permutation=\[\]"),
        (lambda: Blockwise(4, 2), "Received: permutation=2"),
        (lambda: BigBird(4, num_random_blocks=1.5), "Received: num_random_blocks=1.5"),
        (lambda: BigBird(4, num_global_blocks=np.int64(-1)), r"Received: num_global_blocks=np.int64\(-1\)"),
        (lambda: BigBird(4, seed=np.nan), "Received: seed=nan"),
    ],
)
def test_non_integers_and_non_positive_sizes_are_refused_in_one_line(build, match):
    with pytest.raises(ValueError, match=match) as error:
        build()
    assert "\n" not in str(error.value)
