"""`pipelines.keras_workarounds` against the Keras behaviour it exists for: two workers on this machine fit a tiny
model with Keras' own `fit` (which fails, in the two places the module names) and with `fit_multi_worker`
(which trains, the two workers agreeing). When Keras' own fit starts to work, this fails: delete the work-around."""

import json
import os
import socket
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORKER = textwrap.dedent(
    """
    import json, sys
    import keras, numpy as np, tensorflow as tf
    from pipelines.keras_workarounds import MultiWorkerTrainer, fit_multi_worker

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x = np.arange(16, dtype="float32").reshape(4, 4) / 16
    data = tf.data.Dataset.from_tensors((x, x.sum(-1, keepdims=True))).repeat()  # one batch: the loss must fall

    def model():
        keras.utils.set_random_seed(0)
        with strategy.scope():
            built = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            built.compile(keras.optimizers.SGD(0.1), "mse")
        return built

    def error(fit):
        try:
            fit()
        except Exception as e:  # what Keras raises differs by where it fails
            return str(e)
        return None

    class KerasLogs(MultiWorkerTrainer):  # the trainer with Keras' own train step (scalar logs)
        def train_step(self, data):
            return keras.Model.train_step(self, data)

    def keras_logs():
        trainer = KerasLogs(model())  # outside the scope, as `fit_multi_worker` makes it
        with strategy.scope():
            trainer.compile(keras.optimizers.SGD(0.1), "mse")
            trainer.fit(data, epochs=1, steps_per_epoch=2, verbose=0)

    result = {
        "keras_fit": error(lambda: model().fit(data, epochs=1, steps_per_epoch=2, verbose=0)),
        "keras_logs": error(keras_logs),
        "ours": fit_multi_worker(model(), strategy, data, [], 2, 2, verbose=0).history["loss"],
    }
    print("RESULT " + json.dumps(result))
    """
)


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_keras_multi_worker_fit_still_fails_and_the_work_around_trains():
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(2)]}
    processes = []
    for index in range(2):
        config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_CONFIG": json.dumps(config)}
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        outputs = [p.communicate(timeout=300) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
    results = []
    for p, (out, err) in zip(processes, outputs):
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:]))
    for result in results:
        assert "PerReplica" in result["keras_fit"]  # 1. the eager cross-worker build
        assert "Invalid reduction dimension 0" in result["keras_logs"]  # 2. the scalar logs' reduction
        assert len(result["ours"]) == 2 and result["ours"][1] < result["ours"][0]
    assert results[0]["ours"] == results[1]["ours"]
