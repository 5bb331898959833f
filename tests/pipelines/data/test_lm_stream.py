import numpy as np
import pytest
import tensorflow as tf
from shared_data import WIKITEXT2, requires_wikitext

from pipelines.data.lm_stream import lm_dataset, make_blocks, stateful_lm_dataset, tokenize_lines
from pipelines.data.tokenizers import WordTokenizer
from pipelines.data.wikitext import find_split, read_lines


def test_blocks_shift_by_one_and_mask_the_tail():
    tokens = np.arange(1, 11)  # 10 tokens
    x, y, w = make_blocks(tokens, 4, start_id=0)
    np.testing.assert_array_equal(x, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 0]])
    np.testing.assert_array_equal(y, [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 0, 0]])
    np.testing.assert_array_equal(w, [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]])


@requires_wikitext
def test_evaluation_stream_delivers_every_token_once():
    lines = read_lines(find_split(WIKITEXT2, "test"))
    tokenizer = WordTokenizer.train(lines)
    tokens = tokenize_lines(tokenizer, lines)
    delivered = []
    for _, targets, weights in lm_dataset(tokens, 128, 7, tokenizer.eos_id):
        delivered.append(targets.numpy()[weights.numpy() > 0])
    delivered = np.concatenate(delivered)
    assert delivered.size == 245569
    np.testing.assert_array_equal(delivered, tokens)


def test_training_stream_is_deterministic_for_a_seed():
    tokens = np.arange(1000) % 97

    def first_epoch(seed):
        ds = lm_dataset(tokens, 16, 4, 0, shuffle=True, seed=seed, drop_remainder=True)
        return np.concatenate([x.numpy() for x, _, _ in ds])

    np.testing.assert_array_equal(first_epoch(3), first_epoch(3))
    assert not np.array_equal(first_epoch(3), first_epoch(4))
    # Shuffling moves whole blocks: the multiset of blocks is the unshuffled one.
    ordered = np.concatenate([x.numpy() for x, _, _ in lm_dataset(tokens, 16, 4, 0, drop_remainder=True)])
    assert sorted(map(tuple, first_epoch(3))) != [] and first_epoch(3).shape == ordered.shape


def test_auto_sharding_by_data():
    ds = lm_dataset(np.arange(100), 8, 2, 0)
    assert ds.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.DATA


@pytest.mark.parametrize("stream", [lm_dataset, stateful_lm_dataset])
def test_streams_are_not_autotuned(stream):
    # An autotuned iterator's deletion waits for the tuner's next wake (lm_stream._without_autotuning).
    ds = stream(np.arange(100), 8, 2, 0)
    assert ds.options().autotune.enabled is False
    if stream is lm_dataset:  # its own options (sharding: test_auto_sharding_by_data) are kept beside it
        assert ds.options().deterministic is True


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: sequence_length=0"):
        make_blocks(np.arange(10), 0, 0)
    with pytest.raises(ValueError, match="empty"):
        make_blocks(np.zeros(0), 4, 0)
    with pytest.raises(ValueError, match="Received: batch_size=0"):
        lm_dataset(np.arange(10), 4, 0, 0)
