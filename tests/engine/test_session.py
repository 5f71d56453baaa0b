"""The chat loop on the real engine: facts appear, get encoded in the background, and a later
question retrieves and injects them; forgetting removes a fact everywhere for good."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from inferscale_core import wiring
from inferscale_core.config import AppConfig
from inferscale_core.extractor import DeterministicExtractor
from inferscale_core.session import SessionConfig
from inferscale_core.types import Conversation, Turn

pytestmark = pytest.mark.engine

SCRIPT = [
    "hi there!",
    "I adopted a grey cat named Miso from the shelter last week.",
    "ok thanks",
    "My sister Ana moved to Lisbon for a job in biotech.",
    "What's the capital of Peru?",
    "I started learning the cello and I practise every morning.",
    "lol",
    "Our team shipped the billing service rewrite in Rust yesterday.",
    "I ran my first half marathon in 1 hour 52 minutes.",
    "cool",
    "My favourite food is my grandmother's mushroom risotto.",
    "I'm allergic to peanuts, so I always check labels.",
    "haha ok",
    "We are planning a trip to the fjords in Norway next summer.",
    "My partner Sam works as a paediatric nurse at the city hospital.",
    "What time is it in Tokyo?",
    "I bought a second-hand road bike for commuting to work.",
    "I don't like horror movies at all.",
    "thanks!",
    "My best friend Jun lives in Osaka and teaches chemistry.",
    "I've been reading a book about Roman roads this month.",
    "Our flat has a small balcony where I grow tomatoes.",
    "okay",
    "I switched from coffee to green tea in January.",
    "My laptop is a ten year old ThinkPad that still works fine.",
    "I volunteer at the food bank on Saturday mornings.",
    "hmm",
    "My daughter Lia turns six in October and loves dinosaurs.",
    "I'm learning Portuguese to talk with Ana's new friends.",
    "good night",
]


@pytest.fixture(scope="module")
def session(runtime, minilm, tmp_path_factory):
    config = SessionConfig(k=5, w=2, max_tokens=8, history_turns=2)
    session = wiring.open_session(
        runtime,
        AppConfig(),
        tmp_path_factory.mktemp("memory") / "memory.db",
        embedder=minilm,
        extractor=DeterministicExtractor(),
        session_config=config,
    )
    yield session
    session.close()


def _cat_fact(session):
    facts = [f for f in session.factlog.active_facts(session.profile_id) if "Miso" in f.text]
    assert len(facts) == 1, facts
    return facts[0]


def test_scripted_conversation_injects_remembered_facts(session, runtime):
    conversation = session.new_conversation("scripted")
    for text in SCRIPT:
        reply = session.ask_all(conversation, text)
        assert reply.assistant_turn_id is not None
    assert session.worker.wait_idle(timeout=300), session.worker.stats
    stats = session.worker.stats
    assert stats.errors == 0, stats.last_error
    assert stats.pending_facts == 0 and stats.pending_turns == 0
    facts = session.factlog.active_facts(session.profile_id)
    assert 18 <= len(facts) <= 22  # the substantive turns; small talk and questions are not facts
    assert stats.encoded_facts == len(facts)
    # the chat's searches and the worker's embeddings take turns on the runtime's one thread
    assert session.retriever.thread is session.worker._retriever.thread is runtime.retrieval

    reply = session.ask_all(conversation, "What is the name of my cat?")
    cat = _cat_fact(session)
    assert cat.id in reply.injected_fact_ids
    assert reply.result.injected_tokens > 0 and reply.result.refused is None
    assert all(f.how == "injected" for f in reply.facts)  # everything was encoded by now
    assert {f.tier for f in reply.facts} <= {"device", "host", "disk"}
    print(f"answer: {reply.text!r}; injected facts: {reply.injected_fact_ids}")


def test_the_best_hits_can_be_recomputed_after_the_injected_ones(session):
    """r of the k hits (the best) go in as text after the injected span and are prefilled
    with the question; r = k leaves nothing injected past the system prefix."""
    conversation = session.new_conversation("recompute")
    question = "What is the name of my cat?"
    prefix = len(session.builder.layout.prefix_ids)
    try:
        session.config.recompute = 2
        reply = session.ask_all(conversation, question)
        hows = [f.how for f in reply.facts]
        assert hows.count("recomputed") == 2 and hows.count("injected") == len(hows) - 2
        # the best two by rank, last in the prompt (best_last); not by score: a question
        # about the present ("my cat" is the pet facet) puts the newest of its facet first
        # whatever its fused score
        best = reply.facts[-2:]
        assert {f.how for f in best} == {"recomputed"}
        # the injected facts' KV: loaded now, or found in vLLM's prefix cache (asked before)
        assert reply.result.cached_tokens > prefix and reply.result.refused is None
        session.config.recompute = session.config.k
        reply = session.ask_all(conversation, question)
        assert {f.how for f in reply.facts} == {"recomputed"}
        assert reply.result.injected_tokens <= prefix  # the prefix at most: no fact's KV
    finally:
        session.config.recompute = 0


QUERIES = [
    "What is the name of my cat?",
    "Tell me about my pet.",
    "Which animal did I adopt?",
    "Do I have a cat?",
    "What colour is Miso?",
    "Where did my cat come from?",
    "What pets do I have?",
    "Remind me about the shelter.",
    "Miso",
    "my grey cat",
]


def test_forgotten_fact_is_never_retrieved_or_injected_again(session):
    cat = _cat_fact(session)
    keys = session.factlog.kv_keys(cat.id)
    assert keys and all(session.builder.store.has(k) for k in keys)
    queries = [f"{q} ({i})" for i in range(10) for q in QUERIES]  # 100 queries
    assert any(
        cat.id in [h.fact.id for h in session.retriever.search(session.profile_id, q, 5)]
        for q in queries[:10]
    )
    session.forget(cat.id)
    for query in queries:
        hits = session.retriever.search(session.profile_id, query, 5)
        assert cat.id not in [h.fact.id for h in hits]
    conversation = session.new_conversation("after forgetting")
    for query in queries[:5]:
        reply = session.ask_all(conversation, query)
        assert cat.id not in [f.fact_id for f in reply.facts]
    for key in keys:
        assert not session.builder.store.has(key)
        assert session.builder.store.where(key) == []
    assert session.factlog.kv_keys(cat.id) == []
    assert [a.action for a in session.factlog.audit(session.profile_id, cat.id)][-1] == "forget"


def test_changed_encoding_is_never_injected_until_reencoded(session):
    """After a change of encoding (here w and the window; a new model fingerprint works the
    same way) the old entries are stale: facts go in as text until the worker has re-encoded
    them."""
    conversation = session.new_conversation("re-encoding")
    question = "Where does my sister live now?"
    new_w = session.config.w + 1
    assert session.config.window == session.worker.window == "anchored"
    session.worker.pause()
    try:
        session.config.w = session.worker.w = new_w
        session.config.window = session.worker.window = "sliding"
        assert session.encoding == session.worker.encoding == "engine-capture/1"
        reply = session.ask_all(conversation, question)
        assert reply.facts and reply.injected_fact_ids == []
        assert all(f.how == "text" for f in reply.facts)
    finally:
        session.worker.resume()
    assert session.worker.wait_idle(timeout=300), session.worker.stats
    reply = session.ask_all(conversation, question)
    assert reply.facts and all(f.how == "injected" for f in reply.facts)
    assert reply.result.injected_tokens > 0


def test_wait_idle_never_returns_while_a_logged_turn_is_pending(session):
    """A batch that found nothing must not declare the worker idle if new work was logged (and
    the worker woken) while it looked. Here the worker is held right after such a batch looked
    at the log; a turn is logged and ``wait_idle`` starts; the worker is let go, and its next
    batch is held at the door: ``wait_idle`` must still be waiting then."""
    worker = session.worker
    assert worker.wait_idle(timeout=300), worker.stats
    extract, wake = worker._extract_batch, worker.wake
    held, release, door, woken = (threading.Event() for _ in range(4))
    calls = []

    def held_extract(factlog):
        calls.append(1)
        if len(calls) == 1:  # the batch that looks before the turn is logged
            found = extract(factlog)
            held.set()
            assert release.wait(60)
            return found
        if len(calls) == 2:  # the next one waits until the test has looked
            assert door.wait(60)
        return extract(factlog)

    def telling_wake():
        wake()
        woken.set()

    worker._extract_batch = held_extract
    try:
        wake()
        assert held.wait(60)
        text = "I keep a sourdough starter called Bubbles in the fridge."
        turn = Turn("user", text, datetime.now(UTC))
        session.factlog.add_conversation(session.profile_id, Conversation("late", [turn]))
        worker.wake = telling_wake
        result: list[bool] = []
        waiting = threading.Thread(target=lambda: result.append(worker.wait_idle(timeout=300)))
        waiting.start()
        assert woken.wait(60)
        release.set()
        waiting.join(2.0)  # the turn cannot have been extracted yet: the next batch is held
        returned_early = not waiting.is_alive()
        door.set()
        waiting.join(310)
    finally:
        worker._extract_batch, worker.wake = extract, wake
        release.set()
        door.set()
    assert not returned_early, "wait_idle returned before the worker had looked at the new turn"
    assert result == [True]
    pending = session.factlog.turns(
        session.profile_id, after_id=session.factlog.extraction_cursor(session.profile_id)
    )
    assert pending == []
