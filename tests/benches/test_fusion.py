"""``bench fusion`` on real parts: the life set (``bench/data/life.json``) through the product's
importer, extractor, MiniLM and retriever, and LoCoMo's split on our own fixture in its format
(``tests/fixtures/recall_mini.json``, two samples: one tunes, one is held out).

The real ``locomo10.json`` (CC BY-NC, not shipped) is read by one test only, for the split's
sample ids, and that test is skipped where the file is missing (CI). A tiny grid keeps each run
to seconds; the assertions are those of the brief: the retriever's constants are as before after
a sweep (also one that fails), every grid point's figures are shares in [0, 1], and the chosen
point maximizes the objective as the module docstring writes it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench import fusion, life_set, updates
from bench.locomo_data import default_path, load
from inferscale_core import retriever as retriever_module
from tests.support import REPO

MINI = REPO / "tests" / "fixtures" / "recall_mini.json"
# today's RRF_K (5) is off this grid: today's constants come in as one more point
TINY = {
    "RRF_K": (2, 30),
    "KEYWORD_WEIGHT": (1.0, 2.0),
    "CANDIDATES": (2,),
    "RECENCY_WEIGHT": (0.0,),
}


@pytest.fixture(scope="module")
def life_only(minilm) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the retriever's constants before the sweep, the result of a sweep on the life set)."""
    before = {name: getattr(retriever_module, name) for name in fusion.today()}
    return before, fusion.run_fusion(life_set.load(), minilm, grid=TINY)


@pytest.fixture(scope="module")
def with_locomo(minilm) -> dict[str, Any]:
    grid = {**TINY, "RRF_K": (5,), "KEYWORD_WEIGHT": (1.0,)}
    return fusion.run_fusion(life_set.load(), minilm, MINI, grid=grid, tune_samples=1)


def written_objective(point: dict[str, Any], dense: dict[str, Any], asked: dict[str, Any]) -> float:
    """The docstring's objective, computed here apart from :func:`fusion.objective`."""
    sets = point["figures"]
    mean = sum(figs["recall"]["overall"]["10"] for figs in sets.values()) / len(sets)
    short = sum(
        1
        for name, figs in sets.items()
        for category, row in figs["recall"].items()
        if row["10"] is not None
        and row["10"] < dense[name]["recall"][category]["10"] - max(0.02, 1 / asked[name][category])
    )
    return mean - 0.1 * short


# ---- the life set alone (no LoCoMo) -------------------------------------------------------------


def test_the_sweep_leaves_the_retrievers_constants_as_they_were(life_only):
    before, result = life_only
    assert {name: getattr(retriever_module, name) for name in before} == before
    assert fusion.today() == before == result["today"]["constants"]
    assert len(result["retriever_sha256"]) == 16 and result["retriever"]["RRF_K"] == before["RRF_K"]
    # the sweep went over distinct points (that it set them: the next test)
    seen = {tuple(p["constants"].items()) for p in result["points"]}
    assert len(seen) == len(result["points"])


def test_a_sweep_that_fails_restores_them_too(minilm, monkeypatch):
    before = fusion.today()
    calls = []

    def failing(*args, **kwargs):  # dense, then one grid point, then the second fails
        calls.append(dict(fusion.today()))
        if len(calls) == 3:
            raise RuntimeError("scoring failed")
        return real(*args, **kwargs)

    real = updates.score
    monkeypatch.setattr(updates, "score", failing)
    with pytest.raises(RuntimeError, match="scoring failed"):
        fusion.run_fusion(life_set.load(), minilm, grid=TINY)
    assert calls[2]["RRF_K"] in TINY["RRF_K"] and calls[2] != before  # it failed mid-sweep
    assert fusion.today() == before
    with pytest.raises(KeyError), fusion.applied({"RRF_K": 99, "CANDIDATES": 7}):
        assert retriever_module.RRF_K == 99 and retriever_module.CANDIDATES == 7
        raise KeyError("inside")
    assert fusion.today() == before


def test_every_grid_points_figures_are_shares(life_only):
    before, result = life_only
    points = result["points"]
    assert len(points) == 2 * 2 + 1 and points[-1].get("extra")  # today's, off the grid
    assert result["today"]["index"] == len(points) - 1
    assert result["split"]["tune"] == [] and result["held_out"] is None
    assert result["questions"]["life"]["overall"] == 84
    for point in points:
        assert set(point["figures"]) == {"life"}
        figs = point["figures"]["life"]
        assert set(figs["recall"]) == {"overall", *life_set.CATEGORIES}
        for row in figs["recall"].values():
            assert set(row) == {"5", "10"}
            assert all(0.0 <= v <= 1.0 for v in row.values())
            assert row["5"] <= row["10"]
        assert 0.0 <= figs["update_current_first"] <= 1.0
        assert 0.0 <= figs["month_in_interval"] <= 1.0
        assert point["objective"]["tie"] is None  # no LoCoMo: no R@50 tie-break
    for row in result["dense"]["life"]["recall"].values():
        assert all(0.0 <= v <= 1.0 for v in row.values())


def test_the_choice_maximizes_the_written_objective(life_only):
    _, result = life_only
    dense = result["dense"]
    values = [written_objective(p, dense, result["questions"]) for p in result["points"]]
    for point, value in zip(result["points"], values, strict=True):
        assert point["objective"]["value"] == pytest.approx(value, abs=1e-4)
    chosen = result["chosen"]
    assert chosen["objective"]["value"] == pytest.approx(max(values), abs=1e-4)
    assert chosen["constants"] == result["points"][chosen["index"]]["constants"]
    best = [i for i, v in enumerate(values) if v >= max(values) - 1e-9]
    today = result["today"]["index"]
    assert chosen["index"] == (today if today in best else best[0])  # ties: today, grid order


def test_ties_go_to_the_tie_break_then_to_todays_constants():
    def point(value: float, tie: float | None) -> dict[str, Any]:
        return {"objective": {"value": value, "tie": tie, "short": []}}

    assert fusion.choose([point(0.5, 0.9), point(0.6, 0.1), point(0.6, 0.2)], today_index=0) == 2
    assert fusion.choose([point(0.6, 0.2), point(0.6, 0.2), point(0.6, 0.2)], today_index=1) == 1
    assert fusion.choose([point(0.6, None), point(0.6, None)], today_index=5) == 0


def test_the_grid_skips_a_constant_the_retriever_lacks():
    base = {"RRF_K": 5, "KEYWORD_WEIGHT": 2.0, "PEOPLE_WEIGHT": 2.0, "CANDIDATES": 2}
    grid = {**fusion.GRID, "CANDIDATES": (2, 4)}
    points = fusion.grid_points(grid, base)
    assert len(points) == 3 * 4 * 2 and all("RECENCY_WEIGHT" not in p for p in points)
    assert all("KEYWORD_WEIGHT_PLAIN" not in p for p in points)
    assert all(p["PEOPLE_WEIGHT"] == 2.0 and isinstance(p["CANDIDATES"], int) for p in points)
    full = {**base, "RECENCY_WEIGHT": 0.0, "KEYWORD_WEIGHT_PLAIN": 1.0}
    assert len(fusion.grid_points(grid, full)) == 3 * 4 * 3 * 2 * 3


def test_parse_grid_replaces_the_named_axes_and_refuses_bad_values():
    grid = fusion.parse_grid(["rrf_k=2,5,5", "RECENCY_WEIGHT=0.5"])
    assert grid["RRF_K"] == (2, 5) and isinstance(grid["RRF_K"][0], int)
    assert grid["RECENCY_WEIGHT"] == (0.5,) and grid["CANDIDATES"] == fusion.GRID["CANDIDATES"]
    for bad, message in [
        ("FOO=1", "NAME one of"),
        ("CANDIDATES=1.5", "whole numbers >= 1"),
        ("RRF_K=0", "whole numbers >= 1"),
        ("KEYWORD_WEIGHT=-1", "numbers >= 0"),
        ("KEYWORD_WEIGHT=a", "comma-separated numbers"),
        ("KEYWORD_WEIGHT=", "numbers >= 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            fusion.parse_grid([bad])


# ---- LoCoMo's split, on the fixture -------------------------------------------------------------


def test_the_held_out_sample_is_scored_after_the_choice(with_locomo):
    result = with_locomo
    assert result["split"]["tune"] == ["mini-1"] and result["split"]["held_out"] == ["mini-2"]
    counts = result["questions"]
    assert counts["locomo_tune"]["overall"] + counts["locomo_held_out"]["overall"] == 13
    assert set(result["dense"]) == {"locomo_tune", "life"}  # the held-out set tunes nothing
    for point in result["points"]:
        assert set(point["figures"]) == {"locomo_tune", "life"}
        for row in point["figures"]["locomo_tune"]["recall"].values():
            assert set(row) == {"5", "10", "50"}
            assert all(v is None or 0.0 <= v <= 1.0 for v in row.values())
        assert (
            point["objective"]["tie"] == point["figures"]["locomo_tune"]["recall"]["overall"]["50"]
        )
    held = result["held_out"]
    assert set(held) == {"dense", "today", "chosen"}
    for label in ("today", "chosen"):
        diff = result["hybrid_minus_dense"][label]
        assert set(diff) == {"locomo_tune", "life", "locomo_held_out"}
        for category, row in held[label]["recall"].items():
            for k, value in row.items():
                dense = held["dense"]["recall"][category][k]
                expected = None if value is None else round(value - dense, 4)
                assert diff["locomo_held_out"][category][k] == expected
    values = [written_objective(p, result["dense"], result["questions"]) for p in result["points"]]
    assert result["chosen"]["objective"]["value"] == pytest.approx(max(values), abs=1e-4)


def test_the_real_locomo_split_is_samples_0_to_4_and_5_to_9():
    path = default_path()
    if not path.is_file():
        pytest.skip(
            f"LoCoMo (locomo10.json, CC BY-NC, not shipped) is not at {path}:"
            " set INFERSCALE_LOCOMO to check the split on the real file"
        )
    samples = load(path)
    tune, held = fusion.split(samples)
    ids = [s["sample_id"] for s in samples]
    assert (tune, held) == (ids[:5], ids[5:10]) and len(ids) == 10


def test_a_split_with_nothing_on_one_side_is_refused():
    samples = load(MINI)
    for tune in (0, 2):
        with pytest.raises(ValueError, match="2 samples: tuning on the first"):
            fusion.split(samples, tune)


# ---- the command --------------------------------------------------------------------------------


def test_the_command_prints_and_saves_the_tables(tmp_path, capsys):
    from app.cli import main

    out = tmp_path / "fusion.json"
    grid = ["--grid", "RRF_K=5", "--grid", "KEYWORD_WEIGHT=1,2", "--grid", "CANDIDATES=2"]
    argv = ["bench", "fusion", "--data", str(MINI), "--tune", "1", *grid]
    assert main([*argv, "--grid", "RECENCY_WEIGHT=0", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["bench"] == "fusion" and saved["split"]["held_out"] == ["mini-2"]
    assert saved["grid"]["KEYWORD_WEIGHT"] == [1.0, 2.0]
    printed = capsys.readouterr().out
    for heading in ("| constants |", "LoCoMo tuning:", "life (tuning):", "LoCoMo held out:"):
        assert heading in printed
    assert "| overall | 6 | chosen |" in printed  # the held-out sample's 6 questions
    assert "Fusion chosen on the tuning split" in printed
    for bad, message in [
        (["--grid", "FOO=1"], "NAME one of"),
        (["--tune", "2"], "tuning on the first 2"),
        (["--data", str(tmp_path / "absent.json")], "LoCoMo data not found at"),
    ]:
        with pytest.raises(SystemExit) as refused:
            main([*argv, *bad])
        assert refused.value.code == 2
        assert message in capsys.readouterr().err
