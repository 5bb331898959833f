import numpy as np
import pytest
from harness import LayerHarness

from keras_tfam.layers import TransformerXLBlock

rng = np.random.default_rng(0)


class TestGTrXLBlockHarness(LayerHarness):
    # GTrXL gating exercises everything the residual block has, and the gates.
    layer_cls = TransformerXLBlock
    init_kwargs = {"num_heads": 2, "intermediate_dim": 16, "residual": "gru", "norm": "rms"}

    def make_inputs(self):
        return {
            "inputs": rng.normal(size=(2, 5, 8)).astype("float32"),
            "memory": rng.normal(size=(2, 4, 8)).astype("float32"),
            "memory_mask": np.array([[1, 1, 1, 1], [0, 1, 1, 1]], bool),
        }


@pytest.mark.parametrize("residual, norm_position", [("add", "pre"), ("add", "post"), ("gru", "pre")])
def test_segment_after_its_memory_equals_the_causal_pass_over_both(residual, norm_position):
    # The memory holds the states before the segment: attending to it is attending
    # to the whole text causally (same relative positions), for the segment's rows.
    block = TransformerXLBlock(2, 16, residual=residual, norm_position=norm_position)
    text = rng.normal(size=(2, 9, 8)).astype("float32")
    whole = np.asarray(block(text))
    segment = np.asarray(block(text[:, 5:], memory=text[:, :5]))
    np.testing.assert_allclose(segment, whole[:, 5:], atol=1e-5)


def test_empty_memory_slots_are_not_attended():
    block = TransformerXLBlock(2, 16)
    text = rng.normal(size=(1, 6, 8)).astype("float32")
    memory = np.concatenate([rng.normal(size=(1, 3, 8)), text[:, :2]], axis=1).astype("float32")
    out = block(text[:, 2:], memory=memory, memory_mask=np.array([[0, 0, 0, 1, 1]], bool))
    np.testing.assert_allclose(out, np.asarray(block(text))[:, 2:], atol=1e-5)


def test_gtrxl_block_starts_near_the_identity():
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    memory = rng.normal(size=(2, 4, 16)).astype("float32")

    def deviation(**options):
        out = np.asarray(TransformerXLBlock(4, 64, **options)(x, memory=memory))
        return np.linalg.norm(out - x) / np.linalg.norm(x)

    residual, gated, closed = deviation(), deviation(residual="gru"), deviation(residual="gru", gate_bias=10.0)
    # The paper's gate bias of 2 passes ~1 - sigmoid(-2) = 88% of the stream through each gate.
    assert gated < 0.5 * residual
    assert closed < 1e-3


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: residual='highway'"):
        TransformerXLBlock(2, 16, residual="highway")
    with pytest.raises(ValueError, match="norm_position='post'"):
        TransformerXLBlock(2, 16, residual="gru", norm_position="post")
    block = TransformerXLBlock(2, 16)
    x = np.zeros((2, 3, 8), "float32")
    with pytest.raises(ValueError, match=r"Received: memory.shape=\(2, 4, 6\)"):
        block(x, memory=np.zeros((2, 4, 6), "float32"))
