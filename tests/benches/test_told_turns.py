"""``python -m bench.told_turns``: a turn is right when its facts keep and drop what it says."""

import json

from bench.told_turns import DEFAULT, main, score


def test_a_turn_is_right_only_when_it_keeps_and_drops_what_it_says(tmp_path, capsys):
    turns = [
        {"id": "A", "text": "Tell me a joke about pilots.", "kind": "none", "keep": [], "drop": []},
        {"id": "B", "text": "I adopted a cat called Miso.", "kind": "fact", "keep": ["Miso"],
         "drop": []},
        {"id": "C", "text": "We moved to Porto, how do I find a dentist?", "kind": "mixed",
         "keep": ["moved to Porto"], "drop": ["find a dentist"]},
        {"id": "D", "text": "I adopted a cat called Miso.", "kind": "fact", "keep": ["a dog"],
         "drop": []},  # a keep phrase it cannot hold: a miss
    ]  # fmt: skip
    result = score(turns)
    assert result["right"] == {"none": 1, "fact": 1, "mixed": 1}
    assert [m["id"] for m in result["misses"]] == ["D"]
    data, out = tmp_path / "turns.json", tmp_path / "out.json"
    data.write_text(json.dumps(turns))
    assert main(["--data", str(data), "--json", str(out)]) == 0
    assert "3/4 told turns right (none 1/1, fact 1/2, mixed 1/1)" in capsys.readouterr().out
    assert json.loads(out.read_text())["n"] == {"none": 1, "fact": 2, "mixed": 1}


def test_the_shipped_set_loads_with_phrases_inside_their_turns():
    turns = json.loads(DEFAULT.read_text(encoding="utf-8"))
    assert len(turns) == len({t["id"] for t in turns}) >= 150
    assert all(p in t["text"] for t in turns for p in t["keep"] + t["drop"])
