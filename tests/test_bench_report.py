"""The benches' pure parts: the run log, LoCoMo's F1, the top-n KL, dummy prompts, LoCoMo data."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from inferscale_core.bench import locomo_data
from inferscale_core.bench.dummy import SHAPES, DummyPrompts, resolve_dummy_config
from inferscale_core.bench.locomo_score import f1_score, kl_top, locomo_f1, normalize_answer
from inferscale_core.bench.report import RUN_LOG_HEADING, append_run, percentile, provenance
from inferscale_core.kvstore import KVStore


def test_run_log_gets_its_section_once_and_one_row_per_run(tmp_path):
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\nSome text.\n")
    result = provenance("ttft", "m", "inferscale-assistant bench ttft --k 5|6")
    append_run(md, result, "k=5: inject 88 ms")
    append_run(md, result, "again")
    text = md.read_text()
    assert text.count(RUN_LOG_HEADING) == 1 and text.startswith("# Benchmarks\n\nSome text.")
    rows = [line for line in text.splitlines() if line.startswith("| 20")]
    assert len(rows) == 2 and "| ttft |" in rows[0] and "k=5: inject 88 ms" in rows[0]
    assert "`inferscale-assistant bench ttft --k 5\\|6`" in rows[0]  # pipes escaped
    assert {"git_commit", "machine", "versions", "date"} <= set(result)
    assert "load_avg_1m" in result["machine"]


def test_percentile_is_nearest_rank():
    assert percentile([3, 1, 2], 0.5) == 2
    assert percentile(range(11), 0.9) == 9
    with pytest.raises(ValueError):
        percentile([], 0.5)


@pytest.mark.parametrize(
    ("category", "prediction", "gold", "expected"),
    [
        # normalized to 7 tokens (the article and the period go), 2 of them right
        (4, "The charity race raised awareness for mental health.", "mental health", 4 / 9),
        (4, "running", "runs", 1.0),  # Porter stems
        (2, "cats and dogs", "Dogs, cats", 1.0),  # "and" and commas dropped
        (3, "counseling", "counseling; mental health", 1.0),  # gold cut at the first ';'
        (3, "mental health", "counseling; mental health", 0.0),
        (1, "Paris, London", "London, Berlin", 0.5),  # mean over gold parts of the best part
        (4, "", "anything", 0.0),
    ],
)
def test_locomo_f1_follows_locomo_evaluation(category, prediction, gold, expected):
    assert locomo_f1(category, prediction, gold) == pytest.approx(expected)


def test_normalize_answer_and_f1_edge_cases():
    assert normalize_answer("The Cat, and a Dog!") == "cat dog"
    assert f1_score("an", "the") == 0.0  # nothing left after normalization
    with pytest.raises(ValueError):
        locomo_f1(5, "x", "y")


def test_kl_top_is_zero_for_equal_and_exact_for_full_support():
    p = {1: math.log(0.7), 2: math.log(0.3)}
    assert kl_top(p, dict(p)) == (0.0, 0.0)
    q = {1: math.log(0.5), 2: math.log(0.5)}
    exact = 0.7 * math.log(0.7 / 0.5) + 0.3 * math.log(0.3 / 0.5)
    kl, imputed = kl_top(p, q)
    assert kl == pytest.approx(exact) and imputed == 0.0


def test_kl_top_imputes_missing_tokens_with_qs_last_logprob_and_says_so():
    p = {1: math.log(0.6), 2: math.log(0.2)}  # 0.2 of P's mass outside its top 2
    q = {1: math.log(0.6), 3: math.log(0.1)}  # token 2 not in Q's top 2
    kl, imputed = kl_top(p, q)
    assert imputed == pytest.approx(0.2)
    rest_p, rest_q = 0.2, 1 - 0.6 - 0.1
    assert kl == pytest.approx(0.2 * math.log(0.2 / 0.1) + rest_p * math.log(rest_p / rest_q))


def test_dummy_prompts_store_random_kv_of_the_models_shape(tmp_path):
    folder = resolve_dummy_config("tiny-llama", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config == {k: v for k, v in SHAPES["tiny-llama"].items() if v is not None}
    store = KVStore(tmp_path / "kv", fingerprint="fp")
    runtime = SimpleNamespace(config=config, fingerprint="fp", store=store)
    source = DummyPrompts(runtime, pool_size=4, fact_tokens=8, prefix_tokens=5, question_tokens=3)
    composed, ids = source.pair([2, 0], "tag")
    assert composed.prompt_ids == ids and len(ids) == 5 + 2 * 8 + 3
    assert [e.end - e.start for e in composed.entries] == [5, 8, 8]
    entry = store.get(composed.fact_keys[0])
    assert entry.k.shape == (2, 8, 2, 64)  # [layers, tokens, kv_heads, head_dim]
    assert entry.token_ids == ids[5:13]
    assert source.pair([2, 0], "tag")[1] == ids and source.pair([2, 0], "other")[1] != ids
    assert resolve_dummy_config(str(folder / "config.json"), tmp_path / "x").is_dir()
    with pytest.raises(FileNotFoundError):
        resolve_dummy_config("no-such-shape", tmp_path)


@pytest.mark.skipif(not locomo_data.DEFAULT_PATH.is_file(), reason="LoCoMo data not found")
def test_locomo_questions_sample_and_facts_with_context():
    samples = locomo_data.load(locomo_data.DEFAULT_PATH)
    questions = locomo_data.questions(samples)
    assert len(questions) == 1540 and {q.category for q in questions} == {1, 2, 3, 4}
    picked = locomo_data.sample_questions(questions, 20, seed=0)
    assert picked == locomo_data.sample_questions(questions, 20, seed=0) and len(picked) == 20
    assert sum(len(locomo_data.observations(s)) for s in samples) == 2541
    from inferscale_core.factlog import FactLog

    with tempfile.TemporaryDirectory() as tmp:
        log = FactLog.open(Path(tmp) / "facts.db")
        try:
            memory = locomo_data.LocomoMemory(log, locomo_data.DEFAULT_PATH, ["conv-26"])
            facts = log.active_facts(memory.profiles["conv-26"])
            assert len(facts) == memory.facts > 150
            fact = next(f for f in facts if "lake sunrise" in f.text)
            assert str(fact.refers_to) == "2023-05-08"  # its session's date
            assert memory.memory_fact(fact, 0).context == ()
            context = memory.memory_fact(fact, 3).context
            assert len(context) == 3 and context[-1].startswith("- 2023-05-08 ")
        finally:
            log.close()


def test_gpu_suite_plots_saved_h200_runs(tmp_path):
    from inferscale_core.bench.gpu_suite import plot_runs

    runs = sorted((Path(__file__).parent.parent / "docs" / "results").glob("gpu-suite-h200*.json"))
    assert runs, "the saved H200 runs are part of the repository"
    out = tmp_path / "ttft-h200.png"
    plot_runs(runs, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def _locomo_run(cells: dict[str, list[str]], reference: list[str]) -> dict:
    """A saved LoCoMo run of 3 questions whose answers per cell are given."""
    settings = {"data": "d", "seed": 0, "ks": [5], "ws": [0], "max_tokens": 8, "logprobs": 5}
    kl = {"per_token": [0.1], "top1_agree": [True], "p_mass_imputed": [0.0], "restarts": 0}
    questions = [
        {
            "id": f"q{i}",
            "category": 1,
            "gold": "blue car",
            "answers": {
                cell: {"text": texts[i], **({} if cell.startswith("prompt") else {"kl": kl})}
                for cell, texts in cells.items()
            },
        }
        for i in range(3)
    ]
    return {"settings": {**settings, "reference": reference}, "questions": questions}


def test_locomo_merge_adds_the_other_runs_modes_on_common_questions():
    from inferscale_core.bench.locomo import merge_runs

    main = _locomo_run({"prompt@k5": ["blue car"] * 3, "inject_w0@k5": ["car", "x", "y"]}, [])
    ref = _locomo_run({"prompt@k5": ["blue car"] * 3, "reorder@k5": ["blue car", "x", "x"]}, [])
    ref["settings"]["ws"], ref["settings"]["reference"] = [], ["reorder"]
    ref["questions"] = ref["questions"][1:]  # the reference run answered fewer questions
    merged = merge_runs(main, ref)
    assert [q["id"] for q in merged["questions"]] == ["q1", "q2"]
    assert merged["merged_from"]["prompt_agreement"] == "2/2"
    cells = merged["scores"]["cells"]
    assert set(cells) == {"prompt@k5", "inject_w0@k5", "reorder@k5"}
    assert cells["prompt@k5"]["f1"] == 1.0 and cells["inject_w0@k5"]["f1"] == 0.0
    assert cells["reorder@k5"]["f1"] == 0.0 and cells["reorder@k5"]["kl_mean_per_token"] == 0.1
    ref["settings"]["seed"] = 1
    with pytest.raises(ValueError, match="differ"):
        merge_runs(main, ref)
