"""``python -m bench.dated_turns``: a turn is right when the resolver gives its labelled day."""

import json

from bench.dated_turns import DEFAULT, main, score


def test_a_turn_is_right_only_on_its_labelled_day(tmp_path, capsys):
    turns = [
        {"id": "A", "said_at": "2025-03-05T10:00:00+00:00", "text": "Ran 10k yesterday.",
         "date": "2025-03-04"},
        {"id": "B", "said_at": "2025-03-05T10:00:00+00:00", "text": "Ran 10k yesterday.",
         "date": "2025-03-05"},  # labelled wrong on purpose: a miss
        {"id": "C", "said_at": "2025-03-05T23:30:00-05:00", "text": "Bought a 2-bed flat.",
         "date": "2025-03-05"},  # no day named: the local day said
    ]  # fmt: skip
    assert score(turns)["right"] == 2
    data, out = tmp_path / "turns.json", tmp_path / "out.json"
    data.write_text(json.dumps(turns))
    assert main(["--data", str(data), "--json", str(out)]) == 0
    assert "2/3 dated turns right" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert [m["id"] for m in result["misses"]] == ["B"]
    assert result["misses"][0]["got"] == "2025-03-04"


def test_the_shipped_set_loads_with_every_field():
    turns = json.loads(DEFAULT.read_text(encoding="utf-8"))
    assert len(turns) == len({t["id"] for t in turns}) >= 100
    assert all(set(t) == {"id", "said_at", "text", "date"} for t in turns)
