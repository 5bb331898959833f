import numpy as np
import pytest

from pipelines.data.lm_stream import stateful_blocks, stateful_lm_dataset


def _batches(dataset):
    return [tuple(t.numpy() for t in batch) for batch in dataset]


@pytest.mark.parametrize("count, length, batch", [(23, 3, 2), (100, 8, 4), (7, 8, 3)])
def test_rows_continue_across_batches_and_every_token_is_a_target_once(count, length, batch):
    tokens = np.arange(1, count + 1)
    batches = _batches(stateful_lm_dataset(tokens, length, batch, start_id=0))
    inputs, targets, weights = (np.stack(parts) for parts in zip(*batches))  # [steps, B, L]
    # Row b of batch n + 1 continues row b of batch n: read per row, the text is contiguous.
    rows_in = inputs.transpose(1, 0, 2).reshape(batch, -1)
    rows_out = targets.transpose(1, 0, 2).reshape(batch, -1)
    np.testing.assert_array_equal(rows_in[:, 1:], rows_out[:, :-1])
    # Every token is a target exactly once, in order (rows one after the other).
    kept = rows_out[weights.transpose(1, 0, 2).reshape(batch, -1) > 0]
    np.testing.assert_array_equal(kept, tokens)
    assert rows_in[0, 0] == 0  # the stream is read as preceded by the start token


def test_skipping_resumes_at_the_same_text():
    tokens = np.arange(1, 200)
    stream = stateful_lm_dataset(tokens, 5, 3, 0, repeat=True)
    uninterrupted = _batches(stream.take(20))
    resumed = _batches(stream.skip(7).take(13))
    for a, b in zip(uninterrupted[7:], resumed):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    # One pass is 14 batches; the stream then starts over.
    np.testing.assert_array_equal(uninterrupted[14][0], uninterrupted[0][0])


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: batch_size=0"):
        stateful_blocks(np.arange(10), 4, 0, 0)
    with pytest.raises(ValueError, match="Received: sequence_length=0"):
        stateful_blocks(np.arange(10), 0, 2, 0)
