import re

import keras
import numpy as np
import pytest
from backend import compiled

from keras_tfam.models import DecisionTransformer

STATE_DIM, NUM_ACTIONS, STEPS = 4, 4, 8
POLICY = np.random.default_rng(123).normal(size=(STATE_DIM, NUM_ACTIONS))


def trajectories(n, seed):
    """Offline data from a known policy, no environment needed.

    The behaviour is the expert `argmax(s @ POLICY)` (reward 1) for the first
    `m` steps of a trajectory and the wrong action `expert + 1` (reward 0)
    afterwards, `m` uniform in 0..8. So the return-to-go says which one acts:
    positive -> the expert's action, zero -> the other one.
    """
    r = np.random.default_rng(seed)
    states = r.normal(size=(n, STEPS, STATE_DIM)).astype("float32")
    expert = (states @ POLICY).argmax(-1)
    switch = r.integers(0, STEPS + 1, size=(n, 1))
    follows = np.arange(STEPS)[None] < switch
    actions = np.where(follows, expert, (expert + 1) % NUM_ACTIONS).astype("int32")
    rewards = follows.astype("float32")
    returns_to_go = np.cumsum(rewards[:, ::-1], axis=1)[:, ::-1].copy()
    inputs = {
        "returns_to_go": returns_to_go,
        "states": states,
        "actions": actions,
        "timesteps": np.broadcast_to(np.arange(STEPS, dtype="int32"), (n, STEPS)).copy(),
    }
    return inputs, actions, expert


def test_imitates_the_policy_conditioned_on_the_return():
    keras.utils.set_random_seed(0)
    model = DecisionTransformer(
        STATE_DIM,
        NUM_ACTIONS,
        max_timestep=STEPS,
        hidden_dim=32,
        num_layers=2,
        num_heads=2,
        dropout=0.0,
        return_scale=STEPS,
    )
    model.compile(keras.optimizers.AdamW(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    inputs, actions, _ = trajectories(1200, seed=0)
    model.fit(inputs, actions, batch_size=64, epochs=8, verbose=0)

    held_out, actions, expert = trajectories(300, seed=1)
    predicted = np.asarray(model.predict(held_out, verbose=0)).argmax(-1)
    assert (predicted == actions).mean() >= 0.95
    # Conditioning on a return: roll out as at evaluation (the return-to-go
    # decreases by each reward, here 1 when the action is the expert's). The
    # data implies the expert acts while return is left to collect, so the
    # returns obtained follow the returns asked for.
    means = []
    for target in (0, 3, 8):
        achieved = rollout(model, held_out["states"], expert, target)
        assert abs(achieved.mean() - target) < 0.5, (target, np.bincount(achieved))
        means.append(achieved.mean())
    assert means[0] < means[1] < means[2]


def rollout(model, states, expert, target):
    """Returns obtained when asking for `target`, acting greedily step by step."""
    n = len(states)
    returns_to_go = np.zeros((n, STEPS), "float32")
    returns_to_go[:, 0] = target
    actions = np.zeros((n, STEPS), "int32")
    timesteps = np.broadcast_to(np.arange(STEPS, dtype="int32"), (n, STEPS))
    for t in range(STEPS):
        seen = slice(0, t + 1)
        logits = model(
            {
                "returns_to_go": returns_to_go[:, seen],
                "states": states[:, seen],
                "actions": actions[:, seen],
                "timesteps": timesteps[:, seen],
            }
        )
        actions[:, t] = np.asarray(logits)[:, -1].argmax(-1)
        if t + 1 < STEPS:
            returns_to_go[:, t + 1] = returns_to_go[:, t] - (actions[:, t] == expert[:, t])
    return (actions == expert).sum(axis=1)


def test_causal_and_save_load(tmp_path):
    model = DecisionTransformer(STATE_DIM, NUM_ACTIONS, max_timestep=STEPS, hidden_dim=16, num_layers=1, num_heads=2)
    inputs, _, _ = trajectories(2, seed=2)
    logits = np.asarray(model(inputs))
    assert logits.shape == (2, STEPS, NUM_ACTIONS)
    # a_t is read at s_t: changing a_t (and anything later) leaves step t's prediction alone.
    changed = {name: value.copy() for name, value in inputs.items()}
    changed["actions"][:, 3:] = (changed["actions"][:, 3:] + 1) % NUM_ACTIONS
    changed["states"][:, 4:] += 1.0
    np.testing.assert_allclose(np.asarray(model(changed))[:, :4], logits[:, :4], atol=1e-5)
    path = str(tmp_path / "dt.keras")
    model.save(path)
    np.testing.assert_allclose(np.asarray(keras.saving.load_model(path)(inputs)), logits, atol=1e-6)


def test_bad_input():
    model = DecisionTransformer(STATE_DIM, NUM_ACTIONS, max_timestep=STEPS, hidden_dim=16, num_layers=1)
    inputs, _, _ = trajectories(2, seed=3)
    short = {**inputs, "actions": inputs["actions"][:, :5]}
    with pytest.raises(ValueError, match=r"same number of steps.*actions.shape=\(2, 5\)"):
        model(short)
    with pytest.raises(ValueError, match=r"expected shape=\(None, None, 4\), found shape=\(2, 8, 3\)"):
        model({**inputs, "states": inputs["states"][..., :3]})
    with pytest.raises(ValueError, match="Received: num_actions=0"):
        DecisionTransformer(STATE_DIM, 0, max_timestep=STEPS)
    with pytest.raises(ValueError, match="Received: return_scale=0"):
        DecisionTransformer(STATE_DIM, 2, max_timestep=STEPS, return_scale=0)


@pytest.mark.parametrize(
    "name, value, shown",
    [
        ("actions", -1, "actions=-1"),  # an embedding lookup would wrap to the last action
        ("actions", NUM_ACTIONS, f"actions={NUM_ACTIONS}"),  # XLA would clamp to the last action
        ("timesteps", -3, "timesteps=-3"),
        ("timesteps", STEPS, f"timesteps={STEPS}"),
    ],
)
def test_actions_and_timesteps_outside_their_tables_are_refused(name, value, shown):
    model = DecisionTransformer(STATE_DIM, NUM_ACTIONS, max_timestep=STEPS, hidden_dim=16, num_layers=1)
    inputs, _, _ = trajectories(2, seed=4)
    bad = {**inputs, name: inputs[name].copy()}
    bad[name][1, 5] = value
    # (Keras adds the call's arguments to the message on lines of their own.)
    with pytest.raises(
        ValueError, match=re.escape("must be integers in [") + f".*Received: {shown} at index \\(1, 5\\)"
    ):
        model(bad)
    # Given as arrays, the values are known before `predict`, `evaluate` or `fit` trace anything.
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    actions = inputs["actions"]
    for run in (
        lambda: model.predict(bad, verbose=0),
        lambda: model.evaluate(bad, actions, verbose=0),
        lambda: model.fit(bad, actions, epochs=1, verbose=0),
        lambda: model.fit(x=inputs, y=actions, validation_data=(bad, actions), epochs=1, verbose=0),
    ):
        with pytest.raises(ValueError, match=f"Received: {shown} at index \\(1, 5\\)"):
            run()
    # Compiled, where nothing can be raised: that trajectory's logits are NaN, the others exact.
    logits = np.asarray(compiled(lambda trajectory: model(trajectory))(bad))
    assert np.isnan(logits[1]).all()
    np.testing.assert_allclose(logits[0], np.asarray(model(inputs))[0], atol=1e-5)


def test_a_compiled_fit_on_a_stream_with_a_negative_action_shows_a_nan_loss():
    model = DecisionTransformer(STATE_DIM, NUM_ACTIONS, max_timestep=STEPS, hidden_dim=16, num_layers=1)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    inputs, actions, _ = trajectories(4, seed=5)
    inputs["actions"] = inputs["actions"].copy()  # the targets stay valid
    inputs["actions"][2, 3] = -1  # once wrapped to the last action, silently

    def stream():  # values seen only inside the traced step
        while True:
            yield inputs, actions

    history = model.fit(stream(), steps_per_epoch=1, epochs=1, verbose=0)
    assert np.isnan(history.history["loss"][0])


@pytest.mark.parametrize(
    "kwargs, shown",
    [
        ({"dropout": float("nan")}, "dropout=nan"),
        ({"return_scale": float("inf")}, "return_scale=inf"),
        ({"intermediate_dim": 0}, "intermediate_dim=0"),
        ({"hidden_dim": 16.0}, "hidden_dim=16.0"),
    ],
)
def test_bad_hyperparameters_are_refused_in_one_line(kwargs, shown):
    with pytest.raises(ValueError) as error:
        DecisionTransformer(STATE_DIM, NUM_ACTIONS, max_timestep=STEPS, **kwargs)
    assert "\n" not in str(error.value) and str(error.value).endswith(f"Received: {shown}")


def test_numpy_integer_sizes_are_accepted():
    model = DecisionTransformer(
        np.int64(STATE_DIM),
        np.int32(NUM_ACTIONS),
        max_timestep=np.int64(STEPS),
        hidden_dim=np.int64(16),
        num_layers=np.int64(1),
    )
    assert model.get_config()["num_actions"] == NUM_ACTIONS and type(model.get_config()["max_timestep"]) is int
