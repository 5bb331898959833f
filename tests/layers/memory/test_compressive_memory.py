import numpy as np
import pytest
from gradients import gradient
from harness import LayerHarness
from reference_memory import compressive_memory

from keras_tfam.layers import CompressiveMemory, MultiHeadAttention

rng = np.random.default_rng(0)
NUMPY_COMPRESSIONS = {"mean": lambda g: g.mean(0), "max": lambda g: g.max(0)}


class TestCompressiveMemoryHarness(LayerHarness):
    layer_cls = CompressiveMemory
    init_kwargs = {"memory_length": 4, "compressed_memory_length": 2, "compression_rate": 3}

    def make_inputs(self):
        return {"states": rng.normal(size=(2, 6, 8)).astype("float32")}


def test_conv_compression_is_a_strided_convolution():
    memory = CompressiveMemory(4, 2, compression_rate=3, compression="conv")
    states = rng.normal(size=(2, 6, 5)).astype("float32")
    out = np.asarray(memory(states))
    kernel, bias = (np.asarray(w, np.float64) for w in (memory.kernel, memory.bias))
    for g in range(2):
        expected = np.einsum("bcd,cde->be", states[:, 3 * g : 3 * g + 3], kernel) + bias
        np.testing.assert_allclose(out[:, g], expected, atol=1e-5)


@pytest.mark.parametrize("compression", ["mean", "max"])
@pytest.mark.parametrize("segments", [[4, 4, 4, 1], [1] * 13, [5, 8], [13]], ids=["4s", "1s", "5-8", "whole"])
@pytest.mark.parametrize("rate", [1, 2, 3])
def test_state_is_the_papers_however_the_stream_is_cut(compression, segments, rate):
    # M=4 memory, Cm=3 compressed slots: 13 states fill both and push some out.
    layer = CompressiveMemory(4, 3, compression_rate=rate, compression=compression)
    stream = rng.normal(size=(2, 13, 5)).astype("float32")
    state = layer.initial_state(2, 5)
    start = 0
    for length in segments:
        state, _ = layer.update(state, stream[:, start : start + length])
        start += length
    for row in range(2):
        compressed, compressed_valid, memory, memory_valid = compressive_memory(
            stream[row].astype(np.float64), 4, 3, rate, NUMPY_COMPRESSIONS[compression]
        )
        np.testing.assert_allclose(np.asarray(state["memory"])[row], memory, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(state["memory_mask"])[row], memory_valid)
        np.testing.assert_array_equal(np.asarray(state["compressed_mask"])[row], compressed_valid)
        held = compressed_valid
        np.testing.assert_allclose(np.asarray(state["compressed"])[row][held], compressed[held], atol=1e-6)
    attended, mask = layer.attended(state)
    assert attended.shape == (2, 7, 5) and mask.shape == (2, 7)


def test_reconstruction_loss_trains_the_compression_only():
    attention = MultiHeadAttention(2, 4)
    queries = rng.normal(size=(2, 5, 8)).astype("float32")
    attention(queries)
    states = rng.normal(size=(2, 8, 8)).astype("float32")
    # Mean pooling at rate 1 compresses nothing away: the loss is zero.
    identity = CompressiveMemory(4, 4, compression_rate=1, compression="mean")
    _, evicted = identity.update(identity.initial_state(2, 8), states)
    assert float(identity.reconstruction_loss(attention, queries, evicted)) == pytest.approx(0.0, abs=1e-10)
    # A convolution at rate 2: a positive loss whose gradient reaches the
    # convolution and not the attention.
    conv = CompressiveMemory(4, 4, compression_rate=2, compression="conv")
    conv.build((2, 8, 8))

    def loss():
        _, evicted = conv.update(conv.initial_state(2, 8), states)
        return conv.reconstruction_loss(attention, queries, evicted)

    assert float(loss()) > 0
    assert np.abs(gradient(loss, conv.kernel)).max() > 0
    assert np.abs(gradient(loss, attention.key_dense.kernel)).max() == 0


def test_nothing_compressed_yet_gives_no_loss():
    attention = MultiHeadAttention(2, 4)
    queries = rng.normal(size=(1, 3, 8)).astype("float32")
    attention(queries)
    layer = CompressiveMemory(4, 2, compression_rate=2, compression="conv")
    layer.build((1, 3, 8))
    # 3 states leave 3 empty slots: one complete group of empty slots.
    _, evicted = layer.update(layer.initial_state(1, 8), queries)
    assert not np.asarray(evicted["group_mask"]).any()
    assert float(layer.reconstruction_loss(attention, queries, evicted)) == 0.0


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: compression_rate=0"):
        CompressiveMemory(4, 2, compression_rate=0)
    with pytest.raises(ValueError, match="Received: compression_rate=0.5"):
        CompressiveMemory(4, 2, compression_rate=0.5)
    with pytest.raises(ValueError, match="Received: memory_length=-1"):
        CompressiveMemory(-1)
    with pytest.raises(ValueError, match="Received: compression='avg'"):
        CompressiveMemory(4, 2, compression="avg")
    with pytest.raises(ValueError, match="needs `memory_length` >= 1"):
        CompressiveMemory(0, 2)
    layer = CompressiveMemory(4, 2, compression_rate=3)
    with pytest.raises(ValueError, match=r"multiple of compression_rate=3.*Received: states.shape=\(1, 4, 2\)"):
        layer(np.zeros((1, 4, 2), "float32"))
    with pytest.raises(ValueError, match=r"Received: memory.shape=\(3, 4, 8\)"):
        layer.check_state(layer.initial_state(3, 8), 2, 8)
    with pytest.raises(ValueError, match=r"Received: memory.shape=\(2, 4, 6\)"):
        layer.check_state(layer.initial_state(2, 6), 2, 8)
