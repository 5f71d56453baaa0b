"""The desk every door uses, on the real engine and a real fact log: find-or-create a
conversation, ask with per-reply settings (streamed across its thread), ask with ad-hoc facts,
wait until told facts are remembered, add / search / forget, import and wake."""

from __future__ import annotations

import json

import pytest

from inferscale_core import wiring
from inferscale_core.composer import TurnRejected
from inferscale_core.config import AppConfig
from inferscale_core.desk import Desk, fact_json, reply_json
from inferscale_core.embedder import SentenceTransformerEmbedder
from inferscale_core.extractor import DeterministicExtractor
from inferscale_core.factlog import FactLog
from inferscale_core.session import INJECTED, RECOMPUTED, TEXT, SessionConfig

pytestmark = pytest.mark.engine

TOLD = "My sister Ines moved to Lisbon in March 2024."


@pytest.fixture(scope="module")
def desk(runtime, tmp_path_factory):
    db_path = tmp_path_factory.mktemp("desk") / "memory.db"
    settings = SessionConfig(k=5, w=2, max_tokens=8, history_turns=2)
    desk = Desk(
        db_path,
        "default",
        lambda on_step: wiring.open_session(
            runtime,
            AppConfig(),
            db_path,
            embedder=SentenceTransformerEmbedder(),
            extractor=DeterministicExtractor(),
            session_config=settings,
        ),
    )
    desk.start().result()
    yield desk
    desk.close()


def _ask(desk: Desk, question: str, **options) -> tuple[list[str], dict]:
    deltas, reply = [], None
    for delta, reply in desk.ask(question, **options):  # noqa: B007 - the last is finished
        deltas.append(delta)
    assert reply is not None and deltas[-1] == ""
    return deltas, reply_json(reply)


def test_a_conversation_is_found_by_source_and_kept_after_a_rename(desk):
    first = desk.conversation("shell")
    desk.read(lambda log, pid: log.rename_conversation(first, "my shell")).result()
    assert desk.conversation("shell") == first
    assert desk.conversation("api") != first
    titles = {c["id"]: c["title"] for c in desk.recent_conversations()}
    assert titles[first] == "my shell"
    json.dumps(desk.recent_conversations())  # plain data


def test_told_turns_are_remembered_and_injected_by_the_next_ask(desk):
    shell = desk.conversation("shell")
    deltas, told = _ask(desk, TOLD, conversation_id=shell)
    assert "".join(deltas).strip() == told["text"] and told["user_turn_id"] is not None
    turns = [told["user_turn_id"], told["assistant_turn_id"]]
    assert desk.wait_remembered(turns, 300)
    assert desk.call(lambda s: s.worker.stats.errors) == 0
    _, asked = _ask(desk, "Where does my sister live?", log=False, recompute=0)
    lisbon = [f for f in asked["facts"] if "Lisbon" in f["text"]]
    assert [f["how"] for f in lisbon] == [INJECTED], asked["facts"]
    assert asked["injected_tokens"] > 0 and asked["user_turn_id"] is None


def test_k_mode_and_recompute_apply_to_one_reply_only(desk):
    before = desk.call(lambda s: (s.config.k, s.config.mode, s.config.recompute))
    _, default = _ask(desk, "Where does my sister live?", log=False)
    _, none = _ask(desk, "Where does my sister live?", log=False, k=0)
    assert default["facts"] and none["facts"] == []
    assert none["injected_tokens"] < default["injected_tokens"]  # the system prompt's only
    _, prompt = _ask(desk, "Where does my sister live?", log=False, mode="prompt")
    assert prompt["mode"] == "prompt" and {f["how"] for f in prompt["facts"]} == {TEXT}
    _, best = _ask(desk, "Where does my sister live?", log=False, recompute=1)
    assert [f["how"] for f in best["facts"]][:1] == [RECOMPUTED]
    assert desk.call(lambda s: (s.config.k, s.config.mode, s.config.recompute)) == before


def test_ad_hoc_facts_answer_alone_and_log_nothing(desk):
    count = desk.read(lambda log, pid: len(log.turns(pid))).result()
    _, reply = _ask(desk, "What is my cat called?", facts=[("I adopted a cat named Miso.", None)])
    assert [(f["text"], f["how"], f["score"]) for f in reply["facts"]] == [
        ("I adopted a cat named Miso.", INJECTED, None)
    ]
    assert isinstance(reply["facts"][0]["id"], str)  # its KV key
    assert desk.read(lambda log, pid: len(log.turns(pid))).result() == count
    with pytest.raises(TurnRejected):
        _ask(desk, "  ", facts=[("I keep bees.", "2024-03-01")])


def test_closing_the_stream_early_stops_the_reply_and_the_desk_goes_on(desk):
    stream = desk.ask("Tell me a long story about the sea.", log=False)
    next(stream)
    stream.close()
    _, reply = _ask(desk, "Hello", log=False)  # the desk's thread is free again
    assert reply["text"]


def test_a_fact_added_is_searchable_with_its_date_and_forgotten_for_good(desk):
    fact = desk.add_fact("I keep bees on the roof.", "2024-03-01")
    assert (fact["text"], fact["refers_to"], fact["status"]) == (
        "I keep bees on the roof.",
        "2024-03-01",
        "active",
    )
    hits = desk.search("Do I keep any animals on the roof?", k=3)
    assert hits[0]["id"] == fact["id"] and hits[0]["rank"] == 1 and hits[0]["score"] > 0
    assert desk.forget(fact["id"]) is True
    assert desk.forget(fact["id"]) is False  # no longer active
    assert fact["id"] not in [h["id"] for h in desk.search("bees on the roof", k=3)]


def test_an_import_adds_its_turns_and_wakes_the_worker(desk, tmp_path):
    export = tmp_path / "trip.jsonl"
    lines = [
        {"role": "user", "content": "I booked a trip to Kyoto for April."},
        {"role": "assistant", "content": "Lovely, enjoy the cherry blossoms!"},
    ]
    export.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    report = desk.import_path(export, tmp_path / "inbox")
    assert [(f.status, f.turns_added) for f in report.files] == [("imported", 2)]
    assert "trip" in [c["title"] for c in desk.recent_conversations()]
    assert desk.call(lambda s: s.worker.wait_idle(300))  # woken: extracted now
    assert any("Kyoto" in f["text"] for f in desk.search("Where am I travelling in April?"))


def test_one_json_form_of_a_fact(tmp_path):
    with FactLog.open(tmp_path / "memory.db") as log:
        pid = log.profile("default")
        old, _ = log.add_fact(pid, "I live in Porto.")
        new = log.update_fact(old, "I live in Lisbon.", "moved")
        fact = log.get_fact(old)
    plain = fact_json(fact)
    assert plain["id"] == old and plain["status"] == fact.status
    assert "source_turn_ids" in plain
    public = fact_json(fact, lambda fact_id: fact_id + 1000)
    assert public["id"] == old + 1000 and "source_turn_ids" not in public
    assert set(public) == set(plain) - {"source_turn_ids"}
    assert new != old
