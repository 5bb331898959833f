"""The evaluation's progress line: tokens done, tokens per second and time left, on a terminal only."""

import io

from pipelines.evaluation import Progress, show_progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_rate_and_time_left_and_redraws_in_place():
    clock, stream = Clock(), io.StringIO()
    progress = Progress(10_000, stream=stream, interval=0.5, clock=clock)
    clock.now += 2.0
    progress.update(2_000)  # 1,000 tokens/s: 8 s left
    clock.now += 0.1
    progress.update(2_100)  # too soon after the last redraw: not shown
    clock.now += 2.0
    progress.update(4_000)
    clock.now += 6.0
    progress.close(10_000)
    frames = stream.getvalue().split("\r")[1:]
    assert [frame.rstrip() for frame in frames] == [
        "eval: 2,000/10,000 tokens (20%), 1,000 tokens/s, ETA 0:08",
        "eval: 4,000/10,000 tokens (40%), 976 tokens/s, ETA 0:06",
        "eval: 10,000 tokens in 0:10, 990 tokens/s",
    ]
    assert stream.getvalue().endswith("\n") and stream.getvalue().count("\n") == 1  # one line, kept at the end


def test_progress_only_on_a_terminal_and_not_quiet():
    assert show_progress(stream=Terminal())
    assert not show_progress(quiet=True, stream=Terminal())
    assert not show_progress(stream=io.StringIO())  # a pipe or a file: nothing


def test_padding_with_an_infinite_loss_is_left_out():
    # kNN-LM with interpolation 1 gives probability 0 to tokens no neighbour holds: an infinite NLL on
    # a padded position, times its weight 0, made the whole loss NaN.
    import math

    import numpy as np
    import tensorflow as tf

    from pipelines.evaluation import evaluate_perplexity

    def model(inputs, training=False):  # p = (1/2, 1/2, 0) everywhere
        return tf.broadcast_to(tf.constant([0.0, 0.0, -np.inf]), tf.concat([tf.shape(inputs), [3]], 0))

    inputs = np.zeros((2, 4), "int32")
    targets = np.array([[0, 1, 1, 0], [1, 0, 2, 2]], "int32")  # token 2 only where padded
    weights = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], "float32")
    dataset = tf.data.Dataset.from_tensor_slices((inputs, targets, weights)).batch(2)
    result = evaluate_perplexity(model, dataset)
    assert result["tokens"] == 6 and math.isclose(result["loss"], math.log(2), rel_tol=1e-6)
