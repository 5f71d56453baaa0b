"""Reply sampling from the model's folder, and the guard that stops a looping reply."""

from __future__ import annotations

import json

import pytest

from inferscale_core.generation import (
    EMBEDDED,
    REPETITION_PENALTY,
    LoopGuard,
    Sampling,
    max_ngram_repeats,
    model_sampling,
)

PARAGRAPH = "I am glad to meet you Dana and I hope the lessons go well for Aiko. "


def test_the_guard_stops_at_the_third_occurrence_of_an_8_gram():
    guard = LoopGuard()
    text = ""
    stopped_at = None
    for i, word in enumerate((PARAGRAPH * 5).split(" ")):
        text += word + " "
        if guard.feed(text):
            stopped_at = i
            break
    assert stopped_at is not None
    words = len(PARAGRAPH.split())
    assert 2 * words <= stopped_at < 2 * words + 8  # within the third time round
    assert max_ngram_repeats(text) == 3


def test_the_guard_waits_for_a_word_to_end_and_lets_a_varied_reply_through():
    guard = LoopGuard(n=2, repeats=2)
    assert not guard.feed("the cat the ca")  # "ca" may still grow into "cat"
    assert guard.feed("the cat the cat ")
    varied = " ".join(f"word{i}" for i in range(300))
    assert not LoopGuard().feed(varied + " ") and max_ngram_repeats(varied) == 1
    assert max_ngram_repeats("too short") == 0


def test_model_sampling_reads_the_generation_config(tmp_path):
    assert model_sampling(None) == EMBEDDED == Sampling(0.2, 0.9, 0, REPETITION_PENALTY)
    assert model_sampling(tmp_path) == Sampling(repetition_penalty=REPETITION_PENALTY)
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20})
    )
    assert model_sampling(tmp_path) == Sampling(0.6, 0.95, 20, REPETITION_PENALTY)
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"do_sample": False, "temperature": 0.6, "repetition_penalty": 1.3})
    )
    assert model_sampling(tmp_path) == Sampling(repetition_penalty=1.3)
    (tmp_path / "generation_config.json").write_text("{not json")
    assert model_sampling(tmp_path) == Sampling(repetition_penalty=REPETITION_PENALTY)


def test_sampling_overrides_and_checks():
    assert EMBEDDED.with_overrides(temperature=0.0, top_p=None).temperature == 0.0
    assert EMBEDDED.with_overrides(temperature=0.0, top_p=None).top_p == 0.9
    with pytest.raises(ValueError, match="top_p must be a number in"):
        Sampling(top_p=0)
    with pytest.raises(ValueError, match="temperature must be a number >= 0"):
        EMBEDDED.with_overrides(temperature=-1)
    with pytest.raises(ValueError, match="min_tokens must be a whole number >= 0"):
        EMBEDDED.with_overrides(min_tokens=-1)
    assert set(EMBEDDED.engine_kwargs()) == {
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "min_tokens",
    }
