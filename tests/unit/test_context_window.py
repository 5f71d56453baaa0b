"""Context windows: which turns a fact is encoded after (inferscale_core/context_window.py)."""

from __future__ import annotations

import pytest

from inferscale_core.context_window import (
    ANCHORED,
    SLIDING,
    encoding_version,
    first_context_turn,
)


@pytest.mark.parametrize("w", [1, 2, 5, 20])
def test_anchored_windows_hold_w_to_2w_minus_1_turns_and_grow_by_one(w):
    previous: tuple[int, int] | None = None  # (first context turn, context size)
    for idx in range(6 * w):
        first = first_context_turn(idx, w, ANCHORED)
        size = idx - first
        assert size == idx if idx < w else w <= size <= 2 * w - 1
        assert first % w == 0  # an anchor
        if previous is not None and first == previous[0]:
            # the same anchor: this fact's context is the last one's plus one turn, so the
            # engine's prefix cache serves everything up to the newest turn
            assert size == previous[1] + 1
        previous = (first, size)
        assert first_context_turn(idx, w, SLIDING) == max(0, idx - w)


def test_anchored_windows_prefill_each_turn_about_twice():
    """The tokens a conversation of n turns costs: sliding prefills each turn ~w times, the
    anchored window ~2 times (each context prefix computed once, by the prefix cache)."""
    n, w = 400, 20
    sliding = sum(idx - first_context_turn(idx, w, SLIDING) for idx in range(n))
    computed, seen = 0, {}
    for idx in range(n):
        first = first_context_turn(idx, w, ANCHORED)
        computed += idx - max(first, seen.get(first, first))  # turns not cached yet
        seen[first] = idx
    assert sliding / n == pytest.approx(w, rel=0.05)
    assert 1.8 < computed / n < 2  # (2w - 1) turns per w facts, fewer at the start


def test_w0_is_the_same_encoding_either_way_and_errors_are_clear():
    assert first_context_turn(7, 0, ANCHORED) == first_context_turn(7, 0, SLIDING) == 7
    assert encoding_version("e/1", 0, ANCHORED) == encoding_version("e/1", 0, SLIDING) == "e/1"
    assert encoding_version("e/1", 20, ANCHORED) == "e/1+anchored"
    assert encoding_version("e/1", 20, SLIDING) == "e/1"
    with pytest.raises(ValueError, match="window must be one of anchored, sliding; got 'x'"):
        first_context_turn(3, 2, "x")
    with pytest.raises(ValueError, match="w and idx must be >= 0"):
        first_context_turn(-1, 2, ANCHORED)
