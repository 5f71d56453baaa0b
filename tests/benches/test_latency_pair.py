"""``bench recall --latency-vs``: two checkouts timed at once in alternated blocks.

Real processes, real FIFOs, the real MiniLM and fact logs, on the recall fixture: this checkout
against itself (the only other checkout a test machine is sure to have), and against folders
that are not a checkout or whose worker dies.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import latency_pair
from bench.report import git_commit
from tests.support import REPO

MINI = REPO / "tests" / "fixtures" / "recall_mini.json"


@pytest.fixture(scope="module")
def pair():
    return latency_pair.run_pair(MINI, REPO, facts=40, queries=13, ks=(3, 10), blocks=3, warmup=3)


def test_both_checkouts_time_every_cell_and_the_ratio_is_theirs(pair):
    assert pair["vs"] == {"tree": str(REPO), "git_commit": (git_commit() or "").split("+")[0]}
    assert pair["facts"] == pair["facts_other"] == 40
    assert pair["queries"] == 10 and pair["k"] == [3, 10] and pair["blocks"] == 3
    assert set(pair["ms"]) == {"embed", "3", "10"}
    cells = [pair["ms"]["embed"]] + [
        pair["ms"][k][m] for k in ("3", "10") for m in latency_pair.MODES
    ]
    assert all(set(pair["ms"][k]) == set(latency_pair.MODES) for k in ("3", "10"))
    for cell in cells:
        assert cell["this_p50"] > 0 and cell["other_p50"] > 0
        # of the unrounded medians: the p50s shown are rounded to 0.01 ms
        assert cell["ratio_p50"] == pytest.approx(cell["this_p50"] / cell["other_p50"], rel=0.05)
        assert cell["pair_ratio_median"] > 0


def test_the_table_names_the_other_commit_and_every_cell(pair):
    table = latency_pair.markdown(pair)
    assert f"against {pair['vs']['git_commit']}" in table and "3 alternated blocks of 10" in table
    assert "|  | embed |" in table and "| 10 | hybrid |" in table and "| 3 | keyword |" in table


def test_refuses_a_folder_that_is_no_checkout(tmp_path: Path):
    with pytest.raises(ValueError, match="is not a checkout"):
        latency_pair.run_pair(MINI, tmp_path, facts=10, queries=13, blocks=2)


def test_a_worker_that_dies_is_named_with_its_last_lines(tmp_path: Path):
    # a checkout whose bench package is broken: its worker exits at the import
    broken = tmp_path / "broken"
    shutil.copytree(REPO / "inferscale_core", broken / "inferscale_core")
    (broken / "bench").mkdir()
    (broken / "bench" / "__init__.py").write_text("raise ImportError('no bench here')\n")
    with pytest.raises(RuntimeError, match="other checkout's worker exited.*no bench here"):
        latency_pair.run_pair(MINI, broken, facts=10, queries=13, blocks=2)


def test_the_command_refuses_a_tree_without_the_project(tmp_path: Path, capsys):
    from app.cli import main

    argv = ["bench", "recall", "--data", str(MINI), "--samples", "none"]
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--latency-vs", str(tmp_path)])
    assert refused.value.code == 2
    assert "--latency-vs needs another checkout's root" in capsys.readouterr().err


def test_the_command_prints_and_saves_the_paired_table(tmp_path: Path, capsys):
    from app.cli import main

    out = tmp_path / "recall.json"
    argv = ["bench", "recall", "--data", str(MINI), "--k", "2", "--modes", "dense"]
    argv += ["--latency-facts", "30", "--latency-queries", "12", "--latency-k", "2"]
    assert (
        main([*argv, "--latency-vs", str(REPO), "--latency-blocks", "2", "--json", str(out)]) == 0
    )
    saved = json.loads(out.read_text())
    assert saved["latency"] is None and saved["latency_pair"]["facts"] == 30
    assert set(saved["latency_pair"]["ms"]) == {"embed", "2"}
    printed = capsys.readouterr().out
    assert "Search latency at 30 facts against" in printed and "| 2 | hybrid |" in printed
    assert "hybrid p50 against" in " ".join(printed.split())  # the headline, wrapped
