"""TF Serving warmup requests, written into each export: `<version>/assets.extra/tf_serving_warmup_requests`.

TF Serving replays the requests of that file (a TFRecord of `PredictionLog` protos) when it loads a model
version, before the version takes traffic, so the first user's request does not pay for building the
signatures' graphs. One request per signature and batch size a server is expected to see; each asks for few
new tokens, so that the replay itself is short.
"""

import os

import numpy as np

from pipelines.serving_requests import generate_request, generate_text_request

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
# The batch sizes the generate signatures are warmed up at.
WARMUP_BATCHES = (1, 8)
WARMUP_PROMPT_LENGTH = 8
WARMUP_NEW_TOKENS = 2


def warmup_inputs(signature_names):
    """`[(signature name, {input name: NumPy array})]`: the requests the warmup file holds."""
    requests = []
    prompt = list(range(1, WARMUP_PROMPT_LENGTH + 1))
    for batch in WARMUP_BATCHES:
        if "serving_default" in signature_names:
            requests.append(("serving_default", {"token_ids": np.array([prompt] * batch, np.int32)}))
        if "generate" in signature_names:
            requests.append(("generate", generate_request([prompt] * batch, WARMUP_NEW_TOKENS)))
        if "generate_text" in signature_names:
            requests.append(("generate_text", generate_text_request(["The"] * batch, WARMUP_NEW_TOKENS)))
    return requests


def write_warmup_requests(version_dir, signature_names):
    """Writes the warmup file of an export's signatures into `version_dir`; returns its path."""
    import tensorflow as tf
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    path = os.path.join(version_dir, WARMUP_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for name, inputs in warmup_inputs(signature_names):
            request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(signature_name=name))
            for key, value in inputs.items():
                request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return path


def read_warmup_requests(path):
    """`[(signature name, {input name: NumPy array})]` from a warmup file (what TF Serving replays)."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    requests = []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        log = prediction_log_pb2.PredictionLog.FromString(record)
        request = log.predict_log.request
        inputs = {key: tf.make_ndarray(proto) for key, proto in request.inputs.items()}
        requests.append((request.model_spec.signature_name, inputs))
    return requests
