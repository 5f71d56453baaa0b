"""``memory search``: the product's retrieval from the shell, over a real fact-log file and the
real MiniLM embedder, run in-process like the other ``memory`` commands (and without vLLM).

The right fact comes first with the turn it came from, keyword and dense rank a paraphrase
differently, ``--at`` leaves out what was remembered later, k comes from the settings, and bad
input is refused by argparse (exit 2) with a line that says why.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime

import pytest

from app import cli
from app.commands import memory as memory_cmd
from inferscale_core import paths
from inferscale_core.factlog import FactLog
from inferscale_core.factlog import facts as facts_module
from inferscale_core.retriever import MODES
from inferscale_core.types import Conversation, Turn

FACTS = [  # (text, the day it was remembered, the user's turn it came from or None)
    (
        "My sister Ines moved to Lisbon in March 2024",
        "2024-03-10",
        "Big news: my sister Ines moved to Lisbon in March 2024, she loves the tiles.",
    ),
    ("I work as a nurse at the city hospital", "2024-01-05", None),
    ("The living room needs new curtains", "2024-02-01", None),
    ("I adopted a grey cat named Miso", "2023-05-08", None),
    ("My cousin Pedro has a flat in Madrid", "2024-04-02", None),
    ("I play the cello in an amateur orchestra", "2024-04-20", None),
    ("I adopted a second cat named Tofu", "2025-02-01", None),
    ("My best friend Tomas works at a bookshop", "2024-06-11", None),
]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh INFERSCALE_HOME with the facts above, each created on its day; the Lisbon fact
    extracted from a turn of a conversation called "Family news"."""
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "250")
    ids = {}
    with FactLog.open(paths.memory_db()) as log, pytest.MonkeyPatch.context() as clock:
        pid = log.profile("default")
        for text, day, said in FACTS:
            turns = []
            if said is not None:
                when = datetime.fromisoformat(f"{day}T09:30:00+00:00")
                cid, _ = log.add_conversation(
                    pid, Conversation("Family news", [Turn("user", said, when)])
                )
                turns = [tid for tid, _ in log.conversation_turns(cid)]
            stamp = f"{day}T12:00:00.000000+00:00"  # created that day (the log's clock)
            clock.setattr(facts_module, "utc_now", lambda stamp=stamp: stamp)
            ids[text.split()[-1]], _ = log.add_fact(pid, text, source_turn_ids=turns)
    return ids


def _search(capsys, *argv: str) -> list[dict]:
    code = cli.main(["memory", "search", *argv, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_the_lisbon_fact_comes_first_with_its_source_turn(home, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # no engine: importing vLLM would fail
    hits = _search(capsys, "where does Ines live", "--k", "3")
    assert [h["rank"] for h in hits] == [1, 2, 3]
    best = hits[0]
    assert best["id"] == home["2024"] and best["text"].endswith("Lisbon in March 2024")
    assert best["status"] == "active" and best["superseded_by"] is None
    assert best["created_at"].startswith("2024-03-10")
    assert 0 < best["score"] <= 1 and best["score"] >= hits[1]["score"] >= hits[2]["score"]
    source = best["source"]
    assert source["conversation"] == "Family news" and source["speaker"] == "user"
    assert source["timestamp"] == "2024-03-10T09:30:00+00:00"
    assert source["excerpt"].startswith("Big news: my sister Ines moved to Lisbon")
    assert source["turn_id"] == best["source_turn_ids"][0]
    assert hits[1]["source"] is None  # added by hand


def test_keyword_and_dense_rank_a_paraphrase_differently(home, capsys):
    question = "What do I do for a living?"  # no word of the nurse fact; "living" of curtains
    keyword = _search(capsys, question, "--k", "3", "--mode", "keyword")
    dense = _search(capsys, question, "--k", "3", "--mode", "dense")
    assert keyword[0]["id"] == home["curtains"]
    assert home["hospital"] not in [h["id"] for h in keyword]  # BM25 cannot see a paraphrase
    assert dense[0]["id"] == home["hospital"]
    assert -1 <= dense[-1]["score"] <= dense[0]["score"] <= 1  # cosine


def test_at_leaves_out_what_was_remembered_later(home, capsys):
    now = _search(capsys, "What are my cats called?", "--k", "2")
    assert {h["id"] for h in now} == {home["Miso"], home["Tofu"]}
    for mode in MODES:
        then = _search(capsys, "What are my cats called?", "--k", "2", "--at", "2024-12-31",
                       "--mode", mode)  # fmt: skip
        assert then[0]["id"] == home["Miso"], mode
        assert home["Tofu"] not in [h["id"] for h in then], mode
    everything = _search(capsys, "Ines", "--k", "50", "--mode", "dense")
    assert len(everything) == len(FACTS)
    early = _search(capsys, "Ines", "--k", "50", "--mode", "dense", "--at", "2024-03-31")
    assert {h["id"] for h in early} == {home[key] for key in ("2024", "hospital", "curtains",
                                                              "Miso")}  # fmt: skip
    assert all(h["created_at"] < "2024-04" for h in early)


def test_k_defaults_to_the_settings(home, capsys):
    paths.config_file().write_text("k = 2\n")
    assert len(_search(capsys, "Ines")) == 2
    paths.config_file().write_text("k = 0\n")
    code = cli.main(["memory", "search", "Ines"])
    assert code == 2 and "pass --k N" in capsys.readouterr().err


def test_the_table_shows_rank_score_date_validity_and_source(home, capsys):
    with FactLog.open(paths.memory_db()) as log:
        new = log.update_fact(home["Madrid"], "My cousin Pedro has a flat in Valencia", "moved")
        assert log.successors([home["Madrid"]]) == {home["Madrid"]: new}
    code = cli.main(["memory", "search", "Where does my cousin live?", "--k", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "2 memories for 'Where does my cousin live?' (hybrid, k=2)" in out
    assert f"replaces #{home['Madrid']}" in out and "Valencia" in out and "Madrid" not in out
    code = cli.main(["memory", "search", "Ines Lisbon", "--k", "1"])
    out = capsys.readouterr().out
    assert "Family news · user · 2024-03-10 09:30" in out and "Big news" in out


def test_another_profile_sees_none_of_these(home, capsys):
    assert _search(capsys, "Ines", "--k", "5", "--profile", "someone-else") == []


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--k", "0"), "k must be a whole number >= 1, got '0'"),
        (("--k", "-3"), "k must be a whole number >= 1, got '-3'"),
        (("--k", "many"), "k must be a whole number >= 1, got 'many'"),
        (("--mode", "fuzzy"), "invalid choice: 'fuzzy'"),
        (("--at", "2024-13-01"), "not a date YYYY-MM-DD: '2024-13-01'"),
        (("--at", "yesterday"), "not a date YYYY-MM-DD: 'yesterday'"),
    ],
)
def test_bad_input_exits_2_and_says_why(argv, says, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["memory", "search", "Ines", *argv])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "usage: inferscale-assistant memory search" in err and says in err


def test_the_modes_are_the_retrievers():
    assert memory_cmd.SEARCH_MODES == MODES


def test_a_replaced_fact_shows_until_when_it_held(home, capsys):
    with FactLog.open(paths.memory_db()) as log:
        pid = log.profile("default")
        old, _ = log.add_fact(pid, "I live in Lisbon with my partner", "2022-04-02")
        new, _ = log.add_fact(pid, "We moved to Porto with the kids", "2025-03-08")
        while log.read_slots(pid)[0]:
            pass
    hits = _search(capsys, "Where do I live?", "--k", "3")
    assert hits[0]["id"] == new and hits[0]["valid_until"] is None
    lisbon = next(h for h in hits if h["id"] == old)
    assert (lisbon["valid_until"], lisbon["ended_by"]) == ("2025-03-08", new)
    then = _search(capsys, "Where did I live in 2023?", "--k", "3")
    assert then[0]["id"] == old
    code = cli.main(["memory", "search", "Where do I live?", "--k", "3"])
    out = capsys.readouterr().out
    assert code == 0 and f"true until 2025-03-08, replaced by #{new}" in out
