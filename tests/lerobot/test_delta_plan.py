"""LeRobot's delta_timestamps rules as pure functions (torchrecord._order.delta_plan), with no file."""

from __future__ import annotations

import numpy as np
import pytest

from torchrecord._order.delta_plan import check_delta_timestamps, delta_indices, query_frames


def test_offsets_within_the_tolerance_pass_and_round_as_python_does() -> None:
    deltas = {"a": [-0.1, 0.0, 0.10009, 0.25], "b": [1 / 30]}
    with pytest.raises(ValueError, match=r"multiples of 1/10.*0\.25"):
        check_delta_timestamps(deltas, 10, 1e-4)
    check_delta_timestamps({"a": [-0.1, 0.0, 0.10009]}, 10, 1e-4)
    check_delta_timestamps({"b": [1 / 30, 2 / 30]}, 30, 1e-4)
    got = delta_indices({"a": [-0.1, 0.0, 0.10009], "b": [0.25, 0.35]}, 10)
    assert {k: v.tolist() for k, v in got.items()} == {"a": [-1, 0, 1], "b": [2, 4]}  # round half to even
    assert all(v.dtype == np.int64 for v in got.values())


@pytest.mark.parametrize("bad", [[], "0.1", 0.1, None])
def test_offsets_must_be_a_non_empty_list(bad: object) -> None:
    with pytest.raises(ValueError, match="non-empty list"):
        delta_indices({"a": bad}, 10)  # type: ignore[dict-item]


def test_queries_repeat_the_episode_edges_and_mark_the_pads() -> None:
    # items at frames 0 (episode [0, 2)), 5 and 9 (episode [3, 10))
    frames, start, end = np.array([0, 5, 9]), np.array([0, 3, 3]), np.array([2, 10, 10])
    query, pad = query_frames(frames, start, end, np.array([-3, 0, 1, 4]))
    assert query.tolist() == [[0, 0, 1, 1], [3, 5, 6, 9], [6, 9, 9, 9]]
    assert pad.tolist() == [[True, False, False, True], [True, False, False, False], [False, False, True, True]]
    assert query.dtype == np.int64 and pad.dtype == np.bool_
