"""``bench/gpu_kvquant.py``, the GPU machine's ``bench kvquant``, on the CPU.

The H200 has neither MiniLM nor PyPI: the facts come from a ``bench locomo --export-retrieval``
file, read by the same reader as ``bench locomo --retrieval``. The cheap tests check that the
run injects exactly the file's facts (no embedder) and that the entry point refuses bad
arguments before any model unpacks; the engine test runs the whole entry point on our
LoCoMo-format fixture (``tests/fixtures/locomo/``), in a process of its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import gpu_kvquant, kv_quant, locomo_data
from bench.report import write_json
from inferscale_core.kvstore.entry_file import SUFFIX, read_header
from tests.support import LOCOMO_FIXTURE
from tests.support.gpu_entry import run_on_exported_hits


class _Encoded(Exception):
    """Raised by the recording builder once the run hands it the facts to encode."""


class _RecordingBuilder:
    def __init__(self) -> None:
        self.facts: list[locomo_data.MemoryFact] = []

    def encode_many(self, facts, **_):
        self.facts.extend(facts)
        raise _Encoded


def _hand_picked_hits(path: Path, sample: int, rows: int) -> dict[str, list[str]]:
    """A retrieval file no embedder would write: each sampled question's hits are the last
    ``rows`` observations of its conversation, in file order; their texts per question."""
    data = locomo_data.load(LOCOMO_FIXTURE)
    chosen = locomo_data.sample_questions(locomo_data.questions(data), sample, 0)
    texts = {s["sample_id"]: [o.text for o in locomo_data.observations(s)][-rows:] for s in data}
    questions = {q.id: [[text, 0.5] for text in texts[q.sample_id]] for q in chosen}
    meta = {"bench": "locomo-retrieval", "sample": sample, "seed": 0}
    write_json(
        {"format": locomo_data.RETRIEVAL_FORMAT, **meta, "k": rows, "questions": questions}, path
    )
    return {q.id: texts[q.sample_id] for q in chosen}


def test_kvquant_injects_the_files_facts_without_an_embedder(tmp_path: Path, monkeypatch):
    def no_minilm():
        raise AssertionError("MiniLM was asked for although the hits come from a file")

    monkeypatch.setattr(locomo_data, "default_embedder", no_minilm)
    hits = tmp_path / "hits.json"
    expected = _hand_picked_hits(hits, sample=4, rows=3)
    assert len({tuple(v) for v in expected.values()}) == 2  # both conversations sampled
    builder, store = _RecordingBuilder(), SimpleNamespace(store_dtype="int4")
    with pytest.raises(_Encoded):
        kv_quant.run_kv_quant(
            builder, None, store, LOCOMO_FIXTURE, sample=4, ks=(1, 2), w=0, retrieval=hits
        )
    # The best max(ks) = 2 of each question's 3 (best last), each fact once, in question order.
    wanted = list({text: None for texts in expected.values() for text in texts[-2:]})
    assert [fact.text for fact in builder.facts] == wanted
    assert store.store_dtype == "int4"  # the store's setting is given back

    with pytest.raises(ValueError, match="holds the top 3 facts; this run needs 5"):
        kv_quant.run_kv_quant(
            _RecordingBuilder(), None, store, LOCOMO_FIXTURE, sample=4, ks=(5,), retrieval=hits
        )
    with pytest.raises(ValueError, match="lacks 15 of the 19 questions"):
        kv_quant.run_kv_quant(
            _RecordingBuilder(), None, store, LOCOMO_FIXTURE, sample=None, ks=(1,), retrieval=hits
        )


def test_kvquant_f1_against_the_model_answers_with_its_interval():
    chosen = locomo_data.sample_questions(
        locomo_data.questions(locomo_data.load(LOCOMO_FIXTURE)), 8, 0
    )
    answers = {q.id: {"category": q.category, "gold": q.answer} for q in chosen}
    for i, q in enumerate(chosen):  # the model right on every question, the scheme on half
        answers[q.id]["model@k5"] = q.answer
        answers[q.id]["int4@k5"] = q.answer if i % 2 else "no idea"
    cell = kv_quant.f1_against_model(chosen, answers, "int4@k5", "model@k5")
    assert cell["f1_model"] == 1.0 and cell["f1_model_ci95"] == [1.0, 1.0]
    assert cell["f1"] == pytest.approx(0.5, abs=0.13)  # a wrong answer may share a word
    assert cell["f1_within_ci"] is False
    low, high = cell["f1_difference_ci95"]
    assert low < cell["f1"] - 1.0 < high < 0  # the loss is shown: 0 lies outside
    same = kv_quant.f1_against_model(chosen, answers, "model@k5", "model@k5")
    assert same["f1_within_ci"] is True and same["f1_difference_ci95"] == [0.0, 0.0]


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    hits = tmp_path / "hits.json"
    hits.write_text("{}")
    base = [str(tmp_path / "out"), "--gguf", "x.gguf", "--retrieval", str(hits)]
    return [*base, "--data", str(LOCOMO_FIXTURE), *extra]


def test_gpu_kvquant_arguments_fail_before_the_model_unpacks(tmp_path: Path, capsys):
    args = gpu_kvquant.parse_args(_argv(tmp_path, "--k", "50,5,20", "--w", "20a"))
    assert (args.ks, args.w, args.schemes, args.sample) == (
        [5, 20, 50],
        "20a",
        ["fp8", "int4"],
        200,
    )
    assert gpu_kvquant.parse_args(_argv(tmp_path, "--w", "20", "--schemes", "int4")).w == 20
    variants = gpu_kvquant.parse_args(_argv(tmp_path, "--schemes", "int4,sim-int4-k4,sim-int4-k"))
    assert variants.schemes == ["int4", "sim-int4-k4", "sim-int4-k"]
    for bad, why in [
        (["--k", "0,5"], "--k needs numbers of facts >= 1"),
        (["--k", "five"], "--k takes comma-separated whole numbers"),
        (["--w", "0,20a"], "--w takes one window"),
        (["--schemes", "fp8,fp16"], "--schemes takes fp8, int4, sim-int4"),
        (["--schemes", "sim-int8"], "--schemes takes fp8, int4, sim-int4"),
        (["--retrieval", str(tmp_path / "none.json")], "no such file"),
    ]:
        with pytest.raises(SystemExit):
            gpu_kvquant.parse_args(_argv(tmp_path, *bad))
        assert why in capsys.readouterr().err


@pytest.mark.engine
def test_gpu_kvquant_measures_on_exported_hits(tmp_path: Path):
    done, out, hits = run_on_exported_hits(
        "bench.gpu_kvquant", tmp_path, "--k", "1,2", "--w", "0", "--max-tokens", "4"
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "int4@k2: KL" in done.stdout and "kvquant, 2 questions: fp8:" in done.stdout
    saved = json.loads((out / "kvquant-gpu.json").read_text())
    assert "unfinished" not in saved and saved["seconds"] > 0
    assert saved["hits_read_from"] == "hits.json" and saved["questions"] == 2
    assert set(saved["cells"]) == {f"{s}@k{k}" for s in ("fp8", "int4") for k in (1, 2)}
    exported = json.loads(hits.read_text())["questions"]
    assert saved["entries"] == len({text for rows in exported.values() for text, _ in rows})
    for name, cell in saved["cells"].items():
        assert cell["tokens"] > 0 and 0 <= cell["kl_mean_per_token"] < 1.0
        assert 0 <= cell["f1"] <= 1 and cell["f1_within_ci"] in (True, False)
        low, high = cell["f1_model_ci95"]
        assert low <= cell["f1_model"] <= high
        model_cell = "model@" + name.split("@")[1]
        assert all({name, model_cell} <= set(a) for a in saved["answers"].values())
    assert len(saved["answers"]) == 2
    assert (
        saved["sizes"]["int4"]["smaller_than_model"]
        > saved["sizes"]["fp8"]["smaller_than_model"]
        > 1
    )
    assert set(saved["key_error"]) == {"fp8", "int4"}
    # the entries are left as the model computed them, so a later run encodes none anew
    files = sorted((tmp_path / "kv").rglob(f"fact-*{SUFFIX}"))
    assert len(files) == saved["entries"]
    assert {read_header(f.stem, f).scheme for f in files} == {"model"}
    kv_quant.headline(saved)  # the CPU run's headline and plot read it as they are
    kv_quant.plot(saved, tmp_path / "kvquant.png")
