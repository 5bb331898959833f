"""TF Serving warmup requests, written into each export: `<version>/assets.extra/tf_serving_warmup_requests`.

TF Serving replays the requests of that file (a TFRecord of `PredictionLog` protos) when it loads a model
version, before the version takes traffic, so the first user's request does not pay for building the
signatures' graphs or compiling their loops.
"""

import os

import numpy as np

from pipelines.serving_requests import generate_request, generate_text_request

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
# The widths (prompt and new tokens) warmed up at: the served loop is compiled per power of two of it.
WARMUP_BUFFERS = (16, 32, 64, 128, 256)
WARMUP_NEW_TOKENS = 2


def warmup_inputs(signature_names, batch_sizes=(1,), context=None, drafted=0):
    """`[(signature name, {input name: NumPy array})]`: the requests the warmup file holds.

    `generate` at every batch size of `batch_sizes` and every buffer of `WARMUP_BUFFERS` within the model's
    `context` (so that it compiles its loop for them; a loop that verifies `drafted` tokens holds that many
    more); `serving_default` and `generate_text` (a one-word prompt: the narrowest buffer) at each batch size
    once. Each request asks for `WARMUP_NEW_TOKENS` new tokens, so that the replay itself is short.
    """
    buffers = [width for width in WARMUP_BUFFERS if context is None or width <= context] or [context]
    buffers = [width for width in buffers if width - drafted - WARMUP_NEW_TOKENS >= 1]
    requests = []
    for batch in batch_sizes:
        if "serving_default" in signature_names:
            requests.append(("serving_default", {"token_ids": np.ones((batch, 8), np.int32)}))
        if "generate_text" in signature_names:
            requests.append(("generate_text", generate_text_request(["The"] * batch, WARMUP_NEW_TOKENS)))
        for width in buffers if "generate" in signature_names else ():
            prompt = [1] * (width - drafted - WARMUP_NEW_TOKENS)
            requests.append(("generate", generate_request([prompt] * batch, WARMUP_NEW_TOKENS)))
    return requests


def write_warmup_requests(version_dir, signature_names, batch_sizes=(1,), context=None, drafted=0):
    """Writes the warmup file of an export's signatures into `version_dir` (`warmup_inputs`); returns its
    path."""
    import tensorflow as tf
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    path = os.path.join(version_dir, WARMUP_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for name, inputs in warmup_inputs(signature_names, batch_sizes, context, drafted):
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
