"""The benches' pure parts: the run log, LoCoMo's F1, the top-n KL, dummy prompts, LoCoMo data."""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import locomo_data
from bench.dummy import SHAPES, DummyPrompts, resolve_dummy_config
from bench.locomo_score import (
    bootstrap_ci,
    f1_score,
    kl_top,
    locomo_f1,
    mean,
    mean_difference,
    normalize_answer,
    ratio_of_sums,
)
from bench.report import RUN_LOG_HEADING, append_run, percentile, provenance
from inferscale_core.kvstore import KVStore
from tests.support import LOCOMO_FIXTURE, REPO


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


def test_bootstrap_ci_brackets_the_statistic_and_narrows_with_more_questions():
    values = [0.0, 1.0] * 10  # mean 0.5
    low, high = bootstrap_ci(values, mean)
    assert 0.2 < low < 0.5 < high < 0.8
    wide = high - low
    low, high = bootstrap_ci(values * 16, mean)
    assert low < 0.5 < high and high - low < wide / 3  # 16x the questions: ~1/4 the width
    assert bootstrap_ci([0.3] * 7, mean) == [pytest.approx(0.3), pytest.approx(0.3)]
    assert bootstrap_ci([], mean) is None
    assert bootstrap_ci([(1.0, 0.0)], ratio_of_sums) is None  # no draw has a ratio
    # paired: a constant difference has no spread, whatever the spread of each side
    pairs = [(v + 0.1, v) for v in values]
    assert bootstrap_ci(pairs, mean_difference) == [pytest.approx(0.1), pytest.approx(0.1)]
    assert bootstrap_ci(pairs, mean_difference, seed=1) == bootstrap_ci(pairs, mean_difference)


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


def test_the_locomo_fixture_cites_only_its_own_turns():
    """Every observation and every question's evidence names a turn of its own sample."""
    for sample in locomo_data.load(LOCOMO_FIXTURE):
        conv = sample["conversation"]
        turns = {t["dia_id"] for value in conv.values() if isinstance(value, list) for t in value}
        cited = [d for obs in locomo_data.observations(sample) for d in obs.dia_ids]
        cited += [d for qa in sample["qa"] for d in qa["evidence"]]
        assert cited and set(cited) <= turns, sample["sample_id"]


def test_locomo_questions_sample_and_facts_with_context():
    samples = locomo_data.load(LOCOMO_FIXTURE)
    assert [s["sample_id"] for s in samples] == ["fx-1", "fx-2"]
    assert sum(len(s["qa"]) for s in samples) == 22
    questions = locomo_data.questions(samples)  # the 3 adversarial (category 5) left out
    assert len(questions) == 19 and {q.category for q in questions} == {1, 2, 3, 4}
    by_id = {q.id: q for q in questions}
    assert "fx-1/qa10" not in by_id and "fx-2/qa9" not in by_id  # category 5
    assert by_id["fx-1/qa8"].answer == "2"  # an int answer, as text
    assert by_id["fx-2/qa6"].evidence == ("D2:5", "D3:7", "D3:9")
    assert by_id["fx-1/qa3"].category == 2 and by_id["fx-1/qa3"].answer == "25 February 2023"
    picked = locomo_data.sample_questions(questions, 5, seed=0)
    assert picked == locomo_data.sample_questions(questions, 5, seed=0) and len(picked) == 5
    assert picked != locomo_data.sample_questions(questions, 5, seed=1)
    order = [questions.index(q) for q in picked]
    assert order == sorted(order)  # in file order
    assert locomo_data.sample_questions(questions, None, seed=0) == questions

    observations = [locomo_data.observations(s) for s in samples]
    assert [len(o) for o in observations] == [30, 20]
    first = observations[0]
    assert (first[0].sample_id, first[0].dia_ids) == ("fx-1", ("D1:5",))
    assert first[0].when == date(2023, 3, 3)
    balcony = next(o for o in first if "balcony facing" in o.text)
    assert balcony.dia_ids == ("D1:3", "D1:4")  # a list of dia_ids
    chords = next(o for o in first if "chords" in o.text)
    assert chords.dia_ids == ("D3:4", "D3:5")  # "D3:4, D3:5" in one string
    assert observations[1][-1].when == date(2023, 10, 22)
    from inferscale_core.factlog import FactLog

    with tempfile.TemporaryDirectory() as tmp:
        log = FactLog.open(Path(tmp) / "facts.db")
        try:
            memory = locomo_data.LocomoMemory(log, LOCOMO_FIXTURE, ["fx-1"])
            assert set(memory.profiles) == {"fx-1"}
            facts = log.active_facts(memory.profiles["fx-1"])
            assert len(facts) == memory.facts == 30
            fact = next(f for f in facts if "overnight in the fridge" in f.text)
            assert str(fact.refers_to) == "2023-03-19"  # its session's date
            assert memory.memory_fact(fact, 0).context == ()
            context = memory.memory_fact(fact, 3).context  # D2:4, D2:5, D2:6
            assert len(context) == 3 and context[-1].startswith("- 2023-03-19 Nadia: Ha! My news")
            assert context[0].startswith("- 2023-03-19 Nadia: She looks sweet.")
            opening = next(f for f in facts if "adopted a dog" in f.text)  # from D2:1
            assert memory.memory_fact(opening, 3).context == ()  # nothing before it in its session
        finally:
            log.close()


def test_the_full_data_path_is_found_or_named_with_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv(locomo_data.DATA_ENV, raising=False)
    beside = REPO.parent / "shared" / "data" / "locomo" / "locomo10.json"
    assert locomo_data.default_path() == beside
    named = tmp_path / "my-locomo.json"
    monkeypatch.setenv("INFERSCALE_LOCOMO", str(named))
    assert locomo_data.default_path() == named
    with pytest.raises(locomo_data.LocomoDataMissingError) as missing:
        locomo_data.require()
    message = str(missing.value)
    assert message.startswith(f"LoCoMo data not found at {named}: ")
    assert "CC BY-NC 4.0, not shipped" in message
    assert "--data PATH" in message and "INFERSCALE_LOCOMO" in message
    with pytest.raises(FileNotFoundError, match="LoCoMo data not found"):
        locomo_data.load(tmp_path / "nope.json")
    assert locomo_data.require(LOCOMO_FIXTURE) == LOCOMO_FIXTURE  # --data wins
    named.write_text("[]")
    assert locomo_data.require() == named


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "encode", "--limit", "3"],
        ["bench", "retrieval", "--export-vectors", "x.npz"],
        ["bench", "locomo", "--export-retrieval", "x.json"],
        ["bench", "locomo", "--sample", "2"],
        ["bench", "recall"],
    ],
)
def test_bench_commands_without_the_data_stop_before_starting_anything(
    argv, tmp_path, monkeypatch, capsys
):
    """No engine, no MiniLM: the missing file is reported first (else this would take minutes
    or fail otherwise)."""
    import bench.cli

    monkeypatch.setenv("INFERSCALE_LOCOMO", str(tmp_path / "absent.json"))
    parser = argparse.ArgumentParser(prog="inferscale-assistant")
    bench.cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)

    def nothing_else(*_args, **_kwargs):
        raise AssertionError("started before checking the data")

    monkeypatch.setattr(bench.cli, "_open_runtime", nothing_else)
    monkeypatch.setattr("inferscale_core.embedder.SentenceTransformerEmbedder", nothing_else)
    with pytest.raises(SystemExit) as exit_:
        args.func(args, None)
    assert exit_.value.code == 2
    assert f"LoCoMo data not found at {tmp_path / 'absent.json'}" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["gpu_locomo", "gpu_encode"])
def test_gpu_benches_without_the_data_stop_at_once(module, tmp_path, monkeypatch, capsys):
    import importlib

    main = importlib.import_module(f"bench.{module}").main
    monkeypatch.delenv(locomo_data.DATA_ENV, raising=False)
    missing = tmp_path / "absent.json"
    argv = [str(tmp_path / "out"), "--data", str(missing)]
    if module == "gpu_locomo":
        argv += ["--gguf", "none.gguf", "--retrieval", "none.json"]
    else:
        argv += ["--tokenizer", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"LoCoMo data not found at {missing}" in err and "INFERSCALE_LOCOMO" in err
    assert not (tmp_path / "out").exists()


def test_gpu_suite_plots_saved_h200_runs(tmp_path):
    from bench.gpu_suite import plot_runs

    runs = sorted((REPO / "docs" / "results").glob("gpu-suite-h200*.json"))
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
    from bench.locomo import merge_runs

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


def test_locomo_rescore_reads_the_gpu_runs_xz_and_writes_plain_json(tmp_path):
    import lzma

    from app.cli import main

    run = _locomo_run({"prompt@k5": ["blue car"] * 3, "inject_w0@k5": ["car", "x", "y"]}, [])
    run.update(provenance("locomo", "smollm2", "python -m bench.gpu_locomo"))
    packed = tmp_path / "locomo-gpu.json.xz"
    packed.write_bytes(lzma.compress(json.dumps(run).encode()))
    assert main(["bench", "locomo", "--rescore", str(packed)]) == 0
    rescored = json.loads((tmp_path / "locomo-gpu.json").read_text())  # beside it, unpacked
    cells = rescored["scores"]["cells"]
    assert cells["prompt@k5"]["f1"] == 1.0 and cells["inject_w0@k5"]["f1"] == pytest.approx(2 / 9)
    assert lzma.decompress(packed.read_bytes()) == json.dumps(run).encode()  # left as it was
