"""A logged reply stores what it used, on the real engine: the memories in prompt order (with
the tier an injected one came from), k, the mode and the engine's figures, in the transaction
that logs the assistant turn; forgetting a memory through the session blanks it there."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from inferscale_core import wiring
from inferscale_core.config import AppConfig
from inferscale_core.extractor import DeterministicExtractor
from inferscale_core.session import SessionConfig
from inferscale_core.types import Conversation, Turn

pytestmark = pytest.mark.engine

CAT = "I adopted a grey cat named Miso from the shelter last week."


def row(memory) -> tuple:
    """What a memory panel shows of a memory (a live InjectedFact or a stored ReplyMemory)."""
    return memory.fact_id, memory.text, memory.refers_to, memory.score, memory.how, memory.tier


def test_a_logged_reply_stores_what_it_used(runtime, minilm, tmp_path):
    session = wiring.open_session(
        runtime,
        AppConfig(k=5, w=2),
        tmp_path / "memory.db",
        embedder=minilm,
        extractor=DeterministicExtractor(),
        session_config=SessionConfig(k=5, w=2, max_tokens=8, history_turns=2),
    )
    try:
        log = session.factlog
        seed = Conversation("seed", [Turn("user", CAT, datetime.now(UTC))])
        log.add_conversation(session.profile_id, seed)
        assert session.worker.wait_idle(timeout=240), session.worker.stats
        conversation = session.new_conversation("cat")
        for mode in ("inject", "prompt"):
            session.config.mode = mode
            reply = session.ask_all(conversation, "What is the name of my cat?")
            turn = reply.assistant_turn_id
            stored = log.reply_details([turn, reply.user_turn_id])
            assert stored.keys() == {turn}  # the assistant turn's, not the user turn's
            got, result = stored[turn], reply.result
            assert (got.mode, got.k, got.notes) == (mode, 5, tuple(reply.notes))
            assert [row(m) for m in got.memories] == [row(f) for f in reply.facts]
            assert any("Miso" in m.text for m in got.memories)
            figures = (got.ttft_s, got.prompt_tokens, got.injected_tokens, got.computed_tokens)
            assert figures == (
                result.ttft_s,
                result.prompt_tokens,
                result.injected_tokens,
                result.computed_tokens,
            )
            assert (got.prefix_cached_tokens, got.refused) == (
                result.prefix_cached_tokens,
                result.refused,
            )
            if mode == "inject":
                cat = next(m for m in got.memories if "Miso" in m.text)
                assert cat.how == "injected" and cat.tier in ("device", "host", "disk")
                assert got.injected_tokens > 0
        unlogged = session.ask_all(conversation, "Thanks!", log=False)
        assert unlogged.assistant_turn_id is None

        session.forget(cat.fact_id)
        turns = [tid for tid, _ in log.conversation_turns(conversation)]
        for got in log.reply_details(turns).values():
            memory = next(m for m in got.memories if m.fact_id == cat.fact_id)
            assert memory.text == "" and memory.forgotten
    finally:
        session.close()
