"""``bench updates`` and the life set it asks (``bench/data/life.json``, issue 36).

The set is loaded and checked as shipped, and broken copies of it (an evidence id that names no
turn, an interval whose end comes first, ...) are refused with the bad item named. The bench runs
end to end on the real set in one mode: real SQLite fact log, the product's extractor, the real
MiniLM embedder and retriever; its figures are shares and agree with each other. The scoring itself
is checked on a tiny set written here, where the answer is known: a question whose evidence is
the turn its words come from is a hit at 1; one pointed at another turn is not.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bench import life_set, updates
from bench.recall_memory import CachedEmbedder
from inferscale_core.embedder import SentenceTransformerEmbedder
from inferscale_core.factlog import FactLog
from inferscale_core.retriever import MODES, Retriever

# fmt: off
TINY: dict[str, Any] = {
    "name": "tiny",
    "asked_at": "2025-06-01T12:00:00+00:00",
    "sessions": [
        {"id": "S1", "at": "2024-01-02T18:00:00+00:00", "turns": [
            {"id": "S1:1", "speaker": "user", "text": "My sister Ana is a vet in Coimbra."},
            {"id": "S1:2", "speaker": "user", "text": "I drive a red Fiat Panda to work."},
            {"id": "S1:3", "speaker": "user", "text": "Can you suggest a recipe with lentils?"},
            {"id": "S1:4", "speaker": "user", "date": "2024-01-01",
             "text": "I went to the dentist yesterday, no cavities."},
        ]},
        {"id": "S2", "at": "2025-03-10T18:00:00+00:00", "turns": [
            {"id": "S2:1", "speaker": "user",
             "text": "I sold the Panda and bought a blue Volvo estate."},
            {"id": "S2:2", "speaker": "assistant", "text": "Congratulations on the new car!"},
        ]},
    ],
    "questions": [
        {"id": "F1", "category": "single", "question": "What does my sister Ana do?",
         "evidence": ["S1:1"]},
        # a control: the same question pointed at another turn is no hit at 1
        {"id": "R1", "category": "paraphrase", "question": "What does my sister Ana do?",
         "evidence": ["S1:2"]},
        {"id": "U1", "category": "update", "question": "Which car do I drive?",
         "current": ["S2:1"], "superseded": ["S1:2"]},
        {"id": "M1", "category": "month", "question": "What did I do in January 2024?",
         "interval": ["2024-01-01", "2024-02-01"], "evidence": ["S1:4"]},
    ],
}
# fmt: on


@pytest.fixture(scope="module")
def minilm() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


@pytest.fixture(scope="module")
def result(minilm) -> dict[str, Any]:
    return updates.run_updates(life_set.load(), minilm, modes=("hybrid",))


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "set.json"
    path.write_text(json.dumps(data))
    return path


# ---- the set ---------------------------------------------------------------------------------


def test_the_set_loads_as_written():
    life = life_set.load()
    assert life.name == "life" and len(life.sessions) == 46
    user_turns = [t for t in life.turns.values() if t.speaker == "user"]
    assert 220 <= len(user_turns) <= 260
    by_category = {c: [q for q in life.questions if q.category == c] for c in life_set.CATEGORIES}
    assert {c: len(qs) for c, qs in by_category.items()} == {
        "update": 22, "past": 11, "month": 12, "paraphrase": 20, "people": 8, "single": 11,
    }  # fmt: skip
    assert all(q.superseded for q in by_category["update"])
    assert all(q.interval for q in by_category["month"])
    assert len(life.labelled()) >= 35
    # every session's time is aware, the sessions in order, two years long
    times = [s.at for s in life.sessions]
    assert times == sorted(times) and times[0].year == 2024 and times[-1].year == 2025
    # the product's conversations: one per session, each turn's id kept as its source_id
    conversations = list(life.to_conversations())
    assert [c.source_id for c in conversations] == [f"life/{s.id}" for s in life.sessions]
    ids = [t.source_id for c in conversations for t in c.turns]
    assert ids == list(life.turns) and conversations[0].turns[0].timestamp == times[0]


def test_a_labelled_day_is_the_events_day_not_the_day_it_was_said():
    turns = life_set.load().turns
    moved = turns["S7:1"]  # "We finally moved to Porto last weekend!" on Monday 25 March
    assert moved.at.date().isoformat() == "2024-03-25" and moved.day.isoformat() == "2024-03-23"
    assert turns["S7:2"].date is None and turns["S7:2"].day == turns["S7:2"].at.date()


BROKEN = [
    ("evidence id", lambda d: d["questions"][0]["evidence"].append("S1:9"), "F1.*'S1:9'"),
    (
        "unordered interval",
        lambda d: d["questions"][3].update(interval=["2024-02-01", "2024-01-01"]),
        "M1: interval .2024-02-01, 2024-01-01. is not ordered",
    ),
    ("category", lambda d: d["questions"][1].update(category="trivia"), "R1: category"),
    ("assistant evidence", lambda d: d["questions"][2]["current"].append("S2:2"), "U1.*assistant"),
    (
        "current and superseded",
        lambda d: d["questions"][2]["superseded"].append("S2:1"),
        "U1: S2:1 in both",
    ),
    ("day", lambda d: d["sessions"][0]["turns"][3].update(date="2024-13-01"), "S1:4.*ISO day"),
    ("naive time", lambda d: d["sessions"][1].update(at="2025-03-10T18:00:00"), "S2.*UTC offset"),
    ("turn id", lambda d: d["sessions"][1]["turns"][0].update(id="S1:5"), "S1:5.*'S2:<n>'"),
    ("unknown key", lambda d: d["questions"][0].update(evidance=["S1:1"]), "F1.*'evidance'"),
    (
        "month outside",
        lambda d: d["questions"][3].update(evidence=["S2:1"]),
        "M1: evidence S2:1 is about 2025-03-10, outside",
    ),
    (
        "asked before",
        lambda d: d["questions"][2].update(asked_at="2024-06-01T12:00:00+00:00"),
        "U1.*S2:1.*after the question was asked",
    ),
]


@pytest.mark.parametrize(("what", "breaks", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_set_is_refused_naming_the_item(tmp_path, what, breaks, message):
    data = copy.deepcopy(TINY)
    life_set.load(write(tmp_path, data))  # whole, it loads
    breaks(data)
    with pytest.raises(ValueError, match=message):
        life_set.load(write(tmp_path, data))


@pytest.mark.parametrize(
    "path", sorted(life_set.DEFAULT.parent.glob("life*.json")), ids=lambda path: path.stem
)
def test_every_shipped_life_set_loads_whole(path):
    """The read and blind sets docs/BENCHMARKS.md reports pass the loader's checks as shipped."""
    life = life_set.load(path)
    assert life.name == path.stem and life.path == path
    asked = {q.category for q in life.questions}
    assert "update" in asked and asked <= set(life_set.CATEGORIES)
    for q in life.questions:
        if q.category == "update":
            assert q.evidence and q.superseded, q.id


def test_a_broken_copy_of_the_real_set_is_refused(tmp_path):
    data = json.loads(life_set.DEFAULT.read_text())
    bad = copy.deepcopy(data)
    bad["questions"][0]["current"] = ["S38:99"]
    with pytest.raises(ValueError, match=r"question U1: 'current' names 'S38:99'"):
        life_set.load(write(tmp_path, bad))
    bad = copy.deepcopy(data)
    month = next(q for q in bad["questions"] if q["category"] == "month")
    month["interval"].reverse()
    with pytest.raises(ValueError, match=rf"question {month['id']}: interval .* is not ordered"):
        life_set.load(write(tmp_path, bad))


# ---- the bench on the real set ---------------------------------------------------------------


def test_the_bench_runs_on_the_real_set(result):
    assert result["bench"] == "updates" and result["modes"] == ["hybrid"]
    assert result["ks"] == [1, 5, 10] and result["top"] == 10
    counts = result["questions"]
    assert counts["overall"] == 84 == sum(counts[c] for c in life_set.CATEGORIES)
    assert result["turns"] == 245 and 0 < result["facts"] <= result["user_turns"] == 230
    rows = result["recall"]["hybrid"]
    for name, row in rows.items():
        ceiling = result["ceiling"][name]
        assert 0.0 <= row["1"] <= row["5"] <= row["10"] <= ceiling <= 1.0, name
    # the current value first needs it in the top 10 at all
    first = result["update_current_first"]["hybrid"]
    assert 0.0 <= first <= rows["update"]["10"]
    assert 0.0 <= result["month_in_interval"]["hybrid"] <= 1.0
    assert result["month_scored"] <= result["month_questions"] == 12
    assert result["hybrid_minus_dense"] == {}  # one mode: nothing to subtract
    per_question = result["per_question"]["hybrid"]
    assert len(per_question) == 84
    firsts = [row["current_first"] for row in per_question.values() if "current_first" in row]
    assert len(firsts) == 22 and sum(firsts) / 22 == pytest.approx(first, abs=1e-4)
    hits_at_10 = sum(row["rank"] is not None for row in per_question.values())
    assert hits_at_10 / 84 == pytest.approx(rows["overall"]["10"], abs=1e-4)
    dates = result["extractor_dates"]
    assert dates["labelled"] == len(life_set.load().labelled())
    assert dates["with_fact"] + dates["no_fact"] == dates["labelled"]
    assert dates["right"] + len(dates["wrong"]) == dates["with_fact"]
    assert 0.0 <= dates["share"] <= 1.0
    assert result["wall_s"] >= result["build_s"] + result["search_s"] - 0.2


def test_markdown_and_headline(result):
    table = updates.markdown(result)
    assert "| mode | category | questions | ceiling | R@1 | R@5 | R@10 |" in table
    assert "| hybrid | overall | 84 |" in table and "| hybrid | update | 22 |" in table
    assert "| hybrid |" in table.split("update current first")[1]
    line = updates.headline(result)
    assert "over 84 questions" in line and "current first" in line


# ---- the scoring, on a set whose answers are known -------------------------------------------


def test_scoring_on_a_tiny_set(tmp_path, minilm):
    life = life_set.parse(copy.deepcopy(TINY))
    cached = CachedEmbedder(minilm)
    with FactLog.open(tmp_path / "facts.db") as log:
        memory = updates.build_memory(log, life, cached)
        # the request (S1:3) and the assistant (S2:2) make no fact
        made = {tid for fact in memory.facts() for tid in memory.sources(fact)}
        assert made == {"S1:1", "S1:2", "S1:4", "S2:1"}
        got = updates.score(memory, Retriever(log, cached), life, (1, 5), MODES, cached)
        dates = updates.extractor_dates(memory, life)
    for mode in MODES:
        rows = got["recall"][mode]
        assert rows["single"] == {"1": 1.0, "5": 1.0}  # Ana's question finds Ana's turn first
        assert rows["paraphrase"] == {"1": 0.0, "5": 1.0}  # ... not the car's
        assert rows["month"]["5"] == 1.0
        row = got["per_question"][mode]["U1"]
        old = row["superseded_rank"]
        assert row["current_first"] == (
            row["rank"] is not None and (old is None or row["rank"] < old)
        )
        assert got["update_current_first"][mode] == float(row["current_first"])
        if mode != "keyword":  # BM25 finds only facts sharing a word; the others rank all four
            assert row["rank"] is not None and old is not None
            # three facts of January 2024 (S1:1, S1:2, S1:4), all in the top 10: 3 / min(10, 3)
            assert got["month_in_interval"][mode] == 1.0
        assert 0.0 <= got["month_in_interval"][mode] <= 1.0
    assert got["questions"] == {
        "overall": 4, "update": 1, "past": 0, "month": 1, "paraphrase": 1, "people": 0, "single": 1,
    }  # fmt: skip
    assert got["ceiling"]["past"] is None and got["recall"]["hybrid"]["past"]["1"] is None
    assert set(got["hybrid_minus_dense"]) == set(got["questions"])
    for name, by_k in got["hybrid_vs_dense"].items():  # the pairs add up to the difference
        for k, row in by_k.items():
            n = got["questions"][name]
            if n:
                net = (row["hybrid_only"] - row["dense_only"]) / n
                assert net == pytest.approx(got["hybrid_minus_dense"][name][k], abs=1e-4)
    assert got["evidence_without_fact"] == []
    # "yesterday", said on 2 January: the extractor dates it the 1st
    assert (dates["labelled"], dates["right"], dates["no_fact"]) == (1, 1, 0)


def test_the_command_prints_and_saves_the_table(tmp_path, capsys):
    from app.cli import main

    data = write(tmp_path, copy.deepcopy(TINY))
    out = tmp_path / "updates.json"
    argv = ["bench", "updates", "--data", str(data), "--k", "5,1", "--modes", "hybrid,dense"]
    assert main([*argv, "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["bench"] == "updates" and saved["ks"] == [1, 5]
    assert set(saved["recall"]) == {"hybrid", "dense"} and saved["questions"]["overall"] == 4
    printed = capsys.readouterr().out
    assert "| hybrid | single | 1 |" in printed and "| keyword |" not in printed
    broken = copy.deepcopy(TINY)
    broken["questions"][0]["evidence"] = ["S9:1"]
    with pytest.raises(SystemExit) as refused:
        main(["bench", "updates", "--data", str(write(tmp_path, broken))])
    assert refused.value.code == 2
    assert "question F1: 'evidence' names 'S9:1'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("hybrid_only", "dense_only", "p", "worse"),
    [
        (0, 0, 1.0, False),  # no question tells the modes apart
        (0, 1, 1.0, False),  # one question of a small category: the noise
        (3, 3, 1.0, False),
        (0, 5, 0.0625, False),  # 2 * 1/32: not yet below 0.05
        (0, 6, 0.0312, True),  # 2 * 1/64
        (1, 9, 0.0215, True),  # 2 * (1 + 10) / 1024
        (9, 1, 0.0215, False),  # as uneven, but hybrid ahead
    ],
)
def test_mcnemar_exact(hybrid_only, dense_only, p, worse):
    got = updates.mcnemar(hybrid_only, dense_only)
    assert got == {"hybrid_only": hybrid_only, "dense_only": dense_only, "p": p, "worse": worse}
