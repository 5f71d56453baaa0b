"""``bench recall`` end to end on a fixture of our own (``tests/fixtures/recall_mini.json``).

The fixture is written for this repository in LoCoMo's JSON shape (no LoCoMo text): two short
invented conversations (24 turns) and 16 questions of every category, among them one with no
evidence, one naming a turn that does not exist, evidence ids spelt as LoCoMo sometimes does
("D1:9; D2:4", "D:2:5"), one whose only evidence turn is too short to become a fact, and one
(Pixel's limping) whose keyword is only in the turn before its answer.

Real SQLite fact log, the product's importer and extractor, the real MiniLM embedder, the
retriever in every mode: the scores it reports are checked against what the fixture was built
to show (a question only BM25 and its search context find, a question whose evidence the
extractor drops, unanswerable questions left out), and the command line prints and saves them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import recall
from bench.locomo_data import CATEGORIES, load, questions
from bench.recall_memory import CachedEmbedder, build_memory
from inferscale_core.factlog import FactLog
from inferscale_core.retriever import MODES, Retriever
from tests.support import REPO

MINI = REPO / "tests" / "fixtures" / "recall_mini.json"
KS = (1, 2, 50)  # 50 > the fixture's facts: every fact comes back
KEYWORD_ONLY = "What did Kai say about Pixel's limping?"  # evidence D2:5 of mini-2
FILLER = "How did Ben answer about Quinlivan?"  # evidence "Haha, sure!": no fact


@pytest.fixture(scope="module")
def result(minilm) -> dict[str, Any]:
    return recall.run_recall(
        MINI, minilm, ks=KS, latency_facts=40, latency_queries=12, latency_ks=(3, 10)
    )


@pytest.fixture
def memory(tmp_path, minilm):
    cached = CachedEmbedder(minilm)
    with FactLog.open(tmp_path / "facts.db") as log:
        yield build_memory(log, MINI, cached), Retriever(log, cached), cached


def asked(text: str):
    return next(q for q in questions(load(MINI)) if q.question == text)


def test_evidence_ids_read_locomos_odd_spellings():
    raw = ["D8:6; D9:17", "D:11:26", "D30:05", "D", "D4:4 D4:6"]
    assert recall.evidence_ids(raw) == {"D8:6", "D9:17", "D11:26", "D30:5", "D4:4", "D4:6"}
    assert recall.evidence_ids([]) == set()


def test_counts_every_category_and_leaves_out_the_unanswerable(result):
    # 15 questions of categories 1-4 (the adversarial one is not asked); 2 name no turn of
    # their conversation (no evidence; "D9:99"), "D:2:5" and "D1:9; D2:4" do
    assert result["unanswerable"] == 2
    expected = {"overall": 13, "multi-hop": 3, "temporal": 3, "open-domain": 1, "single-hop": 6}
    assert result["questions"] == expected
    names = {"overall", *CATEGORIES.values()}
    assert set(result["recall"]) == set(MODES)
    for by_category in result["recall"].values():
        assert set(by_category) == names
        for row in by_category.values():
            assert set(row) == {str(k) for k in KS}
            assert all(0.0 <= v <= 1.0 for v in row.values())
    assert result["samples"] == 2 and result["turns"] == 24
    # the extractor drops greetings and questions: fewer facts than turns
    assert 0 < result["facts"] < result["turns"]
    assert result["retriever"]["RRF_K"] > 0 and result["retriever"]["CONTEXT_TURNS"] > 0


def test_recall_at_every_fact_is_the_extraction_ceiling(result):
    # one question's only evidence turn ("Haha, sure!") makes no fact: 12 of 13 reachable
    assert result["ceiling"]["overall"] == pytest.approx(12 / 13, abs=1e-4)
    assert result["ceiling"]["multi-hop"] == pytest.approx(2 / 3, abs=1e-4)
    for mode in ("hybrid", "dense"):  # k=50 returns every fact of the profile
        assert result["recall"][mode]["overall"]["50"] == result["ceiling"]["overall"]
    for mode in MODES:
        row = result["recall"][mode]["overall"]
        assert row["1"] <= row["2"] <= row["50"] <= result["ceiling"]["overall"]


def test_only_bm25_and_the_search_context_find_the_limping_question(memory):
    mem, retriever, cached = memory
    question = asked(KEYWORD_ONLY)
    (evidence,) = [
        f
        for f in mem.log.active_facts(mem.profiles["mini-2"])
        if mem.turn_ids[f.profile_id]["D2:5"] in f.source_turn_ids
    ]
    assert "limp" not in evidence.text.lower()  # the word is in the turn before it
    got = recall.score(mem, retriever, [question], (1, 2, 3), MODES, cached)["recall"]
    assert got["dense"]["overall"] == {"1": 0.0, "2": 0.0, "3": 1.0}
    assert got["keyword"]["overall"]["1"] == got["hybrid"]["overall"]["1"] == 1.0


def test_a_question_whose_evidence_made_no_fact_is_never_a_hit(memory):
    mem, retriever, cached = memory
    got = recall.score(mem, retriever, [asked(FILLER)], (50,), MODES, cached)
    assert got["questions"]["overall"] == 1 and got["ceiling"]["overall"] == 0.0
    assert all(got["recall"][mode]["overall"]["50"] == 0.0 for mode in MODES)


def test_the_embedder_is_asked_once_per_text(memory, minilm):
    mem, retriever, cached = memory
    before = cached.embedded
    assert before == mem.facts + mem.skipped_near_duplicates  # facts embedded in one pass
    recall.score(mem, retriever, questions(load(MINI)), (1, 5), MODES, cached)
    recall.score(mem, retriever, questions(load(MINI)), (1, 5), MODES, cached)
    assert cached.embedded - before == len({q.question for q in questions(load(MINI))})
    text = "I keep bees"
    cached.alias("copy of bees", text)
    assert cached.embed(["copy of bees"]).equal(cached.embed([text]))
    assert cached.embed([text]).allclose(minilm.embed([text]), atol=1e-4)


def test_latency_is_timed_at_the_asked_size(result):
    latency = result["latency"]
    assert latency["facts"] == 40 and latency["queries"] == 12 and latency["k"] == [3, 10]
    assert latency["idle_ms"] == 0  # back to back unless --latency-idle-ms says otherwise
    assert set(latency["ms"]) == {"3", "10"}
    for by_mode in latency["ms"].values():
        assert set(by_mode) == {*MODES, "embed"}
        for ms in by_mode.values():
            assert 0 < ms["p50_ms"] <= ms["p90_ms"]
        # a search embeds the question too: never faster than embedding alone
        assert by_mode["hybrid"]["p50_ms"] >= by_mode["embed"]["p50_ms"] * 0.5


def test_markdown_and_headline(result):
    table = recall.markdown(result)
    assert "| mode | category | questions | R@1 | R@2 | R@50 |" in table
    for mode in MODES:
        assert f"| {mode} | overall | 13 |" in table and f"| {mode} | temporal | 3 |" in table
    assert "Search latency at 40 facts" in table and "| 10 | hybrid |" in table
    assert "each after 0 ms idle" in table
    line = recall.headline(result)
    assert "over 13 questions" in line and all(mode in line for mode in MODES)


def test_the_command_prints_and_saves_the_table(tmp_path: Path, capsys):
    from app.cli import main

    out = tmp_path / "recall.json"
    argv = ["bench", "recall", "--data", str(MINI), "--k", "2,1", "--modes", "hybrid,dense"]
    assert main([*argv, "--latency-facts", "0", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["bench"] == "recall" and saved["ks"] == [1, 2] and saved["latency"] is None
    assert set(saved["recall"]) == {"hybrid", "dense"}
    assert saved["questions"]["overall"] == 13
    printed = capsys.readouterr().out
    assert "| hybrid | overall | 13 |" in printed and "| keyword |" not in printed
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--latency-idle-ms", "-1"])
    assert refused.value.code == 2
    assert "--latency-idle-ms need numbers >= 0" in capsys.readouterr().err
