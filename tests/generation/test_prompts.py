"""Prompt packing and the request checks shared by `generate` and the serving signatures."""

import keras
import numpy as np
import pytest

from keras_tfam.generation.prompts import as_padded_prompts, pack_prompts, prompt_checks, raise_failed_checks


def test_prompts_of_any_form_become_padded_rows_and_lengths():
    padded, lengths = as_padded_prompts([[4, 5, 6], [7]], pad_token_id=9)
    np.testing.assert_array_equal(padded, [[4, 5, 6], [7, 9, 9]])
    np.testing.assert_array_equal(lengths, [3, 1])
    padded, lengths = as_padded_prompts([3, 1, 4])
    np.testing.assert_array_equal(padded, [[3, 1, 4]])
    padded, lengths = as_padded_prompts(np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(lengths, [3, 3])
    with pytest.raises(ValueError, match=r"Received: shape=\(1, 2, 3\)"):
        as_padded_prompts(np.zeros((1, 2, 3), "int32"))
    with pytest.raises(ValueError, match="must be integers"):
        as_padded_prompts([[1.5, 2.0]])


def test_packing_puts_padding_after_each_prompt():
    tokens = pack_prompts(np.array([[4, 5, 6], [7, 8, 99]]), np.array([3, 1]), 2, pad_token_id=0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(tokens), [[4, 5, 6, 0, 0], [7, 0, 0, 0, 0]])


@pytest.mark.parametrize(
    "token_ids, lengths, max_new_tokens, message",
    [
        ([[1, 2]], [2, 2], 3, r"\(1 prompts\). Received: 2 lengths"),
        ([[1, 2], [3, 0]], [2, 0], 3, r"empty prompt at row 1 \(length 0\)"),
        ([[1, 2]], [3], 3, r"cannot exceed the width of `token_ids` \(2\)\. Received: length 3 at row 0"),
        ([[1, 2], [3, 10]], [2, 2], 3, r"\[0, 10\).*Received: token id 10 at prompt 1, position 1"),
        ([[-1, 2]], [2], 3, "Received: token id -1 at prompt 0, position 0"),
        ([[1, 2]], [2], 0, "Received: max_new_tokens=0"),
    ],
)
def test_each_bad_request_is_named(token_ids, lengths, max_new_tokens, message):
    checks = prompt_checks(np.array(token_ids, "int32"), np.array(lengths, "int32"), max_new_tokens, 10)
    with pytest.raises(ValueError, match=message):
        raise_failed_checks(checks)


def test_ids_in_the_padding_are_ignored():
    checks = prompt_checks(np.array([[1, 2, 99]], "int32"), np.array([2], "int32"), 3, 10)
    raise_failed_checks(checks)
