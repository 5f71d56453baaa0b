"""A turn's share of the context, on SmolLM2's real tokenizer and chat template: history goes
first, then the least relevant memories; a turn too long by itself is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferscale_core.composer import ChatLayout, EmptyTurn, PromptTooLong, TurnRejected
from inferscale_core.prompt_budget import fit_turn


@pytest.fixture(scope="module")
def layout(smollm2_path: Path) -> ChatLayout:
    from transformers import AutoTokenizer

    return ChatLayout(AutoTokenizer.from_pretrained(str(smollm2_path)), "You are helpful.")


HISTORY = [("user", "I like tea. " * 20), ("assistant", "Noted. " * 20)] * 3  # oldest first


def prompt_tokens(layout: ChatLayout, question: str, history, memories) -> int:
    return len(layout.prefix_ids) + sum(memories) + len(layout.suffix_ids(question, history))


def test_everything_fits_untouched(layout):
    fit = fit_turn(layout, "Hi?", HISTORY, [30] * 5, context=8192, reply_tokens=512)
    assert (fit.history, fit.memories, fit.trimmed, fit.describe()) == (HISTORY, 5, False, "")
    assert fit.prompt_tokens == prompt_tokens(layout, "Hi?", HISTORY, [30] * 5)


def test_history_goes_first_oldest_turn_first_then_the_least_relevant_memories(layout):
    full = prompt_tokens(layout, "Hi?", HISTORY, [30] * 5)
    context = full + 512 - 150  # over by 150 tokens: two of the oldest turns must go
    fit = fit_turn(layout, "Hi?", HISTORY, [30] * 5, context=context, reply_tokens=512)
    assert fit.memories == 5 and fit.history == HISTORY[-len(fit.history) :]
    assert 0 < fit.dropped_turns < len(HISTORY) and fit.prompt_tokens <= context - 512
    tight = prompt_tokens(layout, "Hi?", [], [30] * 2) + 512 + 10  # room for 2 of 5 memories
    fit = fit_turn(layout, "Hi?", HISTORY, [30] * 5, context=tight, reply_tokens=512)
    assert (fit.history, fit.memories, fit.dropped_turns, fit.dropped_memories) == ([], 2, 6, 3)
    assert fit.describe() == "left out to fit the context: 6 older turns, 3 memories"
    assert fit.prompt_tokens <= tight - 512


def test_the_history_has_its_own_token_budget(layout):
    fit = fit_turn(layout, "Hi?", HISTORY, [], context=8192, reply_tokens=512, history_tokens=100)
    turn_tokens = len(layout.tokenizer.encode("Noted. " * 20, add_special_tokens=False))
    assert fit.history == HISTORY[-1:] and turn_tokens <= 100
    assert fit.dropped_turns == 5 and "5 older turns" in fit.describe()


def test_a_refused_turn_leaves_nothing_in_the_layout(layout):
    """Issue 35: each distinct over-long question left its suffix's ids (11 MB for 941k
    tokens) in the layout's cache; a refused turn must cost nothing once answered."""
    fit_turn(layout, "Hi?", HISTORY, [30], context=8192, reply_tokens=512)  # remembered
    held = dict(layout._suffix_ids)
    for i in range(3):
        question = f"{i} " + "word " * 9000
        with pytest.raises(PromptTooLong):
            fit_turn(layout, question, HISTORY, [30], context=8192, reply_tokens=512)
    assert layout._suffix_ids == held


def test_a_turn_too_long_by_itself_is_refused_with_its_length(layout):
    text = "word " * 9000
    with pytest.raises(PromptTooLong) as refused:
        fit_turn(layout, text, HISTORY, [30], context=8192, reply_tokens=512)
    own = len(layout.tokenizer.encode(text, add_special_tokens=False))
    assert refused.value.tokens == own and 7000 < refused.value.limit < 7680
    assert f"{own:,} tokens" in str(refused.value) and "was not sent" in str(refused.value)
    with pytest.raises(EmptyTurn, match="the message is empty"):
        fit_turn(layout, "  \n", [], [], context=8192, reply_tokens=512)
    assert issubclass(PromptTooLong, TurnRejected) and issubclass(EmptyTurn, ValueError)
