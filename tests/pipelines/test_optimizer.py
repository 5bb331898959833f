"""GlobalClipAdamW: the gradient summed over replicas is what is clipped, against Keras' AdamW formula in NumPy.

The replica cases run in a subprocess, which splits the CPU into two logical devices before TensorFlow starts.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from pipeline_runs import REPO

from pipelines.optimizer import GlobalClipAdamW

CLIP, LEARNING_RATE, EPSILON = 1.0, 0.1, 1.0
# Each replica's gradient is under the clip norm, their sum over it: clipping each one changes nothing. A
# vector's gradient, and one row of a `(3, 2)` table's (an `IndexedSlices`, as a gather's gradient is).
REPLICA_GRADIENTS = [[0.6, 0.0, 0.3, 0.0], [0.5, 0.4, 0.0, 0.2]]
REPLICA_ROWS = [(0, [0.2, 0.1]), (2, [0.3, 0.0])]

SCRIPT = r"""
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from pipelines.optimizer import GlobalClipAdamW

clip, learning_rate, epsilon, per_replica, rows = json.loads(sys.argv[1])
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def run(make):
    with strategy.scope():
        variables = [keras.Variable(tf.ones(4)), keras.Variable(tf.ones((3, 2)))]
        optimizer = make()
        optimizer.build(variables)

    @tf.function
    def step():
        def replica_step():
            index = tf.distribute.get_replica_context().replica_id_in_sync_group
            row = tf.IndexedSlices(tf.gather(tf.constant([values for _, values in rows]), index)[None],
                                   tf.gather(tf.constant([row for row, _ in rows]), index)[None], tf.constant([3, 2]))
            optimizer.apply([tf.gather(tf.constant(per_replica), index), row], variables)

        strategy.run(replica_step)

    step()
    return [strategy.experimental_local_results(v.value)[0].numpy().ravel().tolist() for v in variables]


adamw = dict(learning_rate=learning_rate, epsilon=epsilon, weight_decay=0.0)
print(json.dumps({
    "ours": run(lambda: GlobalClipAdamW(clip_global_norm=clip, **adamw)),
    "ours_unclipped": run(lambda: GlobalClipAdamW(**adamw)),
    "keras": run(lambda: keras.optimizers.AdamW(global_clipnorm=clip, **adamw)),
}))
"""


def adam_step(variable, grad, learning_rate=LEARNING_RATE, epsilon=EPSILON, beta_1=0.9, beta_2=0.999):
    """One first step of Keras' Adam, in NumPy (epsilon outside the bias correction, as Keras has it)."""
    m, v = (1 - beta_1) * grad, (1 - beta_2) * grad**2
    alpha = learning_rate * np.sqrt(1 - beta_2) / (1 - beta_1)
    return variable - alpha * m / (np.sqrt(v) + epsilon)


def clipped(grad, norm=CLIP):
    return grad * min(1.0, norm / np.linalg.norm(grad))


@pytest.fixture(scope="module")
def two_replicas():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    arguments = json.dumps([CLIP, LEARNING_RATE, EPSILON, REPLICA_GRADIENTS, REPLICA_ROWS])
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, arguments], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return {name: np.concatenate(values) for name, values in json.loads(result.stdout.splitlines()[-1]).items()}


def replica_gradients():
    """Each replica's gradient as one dense vector: the vector's, then the table's rows."""
    gradients = []
    for vector, (row, values) in zip(REPLICA_GRADIENTS, REPLICA_ROWS):
        table = np.zeros((3, 2))
        table[row] = values
        gradients.append(np.concatenate([vector, table.ravel()]))
    return gradients


def test_two_replicas_clip_the_summed_gradient(two_replicas):
    total = np.sum(replica_gradients(), axis=0)
    assert np.linalg.norm(total) > CLIP > max(np.linalg.norm(g) for g in replica_gradients())
    np.testing.assert_allclose(two_replicas["ours"], adam_step(np.ones(10), clipped(total)), rtol=1e-6)
    np.testing.assert_allclose(two_replicas["ours_unclipped"], adam_step(np.ones(10), total), rtol=1e-6)


def test_keras_global_clipnorm_still_clips_each_replica_on_its_own(two_replicas):
    # Why GlobalClipAdamW exists. When this fails, Keras clips the sum itself: use its `global_clipnorm`.
    per_replica = np.sum([clipped(g) for g in replica_gradients()], axis=0)
    np.testing.assert_allclose(two_replicas["keras"], adam_step(np.ones(10), per_replica), rtol=1e-6)
    assert not np.allclose(1 - two_replicas["keras"], 1 - two_replicas["ours"], rtol=0.05)  # the updates


def test_on_one_device_it_is_keras_global_clipnorm():
    grad = np.array([3.0, 4.0, 0.0, 1.0], "float32")
    results = []
    for optimizer in (
        GlobalClipAdamW(clip_global_norm=CLIP, learning_rate=LEARNING_RATE, epsilon=EPSILON),
        keras.optimizers.AdamW(global_clipnorm=CLIP, learning_rate=LEARNING_RATE, epsilon=EPSILON),
    ):
        variable = keras.Variable(np.ones(4, "float32"))
        optimizer.apply([keras.ops.convert_to_tensor(grad)], [variable])
        results.append(variable.numpy())
    np.testing.assert_array_equal(results[0], results[1])
    decayed = np.ones(4) * (1 - LEARNING_RATE * 0.004)  # AdamW's default weight decay, applied first
    np.testing.assert_allclose(results[0], adam_step(decayed, clipped(grad)), rtol=1e-6)


def test_config_round_trip_and_refused_per_replica_clipping():
    optimizer = GlobalClipAdamW(clip_global_norm=0.5, learning_rate=1e-3)
    config = optimizer.get_config()
    assert config["clip_global_norm"] == 0.5 and config["global_clipnorm"] is None
    restored = GlobalClipAdamW.from_config(config)
    assert restored.clip_global_norm == 0.5 and restored.global_clipnorm == 0.5
    for name in ("global_clipnorm", "clipnorm", "clipvalue"):
        with pytest.raises(ValueError, match=f"Received: {name}=1.0"):
            GlobalClipAdamW(**{name: 1.0})
