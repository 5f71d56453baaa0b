"""The tail-recompute hybrid in the benches (issue 22): the last r facts of a request prefilled
with the question instead of injected. Pure parts here (request layout, cells, scores, the GPU
suite's part); on the session engine in ``test_bench_suite.py`` and ``test_bench_ttft.py``; the
GPU suite's ``recompute`` part itself on CUDA only (``bench/gpu_run.sh``, ``SUITE_PARTS``).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch

from app.cli import main as cli_main
from bench import gpu_suite, locomo, ttft
from bench.dummy import DummyPrompts, resolve_dummy_config
from bench.prompts import recompute_salted
from bench.report import provenance
from inferscale_core.composer import ComposedPrompt, PlacedEntry
from inferscale_core.kvstore import KVStore


@pytest.fixture
def dummy(tmp_path) -> DummyPrompts:
    config = json.loads((resolve_dummy_config("tiny-llama", tmp_path) / "config.json").read_text())
    store = KVStore(tmp_path / "kv", fingerprint="fp")
    runtime = SimpleNamespace(config=config, fingerprint="fp", store=store)
    return DummyPrompts(runtime, pool_size=4, fact_tokens=8, prefix_tokens=5, question_tokens=3)


def test_a_hybrid_request_keeps_the_ids_and_drops_the_tails_entries(dummy):
    plain, ids = dummy.pair([2, 0, 1], "tag")
    assert plain.cache_salt == dummy.cache_salt  # r=0: the request as before
    for r in (1, 2, 3, 5):
        hybrid, prompt_ids = dummy.pair([2, 0, 1], "tag", recompute=r)
        injected = 3 - min(r, 3)
        assert hybrid.prompt_ids == plain.prompt_ids == prompt_ids == ids
        assert hybrid.entries == plain.entries[: 1 + injected]  # the prefix, then the rest
        assert hybrid.fact_keys == plain.fact_keys[:injected]
        assert hybrid.cache_salt == f"{dummy.cache_salt}/recompute{min(r, 3)}"
    # r = k: only the prefix is injected, the ids are prompt injection's.
    whole, _ = dummy.pair([2, 0, 1], "tag", recompute=3)
    assert [e.end - e.start for e in whole.entries] == [5] and whole.span_end == 5


def test_recompute_salted_changes_only_the_salt():
    composed = ComposedPrompt([1, 2, 3], [PlacedEntry("p", 0, 2)], ["f"], "salt")
    assert recompute_salted(composed, 0) is composed
    salted = recompute_salted(composed, 2)
    assert salted.cache_salt == "salt/recompute2" and salted.prompt_ids == composed.prompt_ids
    assert (salted.entries, salted.fact_keys) == (composed.entries, composed.fact_keys)
    assert recompute_salted(ComposedPrompt([1], [], [], None), 1).cache_salt == "/recompute1"


# ---- bench locomo ----
def test_locomo_modes_and_cells_skip_r_at_or_above_k():
    assert locomo.modes([0, "20a"]) == ["prompt", "inject_w0", "inject_w20a"]  # as before
    assert locomo.modes(["20a"], ["reorder"], [0, 2, 8], k=5) == [
        "prompt", "inject_w20a", "inject_w20a_r2", "reorder",
    ]  # fmt: skip
    settings = {"ks": [1, 5], "ws": ["20a"], "rs": [0, 1, 4, 8], "reference": []}
    assert locomo._cells(settings) == [
        "prompt@k1", "inject_w20a@k1",
        "prompt@k5", "inject_w20a@k5", "inject_w20a_r1@k5", "inject_w20a_r4@k5",
    ]  # fmt: skip
    del settings["rs"]  # a run from before tail recompute
    assert locomo._cells(settings) == ["prompt@k1", "inject_w20a@k1", "prompt@k5", "inject_w20a@k5"]


def _run(cells: dict[str, list[str]], ws: list, rs: list[int]) -> dict:
    """A saved LoCoMo run of 3 questions at k=5 whose answers per cell are given."""
    settings = {"data": "d", "seed": 0, "ks": [5], "max_tokens": 8, "logprobs": 5}
    kl = {"per_token": [0.1], "top1_agree": [True], "p_mass_imputed": [0.0], "restarts": 0}
    questions = [
        {
            "id": f"q{i}",
            "category": 1,
            "gold": "blue car",
            "answers": {
                cell: {
                    "text": texts[i],
                    "computed_tokens": 100 if cell.startswith("prompt") else 10 + 5 * i,
                    "injected_tokens": 0 if cell.startswith("prompt") else 90,
                    **({} if cell.startswith("prompt") else {"kl": kl}),
                }
                for cell, texts in cells.items()
            },
        }
        for i in range(3)
    ]
    run = {"settings": {**settings, "ws": ws, "rs": rs, "reference": []}, "questions": questions}
    return {**provenance("locomo", "smollm2"), **run}


def test_locomo_merges_an_r_sweep_into_an_earlier_run_and_plots_it(tmp_path):
    prompt = ["blue car"] * 3
    main = _run({"prompt@k5": prompt, "inject_w0@k5": ["car", "x", "y"]}, [0], [0])
    main["settings"].pop("rs")  # saved before tail recompute
    sweep = _run(
        {
            "prompt@k5": prompt,
            "inject_w20a@k5": ["x", "x", "x"],
            "inject_w20a_r2@k5": ["blue car", "blue car", "x"],
            "inject_w20a_r8@k5": ["never", "run", "here"],  # r >= k: not a cell of the grid
        },
        ["20a"],
        [0, 2, 8],
    )
    merged = locomo.merge_runs(main, sweep)
    assert merged["settings"]["ws"] == [0, "20a"] and merged["settings"]["rs"] == [0, 2, 8]
    assert merged["merged_from"]["prompt_agreement"] == "3/3"
    cells = merged["scores"]["cells"]
    # the grid's cells that neither run answered (inject_w0_r2@k5) are left out
    assert list(cells) == ["prompt@k5", "inject_w0@k5", "inject_w20a@k5", "inject_w20a_r2@k5"]
    hybrid = cells["inject_w20a_r2@k5"]
    assert hybrid["f1_over_prompt"] == pytest.approx(2 / 3)
    assert hybrid["kl_mean_per_token"] == pytest.approx(0.1)
    assert hybrid["computed_tokens_median"] == 15 and hybrid["injected_tokens_median"] == 90
    assert cells["prompt@k5"]["computed_tokens_median"] == 100
    assert locomo.headline(merged) == (
        "3 questions, F1 — k=5: prompt 1.000, w0 0.222, w20a 0.000, w20a r2 0.667"
    )
    locomo.plot(merged, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_r_options_are_checked_before_anything_starts(capsys):
    with pytest.raises(SystemExit):
        cli_main(["bench", "locomo", "--r", "-1"])
    assert "--r needs whole numbers >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["bench", "ttft", "--recompute", "two"])
    assert "--recompute takes comma-separated whole numbers" in capsys.readouterr().err


# ---- bench ttft ----
def test_ttft_ratios_and_headline_name_each_hybrid():
    medians = {"inject": 0.010, "inject_r2": 0.012, "prompt": 0.040, "prompt_warm": 0.008}
    rows = [
        ttft.TtftRow(k=20, mode=mode, runs=1, ttft_s_median=s, ttft_s_p90=s, samples=[s])
        for mode, s in medians.items()
    ]
    ratios = ttft.ratios(rows)
    assert ratios["inject_r2_over_inject_k20"] == pytest.approx(1.2)
    assert ratios["prompt_over_inject_k20"] == pytest.approx(4.0)
    result = {"rows": [asdict(row) for row in rows], "ratios": ratios}
    assert ttft.headline(result).endswith("; inject r=2 12 ms")


# ---- the GPU suite's part ----
def test_gpu_suite_recompute_grid_cells_and_summary():
    assert gpu_suite.recompute_cells([50, 20], [8, 0, 1, 30]) == [
        (20, 0), (20, 1), (20, 8), (20, None), (50, 0), (50, 1), (50, 8), (50, 30), (50, None),
    ]  # fmt: skip
    samples = {
        (20, 0): [(0.010, 64, 1100), (0.012, 64, 1100), (0.011, 64, 1100)],
        (20, 2): [(0.015, 180, 990)] * 3,
        (20, None): [(0.040, 1196, 0)] * 3,
    }
    summary = gpu_suite.summarize_recompute(samples)
    assert (summary["ks"], summary["rs"]) == ([20], [0, 2])
    rows = {(row["mode"], row["recompute"]): row for row in summary["rows"]}
    assert set(rows) == {("inject", 0), ("inject", 2), ("prompt", 20)}
    assert rows[("inject", 0)]["ttft_s_median"] == 0.011 and rows[("inject", 0)]["runs"] == 3
    assert rows[("inject", 2)]["computed_tokens_median"] == 180
    assert rows[("prompt", 20)]["prompt_tokens"] == 32 + 20 * 55 + 64
    assert summary["ratios"] == pytest.approx(
        {
            "inject_r2_over_r0_k20": 0.015 / 0.011,
            "prompt_over_inject_r0_k20": 0.040 / 0.011,
            "prompt_over_inject_r2_k20": 0.040 / 0.015,
        }
    )
    json.dumps(summary)  # goes into gpu_suite.json as it is


def test_gpu_suite_parts_recompute_is_asked_for_by_name():
    assert gpu_suite.chosen_parts({}) == set(gpu_suite.DEFAULT_PARTS)
    assert "recompute" not in gpu_suite.DEFAULT_PARTS and "recompute" in gpu_suite.PARTS
    assert gpu_suite.chosen_parts({"SUITE_PARTS": "ttft,recompute"}) == {"ttft", "recompute"}
    with pytest.raises(SystemExit, match="unknown"):
        gpu_suite.chosen_parts({"SUITE_PARTS": "recomputed"})
    assert gpu_suite.recompute_grid({}) == {}
    grid = gpu_suite.recompute_grid({"SUITE_RECOMPUTE_KS": "50,20", "SUITE_RECOMPUTE_RS": "0,4"})
    assert grid == {"ks": [20, 50], "rs": [0, 4]}
    with pytest.raises(SystemExit, match="SUITE_RECOMPUTE_RS"):
        gpu_suite.recompute_grid({"SUITE_RECOMPUTE_RS": "1,x"})


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="the GPU suite runs the 8B shape on CUDA (bench/gpu_run.sh, SUITE_PARTS=recompute)",
)
def test_gpu_suite_recompute_part_on_cuda(tmp_path):
    suite = gpu_suite.Suite(tmp_path, pool_size=60, gpu_pool_gib=1.0)
    summary = suite.recompute(ks=[4], rs=[0, 2], runs=2, warmup=1)
    rows = {(row["mode"], row["recompute"]): row for row in summary["rows"]}
    assert set(rows) == {("inject", 0), ("inject", 2), ("prompt", 4)}
    plain, hybrid, prompt = rows[("inject", 0)], rows[("inject", 2)], rows[("prompt", 4)]
    assert hybrid["injected_tokens_median"] < plain["injected_tokens_median"]
    assert plain["computed_tokens_median"] < hybrid["computed_tokens_median"]
    assert prompt["injected_tokens_median"] == 0
    assert all(row["ttft_s_median"] > 0 for row in summary["rows"])
